"""The README's examples run: every ```python block is executed and every ``ndp-ep ...`` command of every
```bash block is run through ``ndp_ep.cli.main`` in-process, so the README cannot drift from the code.

Each block runs in a fresh temporary working directory that holds the files the README's placeholders name
(:data:`PLACEHOLDER_FILES`: ``model.onnx`` is the bundled decoder, ``model.ndp.onnx`` its conversion, ...),
plus a ``sample_models`` link to the repository's samples; ``../shared`` is replaced by the real shared
directory when it exists (:data:`TEXT_SUBSTITUTIONS`). A command line whose arguments are a usage synopsis
(``[--hw ...]``, ``A|B``, ``...``) is not run. A block opts out with an HTML comment line
``<!-- no-test -->`` right before its opening fence (blank lines may sit between).

A command passes when it exits 0 (``diff`` also 1: "the models differ"); a Python block when it raises nothing.
"""

from __future__ import annotations

import re
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

from ndp_ep.cli import main

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
SHARED = REPO.parent / "shared"
OPT_OUT = "<!-- no-test -->"
# placeholder file name in the README -> how the test provides it in the block's working directory
PLACEHOLDER_FILES = {
    "model.onnx": ("sample", "moe_decoder.onnx"),
    "feeds.npz": ("sample", "moe_decoder.inputs.npz"),
    "model.ndp.onnx": ("converted", "moe_decoder.onnx"),
    "A.onnx": ("sample", "moe_block.onnx"),
    "B.onnx": ("converted", "moe_block.onnx"),
}
TEXT_SUBSTITUTIONS = {"../shared/": f"{SHARED}/"}
# exit codes that mean success, per command (diff exits 1 when the models differ, like diff(1))
OK_EXIT = {"diff": (0, 1)}
SYNOPSIS = re.compile(r"\[|\||\.\.\.|…|<[A-Za-z_]+>")


@dataclass(frozen=True)
class Block:
    """One fenced code block of the README."""

    language: str
    line: int  # 1-based line of the opening fence
    text: str
    opted_out: bool

    def __post_init__(self) -> None:
        if self.line < 1:
            raise ValueError(f"line must be positive, got {self.line}")


def read_blocks(markdown: str) -> list[Block]:
    """Every fenced block (```lang ... ```) with its language and whether an opt-out comment precedes it."""
    blocks: list[Block] = []
    lines = markdown.splitlines()
    index = 0
    while index < len(lines):
        fence = re.match(r"^\s*```\s*([\w+-]*)\s*$", lines[index])
        if not fence:
            index += 1
            continue
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and not re.match(r"^\s*```\s*$", lines[index]):
            body.append(lines[index])
            index += 1
        before = next((lines[k].strip() for k in range(start - 1, -1, -1) if lines[k].strip()), "")
        blocks.append(Block(fence.group(1).lower(), start + 1, "\n".join(body), before == OPT_OUT))
        index += 1
    return blocks


def commands_of(bash: str) -> list[str]:
    """The ``ndp-ep ...`` commands of a bash block: continuation lines joined, ``$`` prompts and comments
    removed, ``a && b`` chains split."""
    joined = re.sub(r"\s*\\\n\s*", " ", bash)
    commands = []
    for raw in joined.splitlines():
        line = raw.strip().removeprefix("$ ")
        for part in re.split(r"&&|;", line):
            part = part.strip()
            if part.startswith("ndp-ep "):
                commands.append(part.split(" #", 1)[0].strip())
    return commands


def _blocks() -> list[Block]:
    return [b for b in read_blocks(README.read_text(encoding="utf-8")) if b.language in ("python", "bash")]


@pytest.fixture(scope="module")
def converted(tmp_path_factory) -> dict[str, Path]:
    """The samples the placeholders name, converted once for all blocks."""
    from ndp_ep import convert_model, sample_path

    directory = tmp_path_factory.mktemp("readme_converted")
    out = {}
    for name in {source for kind, source in PLACEHOLDER_FILES.values() if kind == "converted"}:
        out[name] = directory / name.replace(".onnx", ".ndp.onnx")
        convert_model(sample_path(name), out[name])
    return out


@pytest.fixture
def workdir(tmp_path, monkeypatch, converted) -> Path:
    """A working directory holding every placeholder file and a link to the samples."""
    from ndp_ep import sample_path

    for placeholder, (kind, source) in PLACEHOLDER_FILES.items():
        origin = sample_path(source) if kind == "sample" else converted[source]
        shutil.copyfile(origin, tmp_path / placeholder)
    for linked in ("sample_models", "hw_model", "docs"):  # paths the README names relative to a checkout
        (tmp_path / linked).symlink_to(REPO / linked, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_readme_has_runnable_examples():
    blocks = _blocks()
    assert any(b.language == "python" and not b.opted_out for b in blocks), "no Python example is tested"
    assert any(commands_of(b.text) for b in blocks if b.language == "bash" and not b.opted_out), "no CLI example"


def test_reading_blocks_commands_and_opt_outs():
    markdown = (
        "text\n<!-- no-test -->\n\n```bash\nndp-ep run \\\n   m.onnx --json  # note\n```\n```python\nx = 1\n```\n"
    )
    bash, python = read_blocks(markdown)
    assert (bash.language, bash.line, bash.opted_out) == ("bash", 4, True)
    assert (python.language, python.text, python.opted_out) == ("python", "x = 1", False)
    assert commands_of(bash.text) == ["ndp-ep run m.onnx --json"]
    assert commands_of("pip install . && ndp-ep demo; ndp-ep --version\n$ ndp-ep diff A B") == [
        "ndp-ep demo",
        "ndp-ep --version",
        "ndp-ep diff A B",
    ]


@pytest.mark.parametrize("block", _blocks(), ids=lambda b: f"README.md:{b.line}:{b.language}")
def test_readme_block_runs(block: Block, workdir: Path, capsys):
    if block.opted_out:
        pytest.skip(f"opted out with {OPT_OUT}")
    text = block.text
    for old, new in TEXT_SUBSTITUTIONS.items():
        text = text.replace(old, new)
    if block.language == "python":
        exec(compile(text, f"README.md:{block.line}", "exec"), {"__name__": "__readme__"})
        return
    ran = 0
    for command in commands_of(text):
        argv = shlex.split(command)[1:]
        if SYNOPSIS.search(command):
            continue  # a usage synopsis, not a command
        if "../shared" in block.text and not SHARED.is_dir():
            pytest.skip(f"{SHARED} is absent")
        code = main(argv)
        err = capsys.readouterr().err
        assert code in OK_EXIT.get(argv[0] if argv else "", (0,)), (
            f"README.md:{block.line}: `{command}` -> {code}\n{err}"
        )
        ran += 1
    if not ran:
        pytest.skip("no runnable ndp-ep command in this block (synopsis or other tools only)")
