"""`ndp-ep run` start-up: what a command loads, and the model checks that were made cheaper without loosening.

Issue 9 asks `ndp-ep run` to start within 1.5x of `import onnxruntime` + one run (benchmarks/bench_session.py
--startup). These tests pin the cuts: the command line imports only the command it runs; ``ndp_io`` defers
``hashlib`` (OpenSSL) to the first file it writes; the operator check reads ONNX Runtime's schema list only for
operators outside the standard; the opset check probes the model's own opset; an in-memory conversion checks
the model once; the checker's copy stubs only large weights (a model without any is copied whole); session keys
need no ``uuid``; the library's OpenBLAS starts no idle workers; the program skips the interpreter's teardown but
not its exit code, ``atexit`` callbacks or buffered output. Each cut keeps its refusal: the failing cases still
fail with the same message.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graph_passes.model_check as model_check
from graph_passes.errors import InvalidModelError
from ndp_ep import InferenceSession


def _imported_by(code: str, repo_root) -> list[str]:
    """The ``ndp_ep.commands`` modules and ``hashlib`` that ``code``, run in a fresh interpreter, leaves imported."""
    shown = "m.startswith('ndp_ep.commands.') or m == 'hashlib'"
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if {shown})))"
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=repo_root, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_command_line_imports_only_the_command_it_runs(repo_root):
    parse_run = "from ndp_ep.cli import build_parser\nbuild_parser(['run', 'm.onnx']).parse_args(['run', 'm.onnx'])"
    assert _imported_by(parse_run, repo_root) == ["ndp_ep.commands.run"]


def test_help_before_a_command_still_lists_every_command(capsys):
    from ndp_ep.cli import COMMANDS, main

    assert main(["--help", "run"]) == 0
    listed = capsys.readouterr().out
    assert all(f"    {name} " in listed for name in COMMANDS), listed


def test_ndp_io_loads_hashlib_only_when_it_names_a_temporary_file(repo_root, tmp_path):
    assert _imported_by("import ndp_io", repo_root) == []
    write = f"import ndp_io\nndp_io.write_text({str(tmp_path / 'out.txt')!r}, 'x')"
    assert _imported_by(write, repo_root) == ["hashlib"]
    assert (tmp_path / "out.txt").read_text() == "x"


def _one_node_model(op_type: str, domain: str = "", opset: int = 18):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])
    inputs = ["x", "x"] if op_type == "FusedMatMul" else ["x"]
    node = helper.make_node(op_type, inputs, ["y"], name="n", domain=domain)
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=imports)


def _runtime_schemas() -> set[tuple[str, str]]:
    from onnxruntime.capi import _pybind_state

    return {(s.domain or "", s.name) for s in _pybind_state.get_all_operator_schema()}


def test_standard_operators_pass_without_listing_runtime_schemas(monkeypatch):
    def refuse():
        raise AssertionError("ONNX Runtime's schema list was read for a standard operator")

    monkeypatch.setattr(model_check, "_runtime_operators", refuse)
    model_check.check_runnable(_one_node_model("Relu"))


def test_contrib_and_unknown_operators_are_decided_by_the_runtime_schema_list():
    assert ("com.microsoft", "FusedMatMul") in _runtime_schemas()
    model_check.check_runnable(_one_node_model("FusedMatMul", "com.microsoft"))
    assert ("", "NoSuchOperator") not in _runtime_schemas()
    with pytest.raises(InvalidModelError, match="ai.onnx::NoSuchOperator is not known to ONNX Runtime"):
        model_check.check_runnable(_one_node_model("NoSuchOperator"))


def _runtime_creates_session(opset: int) -> bool:
    model = _one_node_model("Relu", opset=opset)
    model.ir_version = 10
    options = ort.SessionOptions()
    options.log_severity_level = 4
    try:
        ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    except Exception:  # noqa: BLE001 - any refusal
        return False
    return True


def test_the_opset_probe_agrees_with_onnx_runtime_and_the_error_names_its_newest_opset():
    newest = model_check.max_runtime_opset()
    for opset in (18, newest, newest + 1, 99):
        assert model_check.runtime_loads_opset(opset) == _runtime_creates_session(opset), opset
    with pytest.raises(InvalidModelError, match=f"needs ai.onnx opset 99; .* up to {newest}$"):
        model_check.check_opsets(_one_node_model("Relu", opset=99))


def test_an_in_memory_conversion_checks_the_model_once(monkeypatch, samples_dir):
    calls = []
    check = model_check.check_model
    monkeypatch.setattr(
        model_check, "check_model", lambda model, base_dir: calls.append(base_dir) or check(model, base_dir)
    )
    session = InferenceSession(samples_dir / "moe_block.onnx")
    assert session.conversion_report.blocks, "the sample's MoE block was not converted"
    assert calls == [samples_dir]  # once, with the model's folder (external data containment)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no worker thread on one core")
@pytest.mark.parametrize("preset", [None, "3"])
def test_registering_the_library_starts_no_blas_threads_and_restores_the_environment(repo_root, preset):
    probe = (
        "import json, os, numpy, onnxruntime\n"
        "import ndp_ep.ep as ep\n"
        "before = len(os.listdir('/proc/self/task'))\n"
        "ep.register()\n"
        "print(json.dumps([before, len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS')]))"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    env.pop("OPENBLAS_NUM_THREADS", None)
    if preset is not None:
        env["OPENBLAS_NUM_THREADS"] = preset
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    before, after, value = json.loads(done.stdout.strip().splitlines()[-1])
    assert after == before  # the library's OpenBLAS started no idle worker threads
    assert value == preset


@pytest.mark.parametrize(("argv", "code"), [(["--version"], 0), (["run", "no-such-model.onnx"], 2)])
def test_the_program_keeps_the_exit_code_runs_atexit_callbacks_and_flushes_output(repo_root, argv, code):
    script = (
        "import atexit, sys\n"
        "atexit.register(print, 'atexit callback ran')\n"
        f"sys.argv = ['ndp-ep', *{argv!r}]\n"
        "from ndp_ep.cli import program\n"
        "program()\n"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=repo_root, env=env)
    assert done.returncode == code, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1] == "atexit callback ran"
    if code == 0:
        assert lines[0].startswith("ndp-ep ")
    else:
        assert done.stderr.count("\n") == 1 and done.stderr.startswith("ndp-ep run: error:")


def _matmul_model(rows: int, cols: int):
    """``y = x @ w + b`` with ``w`` float32 ``[rows, cols]`` and ``b`` float32 ``[cols]``."""
    rng = np.random.default_rng(9)
    w = numpy_helper.from_array(rng.standard_normal((rows, cols)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.zeros(cols, np.float32), "b")
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, rows])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, cols])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Add", ["t", "b"], ["y"])]
    graph = helper.make_graph(nodes, "g", [x], [y], initializer=[w, b])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def test_the_checker_sees_large_initializers_as_inputs_and_small_ones_as_they_are():
    large = _matmul_model(4, 5000)  # w: 80,000 bytes, above the stub threshold; b: 20,000 bytes, below
    assert 4 * 5000 * 4 > model_check.STUB_ABOVE_BYTES > 5000 * 4
    stub = model_check._stub_copy(large)
    assert [t.name for t in stub.graph.initializer] == ["b"]
    assert stub.graph.initializer[0] == large.graph.initializer[1]
    stubbed = {v.name: v.type.tensor_type for v in stub.graph.input}
    assert set(stubbed) == {"x", "w"}
    assert stubbed["w"].elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in stubbed["w"].shape.dim] == [4, 5000]
    assert [t.name for t in large.graph.initializer] == ["w", "b"]  # the model itself is untouched

    small = _matmul_model(4, 8)  # every initializer below the threshold: a plain copy
    copy = model_check._stub_copy(small)
    assert copy == small and copy is not small
    copy.graph.initializer.pop()
    assert len(small.graph.initializer) == 2


@pytest.mark.parametrize("cols", [8, 5000], ids=["small-weights", "stubbed-weights"])
def test_the_checker_still_refuses_an_invalid_graph_with_or_without_stubs(cols):
    model = _matmul_model(4, cols)
    model_check.check_model(model, None)  # valid as built
    model.graph.node[1].attribute.append(helper.make_attribute("no_such_attribute", 1))
    with pytest.raises(InvalidModelError, match="^not a valid ONNX model: .*no_such_attribute"):
        model_check.check_model(model, None)


def test_session_keys_are_fresh_32_digit_hex():
    from ndp_ep.ep import new_session_key

    keys = {new_session_key() for _ in range(100)}
    assert len(keys) == 100
    assert all(len(key) == 32 and int(key, 16) >= 0 for key in keys)
