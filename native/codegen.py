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
CONTRACT = {"DOMAIN": ("kDomain", str), "OP_TYPE": ("kOpType", str), "OPSET": ("kOpsetVersion", int)}

DEFAULTS = {
    "SWIGLU_ALPHA": "kDefaultActivationAlpha",
    "SWIGLU_LIMIT": "kDefaultActivationLimit",
    "SWIGLU_BETA": "kDefaultActivationBeta",
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
        return "k" + "".join(part.capitalize() for part in self.name.split("_"))


def _fields(tree: ast.Module) -> list[str]:
    """The field names of the ``Activation`` dataclass, in order (positional arguments bind to them)."""
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "Activation":
            return [s.target.id for s in node.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)]
    raise CatalogError("no Activation class in the catalog file")


def read_catalog(path: Path) -> tuple[list[NativeActivation], dict[str, float]]:
    """The catalog's entries (in file order) and its SwiGLU defaults, read from the source of ``path``."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    fields = _fields(tree)
    defaults: dict[str, float] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in DEFAULTS:
            try:
                defaults[target.id] = float(ast.literal_eval(node.value))
            except (TypeError, ValueError) as error:
                raise CatalogError(f"{path}:{node.lineno}: {target.id} must be a number literal") from error
    missing = sorted(set(DEFAULTS) - set(defaults))
    if missing:
        raise CatalogError(f"{path}: no literal {', '.join(missing)}")
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


def _float(value: float) -> str:
    return f"{value!r}f"  # repr of a float always has a '.' or an exponent: 7.0 -> 7.0f, 1e-05 -> 1e-05f


def render(entries: list[NativeActivation], defaults: dict[str, float], source: str) -> str:
    """The text of the generated header."""
    out = [
        f"// Generated from {source} by native/codegen.py at build time: do not edit, do not commit.",
        "#pragma once",
        "",
        "#include <algorithm>",
        "#include <cmath>",
        "#include <cstdint>",
        "",
        "namespace ndp {",
        "",
    ]
    out += [f"constexpr float {DEFAULTS[key]} = {_float(defaults[key])};  // {key}" for key in DEFAULTS]
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
    out += ["  }", "}", "", "}  // namespace ndp", ""]
    return "\n".join(out)


def read_constants(path: Path, wanted: dict[str, tuple[str, type]]) -> dict[str, str | int]:
    """The module-level literals ``wanted`` names (``NAME -> (C++ name, type)``), read from the source of ``path``."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, str | int] = {}
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None
        if isinstance(target, ast.Name) and target.id in wanted:
            value = ast.literal_eval(node.value) if isinstance(node.value, ast.Constant) else None
            kind = wanted[target.id][1]
            if type(value) is not kind:
                raise CatalogError(f"{path}:{node.lineno}: {target.id} must be a {kind.__name__} literal")
            found[target.id] = value
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise CatalogError(f"{path}: no literal {', '.join(missing)}")
    return found


def read_attributes(path: Path) -> dict[str, str]:
    """The op's attributes, ``name -> type name``, from the ``ATTRIBUTES`` dict literal in the source of ``path``."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"), filename=str(path))
    for node in tree.body:
        target = node.target if isinstance(node, ast.AnnAssign) else None
        if not (isinstance(target, ast.Name) and target.id == "ATTRIBUTES" and isinstance(node.value, ast.Dict)):
            continue
        attributes = {}
        for key, value in zip(node.value.keys, node.value.values, strict=True):
            if not (isinstance(key, ast.Constant) and isinstance(key.value, str) and isinstance(value, ast.Name)):
                raise CatalogError(f"{path}:{node.lineno}: ATTRIBUTES must map string literals to type names")
            attributes[key.value] = value.id
        return attributes
    raise CatalogError(f"{path}: no ATTRIBUTES dict literal")


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_"))


def render_contract(constants: dict[str, str | int], attributes: dict[str, str], source: str) -> str:
    """The text of the op-contract header: the op's identity, then one ``attr::k<Name>`` per attribute (the
    native reader spells attribute names only through these, so a renamed attribute fails to compile)."""
    out = [
        f"// Generated from {source} by native/codegen.py at build time: do not edit, do not commit.",
        "#pragma once",
        "",
        "namespace ndp {",
        "",
    ]
    for name, (cpp_name, kind) in CONTRACT.items():
        value = constants[name]
        if kind is str:
            out.append(f'constexpr const char* {cpp_name} = "{value}";  // {name}')
        else:
            out.append(f"constexpr int {cpp_name} = {value};  // {name}")
    out += ["", "namespace attr {"]
    out += [f'constexpr const char* k{_camel(name)} = "{name}";  // {kind}' for name, kind in attributes.items()]
    out += ["}  // namespace attr", "", "}  // namespace ndp", ""]
    return "\n".join(out)


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
        constants = read_constants(root / CONTRACT_SOURCE, CONTRACT)
        attributes = read_attributes(root / CONTRACT_SOURCE)
    except (OSError, SyntaxError, ValueError, CatalogError) as error:
        print(f"codegen: {error}", file=sys.stderr)
        return 1
    _write_if_changed(output / "activations_gen.h", render(entries, defaults, ACTIVATIONS_SOURCE))
    _write_if_changed(output / "op_contract_gen.h", render_contract(constants, attributes, CONTRACT_SOURCE))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
