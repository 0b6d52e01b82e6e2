"""Generates the native library's copies of Python-defined contracts, so each stays defined once, in Python.

    python native/codegen.py SOURCE_ROOT BUILD/generated

CMake runs this at build time (also inside ``pip install``'s isolated build environment, so it uses the standard
library only): the Python sources are read with :mod:`ast`, never imported. It writes two headers:

- ``activations_gen.h`` from the activation catalog (``graph_passes/activations.py``): from every
  ``Activation(...)`` entry the name, the gated flag and the ``native`` C++ expression, and the module's SwiGLU
  defaults. The header holds ``enum class Activation`` (one enumerator per entry, ``silu_glu`` -> ``kSiluGlu``),
  the name table ``kActivations``, one inline function ``act_<name>`` per entry, ``ApplyActivation`` (the per-row
  loop, one switch case per entry) and ``kDefaultActivationAlpha/Limit/Beta``.
- ``op_contract_gen.h`` from the sharded op's contract (``graph_passes/sharded_op.py``): the op's domain, type and
  opset version (``kDomain``, ``kOpType``, ``kOpsetVersion``), which GetCapability matches and the custom-op
  domain registers, and the attribute names (``attr::kNumExperts`` ...) the node reader uses.

A header is rewritten only when its text changes, so an unrelated edit of a source recompiles nothing.
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass
from pathlib import Path

ACTIVATIONS_SOURCE = "graph_passes/activations.py"
CONTRACT_SOURCE = "graph_passes/sharded_op.py"
# module-level literals copied into the headers: Python name -> (C++ name, type)
CONTRACT = {"DOMAIN": ("kDomain", str), "OP_TYPE": ("kOpType", str), "OPSET": ("kOpsetVersion", int)}
DEFAULTS = {
    "SWIGLU_ALPHA": ("kDefaultActivationAlpha", float),
    "SWIGLU_LIMIT": ("kDefaultActivationLimit", float),
    "SWIGLU_BETA": ("kDefaultActivationBeta", float),
}


class CatalogError(ValueError):
    """The catalog file cannot be turned into native code (one-line message)."""


@dataclass(frozen=True)
class NativeActivation:
    name: str
    gated: bool
    native: str

    @property
    def enumerator(self) -> str:
        return "k" + _camel(self.name)


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def _parse(path: Path) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))


def _constants(tree: ast.Module, path: Path, wanted: dict[str, tuple[str, type]]) -> dict[str, str | int | float]:
    """The module-level literals ``wanted`` names (``NAME -> (C++ name, type)``; a float may be written as an int)."""
    found: dict[str, str | int | float] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in wanted:
            value = ast.literal_eval(node.value) if isinstance(node.value, ast.Constant) else None
            kind = wanted[target.id][1]
            if kind is float and type(value) is int:
                value = float(value)
            if type(value) is not kind:
                raise CatalogError(f"{path}:{node.lineno}: {target.id} must be a {kind.__name__} literal")
            found[target.id] = value
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise CatalogError(f"{path}: no literal {', '.join(missing)}")
    return found


def _fields(tree: ast.Module) -> list[str]:
    """The field names of the ``Activation`` dataclass, in order (positional arguments bind to them)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Activation":
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    raise CatalogError("no Activation class in the catalog file")


def read_catalog(path: Path) -> tuple[list[NativeActivation], dict[str, float]]:
    """The catalog's entries (in file order) and its SwiGLU defaults, read from the source of ``path``."""
    tree = _parse(path)
    fields = _fields(tree)
    defaults = _constants(tree, path, DEFAULTS)
    found: list[tuple[int, int, NativeActivation]] = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Activation"):
            continue
        bound = {fields[i]: arg for i, arg in enumerate(node.args)}
        bound.update({k.arg: k.value for k in node.keywords if k.arg})
        try:
            name, gated, native = (ast.literal_eval(bound[f]) for f in ("name", "gated", "native"))
        except (KeyError, ValueError) as error:
            raise CatalogError(f"{path}:{node.lineno}: an Activation needs literal name, gated and native") from error
        if not isinstance(name, str) or not name.isidentifier() or not isinstance(gated, bool):
            raise CatalogError(f"{path}:{node.lineno}: bad activation name or gated flag")
        if not isinstance(native, str) or not native.strip():
            raise CatalogError(f"{path}:{node.lineno}: activation {name} has no native expression")
        found.append((node.lineno, node.col_offset, NativeActivation(name, gated, native.strip())))
    entries = [entry for _, _, entry in sorted(found, key=lambda f: f[:2])]
    names = [e.name for e in entries]
    if not entries or len(set(names)) != len(names):
        raise CatalogError(f"{path}: the activation names must be present and unique, got {names}")
    return entries, defaults


def _constant_lines(constants: dict[str, str | int | float], wanted: dict[str, tuple[str, type]]) -> list[str]:
    """One ``constexpr`` per constant (a float's repr always has a '.' or an exponent: 7.0 -> 7.0f)."""
    lines = []
    for name, (cpp_name, kind) in wanted.items():
        value = constants[name]
        if kind is str:
            lines.append(f'constexpr const char* {cpp_name} = "{value}";  // {name}')
        elif kind is float:
            lines.append(f"constexpr float {cpp_name} = {value!r}f;  // {name}")
        else:
            lines.append(f"constexpr int {cpp_name} = {value};  // {name}")
    return lines


def _header(source: str, includes: list[str], body: list[str]) -> str:
    """A generated header: the provenance line, ``includes``, then ``body`` inside ``namespace ndp``."""
    out = [f"// Generated from {source} by native/codegen.py at build time: do not edit, do not commit."]
    out.append("#pragma once")
    out += ["", *(f"#include <{name}>" for name in includes)] if includes else []
    return "\n".join([*out, "", "namespace ndp {", "", *body, "", "}  // namespace ndp", ""])


def render(entries: list[NativeActivation], defaults: dict[str, float], source: str) -> str:
    """The text of the generated activations header."""
    out = _constant_lines(defaults, DEFAULTS)
    out += ["", f"enum class Activation {{ {', '.join(e.enumerator for e in entries)} }};", ""]
    out += ["struct ActivationInfo {", "  const char* name;", "  Activation value;", "  bool gated;", "};", ""]
    out.append("inline constexpr ActivationInfo kActivations[] = {")
    out += [f'    {{"{e.name}", Activation::{e.enumerator}, {str(e.gated).lower()}}},' for e in entries]
    out += ["};", "", "namespace activation_impl {", ""]
    # plain ones first: a gated expression may call act_<plain>(x)
    for e in sorted(entries, key=lambda e: e.gated):
        params = "float g, float u, float alpha, float limit, float beta" if e.gated else "float x"
        out.append(f"inline float act_{e.name}({params}) {{ return {e.native}; }}")
    out += [
        "",
        "}  // namespace activation_impl",
        "",
        "// In place on one row: row[j] = act(row[j]) for a plain activation, act(row[j], row[n + j]) (gate, up)",
        "// for a gated one, j in [0, n).",
        "inline void ApplyActivation(Activation activation, float* row, int64_t n, float alpha, float limit,",
        "                            float beta) {",
        "  switch (activation) {",
    ]
    for e in entries:
        args = "row[j], row[n + j], alpha, limit, beta" if e.gated else "row[j]"
        out += [
            f"    case Activation::{e.enumerator}:",
            f"      for (int64_t j = 0; j < n; ++j) row[j] = activation_impl::act_{e.name}({args});",
            "      return;",
        ]
    out += ["  }", "}"]
    return _header(source, ["algorithm", "cmath", "cstdint"], out)


def read_contract(path: Path) -> tuple[dict[str, str | int | float], dict[str, str]]:
    """The op's identity (:data:`CONTRACT`) and its attributes (``name -> type name``, from the ``ATTRIBUTES``
    dict literal), read from the source of ``path``."""
    tree = _parse(path)
    constants = _constants(tree, path, CONTRACT)
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if not (isinstance(target, ast.Name) and target.id == "ATTRIBUTES" and isinstance(node.value, ast.Dict)):
            continue
        attributes = {}
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Name)):
                raise CatalogError(f"{path}:{node.lineno}: ATTRIBUTES must map string literals to type names")
            attributes[key.value] = value.id
        return constants, attributes
    raise CatalogError(f"{path}: no ATTRIBUTES dict literal")


def render_contract(constants: dict[str, str | int | float], attributes: dict[str, str], source: str) -> str:
    """The text of the op-contract header: the op's identity, then one ``attr::k<Name>`` per attribute (the
    native reader spells attribute names only through these, so a renamed attribute fails to compile)."""
    out = _constant_lines(constants, CONTRACT)
    out += ["", "namespace attr {"]
    out += [f'constexpr const char* k{_camel(name)} = "{name}";  // {kind}' for name, kind in attributes.items()]
    out.append("}  // namespace attr")
    return _header(source, [], out)


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text(encoding="utf-8") != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: codegen.py SOURCE_ROOT OUTPUT_DIR", file=sys.stderr)
        return 2
    root, output = Path(argv[0]), Path(argv[1])
    try:
        entries, defaults = read_catalog(root / ACTIVATIONS_SOURCE)
        constants, attributes = read_contract(root / CONTRACT_SOURCE)
    except (OSError, SyntaxError, ValueError, CatalogError) as error:
        print(f"codegen: {error}", file=sys.stderr)
        return 1
    _write_if_changed(output / "activations_gen.h", render(entries, defaults, ACTIVATIONS_SOURCE))
    _write_if_changed(output / "op_contract_gen.h", render_contract(constants, attributes, CONTRACT_SOURCE))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
