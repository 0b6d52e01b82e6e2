"""`ndp-ep run` start-up: what a command loads, and the model checks that were made cheaper without loosening.

Issue 9 asks `ndp-ep run` to start within 1.5x of `import onnxruntime` + one run (benchmarks/bench_session.py
--startup). These tests pin the cuts: the command line imports only the command it runs; ``ndp_io`` defers
``hashlib`` (OpenSSL) to the first file it writes; the operator check reads ONNX Runtime's schema list only for
operators outside the standard; the opset check probes the model's own opset; an in-memory conversion checks
the model once; the checker's copy stubs every weight above 256 bytes (a model without any is copied whole) and
onnx's tensor rules still check each stubbed weight; a converted model's schema and operator checks run while ONNX
Runtime builds its session (dropped when they fail), its errors in the same order as before; session keys
need no ``uuid``; registering the library starts no threads; the program skips the interpreter's teardown but
not its exit code, ``atexit`` callbacks or buffered output; ONNX Runtime builds the session on another thread while
the reports are set up (the simulator imported, the feeds' non-expert cost computed ahead, from a skeleton built
without copying weights), and parsing ``run``'s options leaves the simulator unimported; the in-tree library is
found without scanning the installed distributions; ``ndp-ep run`` asks ONNX Runtime's threads not to spin after its
one run, loads numpy's OpenBLAS without idle workers and pauses the cyclic garbage collector (a session build leaves no
cyclic garbage); ``ndp-ep run`` starts ONNX Runtime's one-time work (library registration, a first session of a
one-node model serialized ahead) on a thread before onnx is imported, a failure there left to the command; the
reports are set up before a converted model's schema check (its error still first); reading a model leaves the
writers' ``mmap`` and ``queue`` unimported. Each cut keeps its refusal: the failing cases still fail with
the same message. ``session_options`` checks its options loading the named hardware once, without importing onnx or
the policies (none named), and a session loads its hardware once.
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
    check, schemas = model_check.check_model, model_check.check_schemas

    def counted_check(model, base_dir, **kwargs):
        calls.append(("check_model", base_dir, kwargs))
        return check(model, base_dir, **kwargs)

    monkeypatch.setattr(model_check, "check_model", counted_check)
    monkeypatch.setattr(model_check, "check_schemas", lambda model: calls.append(("schemas",)) or schemas(model))
    session = InferenceSession(samples_dir / "moe_block.onnx")
    assert session.conversion_report.blocks, "the sample's MoE block was not converted"
    # once, with the model's folder (external data containment), the schema check apart (before converting)
    assert calls == [("check_model", samples_dir, {"schemas": False}), ("schemas",)]


@pytest.mark.parametrize("preset", [None, "3"])
def test_registering_the_library_starts_no_threads_and_leaves_the_environment(repo_root, preset):
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
    assert after == before  # the library starts no threads of its own (it links no BLAS)
    assert value == preset


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="OpenBLAS starts no worker thread on one core")
def test_ndp_ep_run_loads_numpys_blas_without_idle_workers(repo_root, samples_dir):
    run = (
        "import contextlib, io, json, os\n"
        "{first}"
        "from ndp_ep.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    assert main(['run', {str(samples_dir / 'moe_block.onnx')!r}, '--inputs', "
        f"{str(samples_dir / 'moe_block.inputs.npz')!r}]) == 0\n"
        "print(json.dumps([len(os.listdir('/proc/self/task')), os.environ.get('OPENBLAS_NUM_THREADS')]))"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    env.pop("OPENBLAS_NUM_THREADS", None)

    def threads(first: str) -> tuple[int, str | None]:
        done = subprocess.run(
            [sys.executable, "-c", run.format(first=first)], capture_output=True, text=True, env=env, check=True
        )
        return tuple(json.loads(done.stdout.strip().splitlines()[-1]))

    ours, value = threads("")
    numpy_first, _ = threads("import numpy\n")  # numpy loaded before the command: its OpenBLAS workers run
    assert ours < numpy_first and value is None  # and the variable is the caller's again (unset)


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
    large = _matmul_model(4, 50)  # w: 800 bytes, above the stub threshold; b: 200 bytes, below
    assert 4 * 50 * 4 > model_check.STUB_ABOVE_BYTES > 50 * 4
    stub, stubbed = model_check._stub_copy(large)
    assert [t.name for t in stub.graph.initializer] == ["b"]
    assert stub.graph.initializer[0] == large.graph.initializer[1]
    assert [t.name for t in stubbed] == ["w"]  # left to the checker's tensor rules one by one
    inputs = {v.name: v.type.tensor_type for v in stub.graph.input}
    assert set(inputs) == {"x", "w"}
    assert inputs["w"].elem_type == TensorProto.FLOAT
    assert [d.dim_value for d in inputs["w"].shape.dim] == [4, 50]
    assert [t.name for t in large.graph.initializer] == ["w", "b"]  # the model itself is untouched

    small = _matmul_model(4, 8)  # every initializer below the threshold: a plain copy
    copy, stubbed = model_check._stub_copy(small)
    assert copy == small and copy is not small and stubbed == []
    copy.graph.initializer.pop()
    assert len(small.graph.initializer) == 2


@pytest.mark.parametrize("cols", [8, 5000], ids=["small-weights", "stubbed-weights"])
def test_the_checker_applies_its_tensor_rules_to_stubbed_weights_too(cols):
    """A weight with its bytes in raw_data and a stray float_data value: check_tensor's length check passes
    (raw_data has what the dims need) and onnx's checker refuses two value fields, stubbed or not."""
    model = _matmul_model(4, cols)
    model.graph.initializer[0].float_data.append(1.0)
    assert (model.graph.initializer[0].ByteSize() > model_check.STUB_ABOVE_BYTES) == (cols == 5000)
    model_check.check_initializers(model, None)
    with pytest.raises(
        InvalidModelError,
        match=r"^not a valid ONNX model: .*\(tensor name: w\) should contain one and only one value field",
    ):
        model_check.check_model(model, None)


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


# -- the session's set-up overlaps ONNX Runtime's session build ------------------------------------------------


def test_onnx_runtime_builds_the_session_off_the_calling_thread_and_the_outputs_match_stock(samples_dir, monkeypatch):
    import threading

    import ndp_ep.session as session_module
    from ndp_ep.ep import SESSION_KEY_OPTION, session_option

    built_on = []  # the thread of each session built with the provider (not the checks' opset probes)
    real = ort.InferenceSession

    class Recording(real):
        def __init__(self, model, options=None, **kwargs):
            if options is not None and session_option(options, SESSION_KEY_OPTION):
                built_on.append(threading.current_thread())
            super().__init__(model, options, **kwargs)

    monkeypatch.setattr(ort, "InferenceSession", Recording)
    block = samples_dir / "moe_block.onnx"
    session = session_module.InferenceSession(block)
    assert len(built_on) == 1 and built_on[0] is not threading.main_thread()
    feeds = dict(np.load(samples_dir / "moe_block.inputs.npz"))
    stock = real(str(block), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, feeds)[0], stock.run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def _threads_settle(before: int) -> bool:
    import threading
    import time

    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    return threading.active_count() == before


def test_onnx_runtime_refusing_the_model_is_one_line_model_load_error(tmp_path):
    import threading

    from ndp_ep.errors import ModelLoadError

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    n = helper.make_tensor_value_info("n", TensorProto.INT64, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    graph = helper.make_graph([helper.make_node("Add", ["x", "n"], ["y"], name="mixed")], "g", [x, n], [y])
    path = tmp_path / "mixed.onnx"  # valid to the checker (no shape inference), refused by ONNX Runtime's types
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString())
    before = threading.active_count()
    with pytest.raises(ModelLoadError, match="^onnxruntime could not create the session: [^\n]*$"):
        InferenceSession(path)
    assert _threads_settle(before)


def test_an_error_setting_up_the_reports_is_raised_once_the_session_build_ended(samples_dir):
    import threading

    from ndp_ep import NdpEpError

    before = threading.active_count()
    with pytest.raises(NdpEpError, match="report_ring must be a positive integer"):  # the policy is the settings'
        InferenceSession(samples_dir / "moe_block.onnx", report_ring=0)
    assert threading.active_count() == before  # the build was waited for, not left running


def test_input_shapes_given_ahead_are_costed_during_the_build_with_the_same_figures(samples_dir, monkeypatch):
    from ndp_ep.costing import NonExpertCoster

    computed = []
    real = NonExpertCoster._compute
    monkeypatch.setattr(NonExpertCoster, "_compute", lambda self, shapes: computed.append(shapes) or real(self, shapes))
    model = samples_dir / "moe_decoder.onnx"
    feeds = dict(np.load(samples_dir / "moe_decoder.inputs.npz"))
    ahead = InferenceSession(model, input_shapes={name: list(value.shape) for name, value in feeds.items()})
    assert computed == [{name: value.shape for name, value in feeds.items()}]  # before any run
    ahead.run(None, feeds)
    ahead_report = ahead.last_report
    assert len(computed) == 1  # the report found the cost computed ahead
    later = InferenceSession(model)
    later.run(None, feeds)
    later_report = later.last_report
    assert len(computed) == 2
    assert ahead_report.non_expert_gpu_s == later_report.non_expert_gpu_s > 0
    assert ahead_report.simulated_latency_s == later_report.simulated_latency_s


def _reference_skeleton(model):
    """What the costing's skeleton is: a copy of the model whose large or external initializers lost their bytes,
    claimed nodes replaced by ``Identity`` of their hidden input, unread initializers dropped, standard opsets
    only (built the straightforward way, copying every weight first)."""
    from ndp_ep.costing import SMALL_INITIALIZER_BYTES
    from ndp_ep.partition import is_ndp_supported

    skeleton = type(model)()
    skeleton.CopyFrom(model)
    graph = skeleton.graph
    for tensor in graph.initializer:
        if len(tensor.raw_data) > SMALL_INITIALIZER_BYTES or tensor.data_location == TensorProto.EXTERNAL:
            tensor.ClearField("raw_data")
            del tensor.external_data[:]
            tensor.data_location = TensorProto.DEFAULT
    for position, node in enumerate(graph.node):
        if is_ndp_supported(node):
            graph.node[position].CopyFrom(
                helper.make_node("Identity", [node.input[0]], [node.output[0]], name=node.name)
            )
    used = {name for node in graph.node for name in node.input}
    kept = [tensor for tensor in graph.initializer if tensor.name in used]
    del graph.initializer[:]
    graph.initializer.extend(kept)
    standard = [o for o in skeleton.opset_import if o.domain in ("", "ai.onnx")]
    del skeleton.opset_import[:]
    skeleton.opset_import.extend(standard or [helper.make_opsetid("", 17)])
    return skeleton


@pytest.mark.parametrize(
    "relative", ["moe_decoder.onnx", "genai/lfm2_moe_int4/model.onnx", "hf/qwen2_moe_model_dynamo.onnx"]
)
def test_the_costing_skeleton_is_the_model_without_weights_and_costs_the_same(samples_dir, relative):
    from hw_model.hardware import load_system
    from ndp_ep.costing import NonExpertCoster

    converted = InferenceSession(samples_dir / relative).converted_model  # with its external data unread
    assert any(node.domain == "ndp_ep" for node in converted.graph.node)
    reference = _reference_skeleton(converted)
    coster = NonExpertCoster(converted, load_system("paper"), "bf16")
    assert coster.skeleton.SerializeToString() == reference.SerializeToString()
    assert max((len(t.raw_data) for t in coster.skeleton.graph.initializer), default=0) <= 4096
    from_reference = NonExpertCoster(converted, load_system("paper"), "bf16")
    from_reference.skeleton = reference
    names = [value.name for value in converted.graph.input]
    for tokens in (1, 7):
        shapes = {name: _concrete(converted, name, tokens) for name in names}
        assert coster.cost(shapes) == from_reference.cost(shapes)


def _concrete(model, name: str, tokens: int) -> tuple[int, ...]:
    """The input's declared shape with every symbolic dim set to ``tokens`` (past lengths alike)."""
    value = next(v for v in model.graph.input if v.name == name)
    return tuple(d.dim_value if d.HasField("dim_value") else tokens for d in value.type.tensor_type.shape.dim)


# -- what the command line and the library lookup import -------------------------------------------------------


def _modules_after(code: str, repo_root, prefixes: tuple[str, ...]) -> list[str]:
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith({prefixes!r}))))"
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    env.pop("NDP_EP_LIBRARY", None)
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=repo_root, env=env, check=True
    )
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_parsing_a_run_command_line_leaves_the_simulator_to_the_session(repo_root):
    parse = "from ndp_ep.cli import build_parser\nbuild_parser(['run', 'm.onnx']).parse_args(['run', 'm.onnx'])"
    loaded = _modules_after(parse, repo_root, ("hw_model.",))
    assert "hw_model.hardware" in loaded  # --hw lists the presets
    assert not {"hw_model.policies", "hw_model.simulator"} & set(loaded)
    lazy = "import hw_model\nfrom hw_model import MoESimulator, load_system\nassert 'POLICIES' in dir(hw_model)"
    assert "hw_model.simulator" in _modules_after(lazy, repo_root, ("hw_model.",))


def test_the_policy_option_keeps_its_choices_default_and_refusal(capsys):
    from hw_model.policies import policy_names
    from hw_model.settings import DEFAULT_POLICY
    from ndp_ep.cli import build_parser, main

    assert build_parser(["run", "m.onnx"]).parse_args(["run", "m.onnx"]).policy is None  # the simulator's default
    assert build_parser(["run"]).parse_args(["run", "m.onnx", "--policy", "monde"]).policy == "monde"
    assert main(["run", "--help"]) == 0
    shown = " ".join(capsys.readouterr().out.split())
    assert f"scheduling policy the simulator applies: {', '.join(policy_names())} (default: {DEFAULT_POLICY})" in shown
    assert main(["run", "m.onnx", "--policy", "no-such-policy"]) == 2
    refusal = capsys.readouterr().err
    assert refusal.startswith("ndp-ep run: error: argument --policy: unknown policy 'no-such-policy' (known: ")
    assert refusal.count("\n") == 1 and all(name in refusal for name in policy_names())


def test_session_options_loads_the_named_hardware_once_and_leaves_onnx_and_the_policies_unimported(repo_root):
    probe = (
        "import hw_model.hardware as hardware\n"
        "import ndp_ep\n"
        "loads = []\n"
        "real = hardware.system_from_dict\n"
        "hardware.system_from_dict = lambda *args, **kwargs: loads.append(args) or real(*args, **kwargs)\n"
        "ndp_ep.session_options(hw='paper', ndp_units=4)\n"
        "assert len(loads) == 1, loads\n"
    )
    loaded = _modules_after(probe, repo_root, ("onnx", "hw_model.policies"))
    assert [m for m in loaded if not m.startswith("onnxruntime")] == []


def test_a_session_loads_its_hardware_once(samples_dir, monkeypatch):
    import hw_model.hardware as hardware

    loads = []
    real = hardware.system_from_dict
    monkeypatch.setattr(
        hardware, "system_from_dict", lambda *args, **kwargs: loads.append(args) or real(*args, **kwargs)
    )
    InferenceSession(samples_dir / "moe_block.onnx", hw="paper", ndp_units=2, policy="monde")
    assert len(loads) == 1


def test_finding_the_built_library_does_not_scan_the_installed_distributions(repo_root):
    from ndp_ep.ep import LIBRARY_NAME

    if not (repo_root / "build" / "native" / LIBRARY_NAME).is_file():
        pytest.skip("no in-tree build of the library")
    found = "import ndp_ep.ep\nprint(ndp_ep.ep.get_library_path())"
    assert _modules_after(found, repo_root, ("importlib.metadata",)) == []


def test_the_run_command_asks_onnx_runtime_not_to_spin_and_sessions_keep_that_entry(samples_dir):
    from ndp_ep.session import one_run_session_options

    key = "session.intra_op.allow_spinning"
    options = one_run_session_options()
    assert options.get_session_config_entry(key) == "0" and options.log_severity_level == 3
    session = InferenceSession(samples_dir / "moe_block.onnx", options)
    assert session.get_session_options().get_session_config_entry(key) == "0"  # the session ONNX Runtime runs
    default = InferenceSession(samples_dir / "moe_block.onnx")
    with pytest.raises(Exception, match=key):  # ONNX Runtime's own default (spinning) when the caller sets none
        default.get_session_options().get_session_config_entry(key)


def test_ndp_ep_run_pauses_the_cyclic_collector_and_turns_it_back_on(samples_dir, monkeypatch, capsys):
    import gc

    from ndp_ep.cli import main
    from ndp_ep.session import InferenceSession as Session

    seen = []
    real_run = Session.run
    monkeypatch.setattr(Session, "run", lambda self, *a, **k: seen.append(gc.isenabled()) or real_run(self, *a, **k))
    assert gc.isenabled()
    block = samples_dir / "moe_block.onnx"
    assert main(["run", str(block), "--inputs", str(samples_dir / "moe_block.inputs.npz")]) == 0
    assert seen == [False] and gc.isenabled()
    gc.disable()
    try:
        assert main(["run", str(block), "--inputs", str(samples_dir / "moe_block.inputs.npz")]) == 0
        assert not gc.isenabled()  # the caller's state, not "on"
    finally:
        gc.enable()
    capsys.readouterr()


def test_what_the_paused_block_allocated_goes_to_the_oldest_generation():
    # left in the youngest generation, all of it would be traversed by the first collection after the block
    import gc

    from ndp_ep.commands.run import cyclic_gc_paused

    with cyclic_gc_paused():
        kept = [[] for _ in range(5000)]  # containers the collector tracks
    oldest = gc.get_objects(generation=2)
    assert any(o is kept[0] for o in oldest) and any(o is kept[-1] for o in oldest)


@pytest.mark.parametrize(
    "relative", ["moe_decoder.onnx", "genai/gpt_oss_int4/model.onnx", "hf/mixtral_model_dynamo.onnx"]
)
def test_building_a_session_leaves_no_cyclic_garbage(samples_dir, relative):
    import gc

    gc.collect()
    gc.disable()
    try:
        session = InferenceSession(samples_dir / relative)  # converted in memory
        assert gc.collect() == 0  # what ndp-ep run's paused collector relies on
    finally:
        gc.enable()
    assert session.reporter.layers


def _converted_block(
    tmp_path, samples_dir, *, bogus_attribute: bool, unknown_operator: bool, broken_contract: bool = False
):
    """The sample MoE block converted to a file, then broken: a standard node given an attribute its schema
    lacks (onnx's schema check refuses it), a node of an operator nobody knows (the operator check refuses it),
    and/or a converted node whose hidden size no longer fits its weights (the op contract check refuses it)."""
    import onnx

    import ndp_ep

    path = tmp_path / "block.ndp.onnx"
    ndp_ep.convert_model(samples_dir / "moe_block.onnx", path, shards=2)
    model = onnx.load(str(path))
    if bogus_attribute:
        node = next(n for n in model.graph.node if n.op_type == "Softmax")
        node.attribute.append(helper.make_attribute("no_such_attribute", 1))
    if broken_contract:
        sharded = next(n for n in model.graph.node if n.domain == "ndp_ep")
        hidden = next(a for a in sharded.attribute if a.name == "hidden")
        hidden.i += 1
    if unknown_operator:
        source = model.graph.input[0].name
        model.graph.node.append(helper.make_node("Mystery", [source], ["mystery_out"], name="m", domain="x.test"))
        model.opset_import.append(helper.make_opsetid("x.test", 1))
    onnx.save(model, str(path))
    return path


def test_a_converted_model_refused_by_the_schema_check_drops_the_session_built_meanwhile(
    tmp_path, samples_dir, monkeypatch
):
    import ndp_ep.session as session_module
    from ndp_ep import ModelLoadError

    started = []

    class Recorded(session_module._SessionCreation):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            started.append(self)

    monkeypatch.setattr(session_module, "_SessionCreation", Recorded)
    path = _converted_block(tmp_path, samples_dir, bogus_attribute=True, unknown_operator=False)
    with pytest.raises(ModelLoadError, match="^not a valid ONNX model: .*no_such_attribute"):
        InferenceSession(path)
    assert len(started) == 1  # ONNX Runtime was building the session while the check ran
    assert not started[0]._thread.is_alive()  # waited for, then dropped


@pytest.mark.parametrize(
    ("bogus_attribute", "unknown_operator", "broken_contract", "expected"),
    [
        (True, True, False, "not a valid ONNX model: .*no_such_attribute"),
        (False, True, False, "node 'm': operator x.test::Mystery is not known"),
        (True, False, True, "not a valid ONNX model: .*no_such_attribute"),
        (False, False, True, "moe.*: weight .* has shape"),
    ],
    ids=["schemas-before-operators", "operators", "schemas-before-contract", "contract"],
)
def test_the_checks_still_report_the_first_error_in_their_order(
    tmp_path, samples_dir, bogus_attribute, unknown_operator, broken_contract, expected
):
    """onnx's schema check (now while ONNX Runtime builds the session) keeps its place before the operator and
    op contract checks: a model failing two of them reports the same one as before."""
    from ndp_ep import ModelLoadError

    path = _converted_block(
        tmp_path,
        samples_dir,
        bogus_attribute=bogus_attribute,
        unknown_operator=unknown_operator,
        broken_contract=broken_contract,
    )
    with pytest.raises(ModelLoadError, match=f"^{expected}"):
        InferenceSession(path)


def test_ndp_ep_run_refuses_a_converted_model_failing_the_schema_check_with_one_line(tmp_path, samples_dir, capsys):
    from ndp_ep.cli import main

    path = _converted_block(tmp_path, samples_dir, bogus_attribute=True, unknown_operator=False)
    assert main(["run", str(path), "--inputs", str(samples_dir / "moe_block.inputs.npz")]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("ndp-ep run: error: not a valid ONNX model: ")
    assert "no_such_attribute" in captured.err


def test_the_warm_up_model_is_the_opset_probe_and_onnx_runtime_builds_it():
    from graph_passes.runtime_probe import WARM_UP_MODEL, WARM_UP_OPSET, runtime_builds

    assert model_check._probe_model(WARM_UP_OPSET) == WARM_UP_MODEL
    assert runtime_builds(WARM_UP_MODEL)
    assert not runtime_builds(b"not a model")


def test_the_warm_up_registers_the_library_on_a_daemon_thread(repo_root):
    probe = (
        "import json, onnxruntime\n"
        "import ndp_ep.ep as ep\n"
        "thread = ep.warm_up()\n"
        "thread.join(120)\n"
        "listed = any(d.ep_name == ep.EP_NAME for d in onnxruntime.get_ep_devices())\n"
        "print(json.dumps([thread.daemon, thread.is_alive(), listed]))"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, False, True]


def test_ndp_ep_run_starts_the_warm_up_before_onnx_is_imported(repo_root, samples_dir):
    script = (
        "import contextlib, io, json, sys\n"
        "import ndp_ep.ep as ep\n"
        "seen = []\n"
        "original = ep.warm_up\n"
        "def recorded():\n"
        "    seen.append('onnx' in sys.modules)\n"
        "    return original()\n"
        "ep.warm_up = recorded\n"
        "from ndp_ep.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        f"    code = main(['run', {str(samples_dir / 'moe_block.onnx')!r}, '--inputs', "
        f"{str(samples_dir / 'moe_block.inputs.npz')!r}])\n"
        "print(json.dumps([code, seen]))"
    )
    env = dict(os.environ, PYTHONPATH=str(repo_root))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True)
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [0, [False]]


def test_a_failed_warm_up_leaves_the_library_error_to_the_command(repo_root, samples_dir, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(repo_root), NDP_EP_LIBRARY=str(tmp_path / "missing.so"))
    model = str(samples_dir / "moe_block.onnx")
    done = subprocess.run([sys.executable, "-m", "ndp_ep", "run", model], capture_output=True, text=True, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "missing.so is not a file" in done.stderr


@pytest.mark.parametrize(
    ("bogus_attribute", "expected"),
    [(True, "not a valid ONNX model: .*no_such_attribute"), (False, "report_ring must be a positive integer")],
    ids=["schema-check-first", "reports"],
)
def test_the_schema_check_error_still_comes_before_an_error_setting_up_the_reports(
    tmp_path, samples_dir, bogus_attribute, expected
):
    """The reports are set up before the converted model's schema check now (ONNX Runtime's thread cuts into
    Python, not into the check's long call into onnx): a model failing the check still reports the check's error."""
    from ndp_ep import NdpEpError

    path = _converted_block(tmp_path, samples_dir, bogus_attribute=bogus_attribute, unknown_operator=False)
    with pytest.raises(NdpEpError, match=f"^{expected}"):
        InferenceSession(path, report_ring=0)


def test_reading_a_model_leaves_the_writers_modules_unimported(repo_root, samples_dir):
    load = f"from graph_passes.model_io import load_model\nload_model({str(samples_dir / 'moe_block.onnx')!r})"
    assert _modules_after(load, repo_root, ("mmap", "queue")) == []
