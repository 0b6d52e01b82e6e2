"""Converting a model inside an ONNX Runtime GenAI folder: the config and side files written beside the output.

The folder's ``genai_config.json`` (``decoder.filename`` pointing at the converted model) and its side files
(tokenizer, chat template, ...) are planned before any work (:func:`plan_genai_folder`) and written just before
the model (:meth:`GenAIFolder.write`); when the model's save fails, :meth:`GenAIFolder.roll_back` removes what
was created, so the output folder gets the whole GenAI folder or nothing new. Promises (docs/reliability.md):

* nothing outside the model's folder is read: a side file (or the config) that is a symbolic link resolving
  outside it is refused by name (:func:`ndp_io.guard.inside_folder`), and only regular files are copied;
* nothing of the user's is overwritten: a same-named file already in the output folder is left alone when it has
  the same bytes (an earlier conversion's copy) and refused otherwise; an input of the command (the ``--hw``
  file) is never written; ``genai_config.json`` is replaced only when it is this output's own;
* every file is written atomically (:func:`ndp_io.atomic_write`).
"""

from __future__ import annotations

import filecmp
import os
import shutil
import stat
from dataclasses import dataclass, field
from pathlib import Path

from ndp_ep.errors import ConversionError
from ndp_io import FileSafetyError, atomic_write, check_no_clobber, write_text
from ndp_io.guard import inside_folder
from ndp_io.parsing import read_json

GENAI_CONFIG = "genai_config.json"
NOT_COPIED_SUFFIXES = (".onnx", ".onnx.data", ".data", ".npz")


@dataclass
class GenAIFolder:
    """The GenAI config and side files a conversion writes beside its output (see the module docstring)."""

    output: Path
    config: dict
    copies: list[tuple[Path, Path]]  # (resolved source inside the model's folder, target beside the output)
    kept: list[Path]  # targets already holding the source's bytes: nothing to write
    created: list[Path] = field(default_factory=list)

    def write(self) -> list[Path]:
        """Write the side files, then the config; returns every file of the folder (written or kept)."""
        import json

        for source, target in self.copies:
            fresh = not os.path.lexists(target)
            with open(source, "rb") as source_file, atomic_write(target) as target_file:
                shutil.copyfileobj(source_file, target_file)
            if fresh:
                self.created.append(target)
        config_path = self.output.parent / GENAI_CONFIG
        fresh = not os.path.lexists(config_path)
        write_text(config_path, json.dumps(self.config, indent=4))
        if fresh:
            self.created.append(config_path)
        return [*(t for _, t in self.copies), *self.kept, config_path]

    def roll_back(self) -> None:
        """Remove the files :meth:`write` created (the model's save failed: the folder is left as it was)."""
        for path in reversed(self.created):
            try:
                path.unlink()
            except OSError:
                continue
        self.created.clear()


def _refuse(message: str) -> ConversionError:
    return ConversionError(message)


def plan_genai_folder(source: Path, output: Path, inputs: list[Path]) -> GenAIFolder | None:
    """What converting ``source`` to ``output`` writes beside it, checked, before anything is written; None without
    a ``genai_config.json`` beside ``source`` or when the output is in the same folder (the original config must
    keep pointing at the original model). Raises :class:`ConversionError` naming the file otherwise."""
    folder = source.parent
    config_path = folder / GENAI_CONFIG
    if not os.path.lexists(config_path) or os.path.realpath(folder) == os.path.realpath(output.parent):
        return None
    if inside_folder(folder, config_path) is None:
        raise _refuse(f"{config_path} is a link out of the model's folder; not read")
    prefix = f"{config_path}: "

    def unreadable(message: str) -> ConversionError:
        return ConversionError(f"{config_path} is not a readable GenAI config: {message.removeprefix(prefix)}")

    config = read_json(config_path, unreadable)
    try:
        config["model"]["decoder"]["filename"] = output.name
    except (KeyError, TypeError) as exc:
        raise _refuse(f"{config_path} is not a readable GenAI config ({type(exc).__name__})") from None
    existing = output.parent / GENAI_CONFIG
    if os.path.lexists(existing):  # replaced only when it is this output's own (a conversion again)
        try:
            owner = read_json(existing, _refuse)["model"]["decoder"]["filename"] if existing.is_file() else None
        except (ConversionError, KeyError, TypeError):
            owner = None
        if owner != output.name:
            raise _refuse(
                f"{existing} is another model's GenAI config ({'decoder ' + repr(owner) if owner else 'unreadable'}): "
                "converting a GenAI model writes its own there; convert into another folder"
            )
    copies, kept = _plan_side_files(folder, output)
    try:  # an input of this command (the --hw file, the model) is never a target
        check_no_clobber([*(t for _, t in copies), existing], inputs)
    except FileSafetyError as exc:
        raise _refuse(str(exc)) from None
    return GenAIFolder(output, config, copies, kept)


def _plan_side_files(folder: Path, output: Path) -> tuple[list[tuple[Path, Path]], list[Path]]:
    copies: list[tuple[Path, Path]] = []
    kept: list[Path] = []
    model_files = {output.name, output.name + ".data"}
    for path in sorted(folder.iterdir()):
        name = path.name
        if name == GENAI_CONFIG or name.endswith(NOT_COPIED_SUFFIXES) or name in model_files:
            continue
        resolved = inside_folder(folder, path)
        if resolved is None:
            if path.is_symlink():
                raise _refuse(
                    f"{path} is a link out of the model's folder (or a broken one); not read: copy the folder "
                    "with its files (cp -rL) to convert it"
                )
            continue
        try:
            if not stat.S_ISREG(os.stat(resolved).st_mode):
                continue  # directories, FIFOs, devices: not side files
        except OSError:
            continue
        target = output.parent / name
        if os.path.lexists(target):
            if not os.path.isfile(target) or os.path.islink(target):
                raise _refuse(f"{target} exists and is not a regular file; the GenAI side file {name} is not copied")
            if _same_bytes(resolved, target):
                kept.append(target)
                continue
            raise _refuse(
                f"{target} exists with other content than the model folder's {name}: not overwritten; "
                "convert into another folder or remove it"
            )
        copies.append((resolved, target))
    return copies, kept


def _same_bytes(a: Path, b: Path) -> bool:
    try:
        return filecmp.cmp(a, b, shallow=False)
    except OSError:
        return False
