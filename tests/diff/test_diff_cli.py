"""`ndp-ep diff` exit codes (0 equivalent, 1 different, 2 bad input), the JSON schema, text and HTML output."""

from __future__ import annotations

import json

import onnx
import pytest
from diff_sample_pairs import mlp_model, write_pair

from ndp_ep.cli import main

EXPECTED_EXIT = {"identical": 0, "renamed": 0, "one_node_changed": 1, "ndp_ep_rewrite": 1}

TOP_KEYS = {"schema", "equivalent", "models", "summary", "opsets", "io", "functions", "moe_blocks", "nodes"}
TOP_KEYS |= {"initializers", "regions"}
MODEL_KEYS = {"path", "ir_version", "producer", "opsets", "nodes", "initializers", "initializer_bytes"}
SUMMARY_KEYS = {"nodes", "initializers", "initializer_bytes", "moe_blocks", "regions", "hashed_bytes"}
NODE_REF_KEYS = {"index", "name", "op_type", "domain"}
NODE_KEYS = {"status", "a", "b", "match", "block", "changes"}
CHANGE_KEYS = {"field", "key", "a", "b"}
INIT_KEYS = {"status", "summary", "block", "basis", "a", "b", "a_bytes", "b_bytes"}
TENSOR_KEYS = {"name", "dtype", "shape", "bytes"}
BLOCK_KEYS = {"block", "node", "direction", "num_experts", "top_k", "shards", "hidden", "ffn", "activation"}
BLOCK_KEYS |= {"placement", "replaced_source", "replaced_nodes", "missing_replaced_nodes", "new_nodes", "initializers"}
BLOCK_KEYS |= {"contract_error"}
REGION_KEYS = {"index", "title", "block", "a_nodes", "b_nodes"}


@pytest.mark.parametrize("kind", sorted(EXPECTED_EXIT))
def test_exit_code_says_whether_the_graphs_are_equivalent(sample_pairs, kind, capsys):
    a, b = sample_pairs[kind]
    assert main(["diff", str(a), str(b)]) == EXPECTED_EXIT[kind]
    out = capsys.readouterr().out
    assert ("Result: EQUIVALENT" in out) == (EXPECTED_EXIT[kind] == 0)
    assert "\x1b[" not in out  # not a terminal: no colour


def _check_initializer(entry: dict) -> None:
    assert set(entry) == INIT_KEYS
    assert entry["a_bytes"] == sum(t["bytes"] for t in entry["a"])
    for tensor in entry["a"] + entry["b"]:
        assert set(tensor) == TENSOR_KEYS and all(isinstance(d, int) for d in tensor["shape"])


@pytest.mark.parametrize("kind", sorted(EXPECTED_EXIT))
def test_json_document_follows_schema_v1(sample_pairs, kind, capsys):
    a, b = sample_pairs[kind]
    code = main(["diff", "--json", str(a), str(b)])
    document = json.loads(capsys.readouterr().out)
    assert set(document) == TOP_KEYS and document["schema"] == "ndp-ep.diff/1"
    assert document["equivalent"] is (code == 0)
    for side in ("a", "b"):
        assert set(document["models"][side]) == MODEL_KEYS
    assert set(document["summary"]) == SUMMARY_KEYS
    assert set(document["summary"]["nodes"]) == {"unchanged", "renamed", "changed", "removed", "added"}
    assert sum(document["summary"]["nodes"].values()) >= document["models"]["a"]["nodes"]
    bytes_ = document["summary"]["initializer_bytes"]
    assert bytes_["delta"] == bytes_["b"] - bytes_["a"]
    for node in document["nodes"]:
        assert set(node) == NODE_KEYS
        assert all(ref is None or set(ref) == NODE_REF_KEYS for ref in (node["a"], node["b"]))
        assert all(set(change) == CHANGE_KEYS for change in node["changes"])
    for entry in document["initializers"]:
        _check_initializer(entry)
    for block in document["moe_blocks"]:
        assert set(block) == BLOCK_KEYS and set(block["node"]) == NODE_REF_KEYS
        for entry in block["initializers"]:
            _check_initializer(entry)
    for region in document["regions"]:
        assert set(region) == REGION_KEYS
    for opset in document["opsets"]:
        assert set(opset) == {"domain", "a", "b", "status"}


def test_json_of_rewrite_names_the_block_and_its_shards(sample_pairs, capsys):
    main(["diff", "--json", *map(str, sample_pairs["ndp_ep_rewrite"])])
    document = json.loads(capsys.readouterr().out)
    (block,) = document["moe_blocks"]
    assert (block["block"], block["num_experts"], block["top_k"], block["shards"]) == ("moe0", 4, 2, 2)
    split = [i for i in block["initializers"] if i["status"] == "split"]
    assert [len(i["b"]) for i in split] == [8, 8] and split[0]["basis"] == "name+size"
    assert document["opsets"] == [{"domain": "ndp_ep", "a": None, "b": 1, "status": "added"}]


def test_text_output_of_rewrite_reads_like_a_person_would_say_it(sample_pairs, capsys):
    main(["diff", *map(str, sample_pairs["ndp_ep_rewrite"])])
    out = capsys.readouterr().out
    assert "MoE blocks rewritten by ndp-ep (1)" in out
    assert "moe0: 10 nodes (" in out and "→ 1 ndp_ep::ShardedMoEExperts" in out and "Concat" not in out
    assert "experts 4 · top-k 2 · shards 2 · hidden 8 · ffn 4 · activation silu_glu" in out
    assert "experts gate_up [4, 8, 8] → 4 experts × 2 shards of [8, 4]" in out
    assert "placement: device ndp · units [0, 1]" in out
    assert "Opsets: + ndp_ep 1" in out


def test_color_always_paints_the_verdict(sample_pairs, capsys):
    main(["diff", "--color", "always", *map(str, sample_pairs["one_node_changed"])])
    assert "\x1b[31;1mDIFFERENT\x1b[0m" in capsys.readouterr().out


def test_bad_input_exits_2_with_one_line(tmp_path, capsys):
    good = tmp_path / "good.onnx"
    onnx.save(mlp_model(), good)
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00\xffnot a protobuf at all\x13\x37")
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")
    cases = [
        [str(tmp_path / "missing.onnx"), str(good)],
        [str(good), str(empty)],
        [str(garbage), str(good)],
        [str(good), str(tmp_path)],
    ]
    for args in cases:
        assert main(["diff", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("ndp-ep diff: error:") and "Traceback" not in err


def test_missing_external_data_file_is_bad_input(tmp_path, capsys):
    a, b = write_pair(tmp_path, "identical", external=True)
    (tmp_path / "identical_b.weights.bin").unlink()
    assert main(["diff", str(a), str(b)]) == 2
    assert "external data file 'identical_b.weights.bin'" in capsys.readouterr().err


def test_html_is_written_atomically_and_not_on_bad_input(sample_pairs, tmp_path, capsys):
    target = tmp_path / "report.html"
    assert main(["diff", "-q", "--html", str(target), *map(str, sample_pairs["ndp_ep_rewrite"])]) == 1
    assert capsys.readouterr().out == ""
    page = target.read_text(encoding="utf-8")
    assert page.count("<svg") >= 2 and 'id="summary"' in page and "ShardedMoEExperts" in page
    assert [p.name for p in tmp_path.iterdir()] == ["report.html"]
    missing = tmp_path / "nothere.html"
    assert main(["diff", "--html", str(missing), str(tmp_path / "x.onnx"), str(tmp_path / "y.onnx")]) == 2
    assert not missing.exists()


def test_process_exit_codes_as_a_user_sees_them(cli, sample_pairs, tmp_path):
    """The one subprocess smoke test of diff: exit codes and streams as a shell sees them."""
    identical = cli("diff", *map(str, sample_pairs["identical"]))
    changed = cli("diff", "--json", *map(str, sample_pairs["one_node_changed"]))
    missing = cli("diff", str(tmp_path / "nope.onnx"), str(sample_pairs["identical"][0]))
    assert (identical.returncode, changed.returncode, missing.returncode) == (0, 1, 2)
    assert json.loads(changed.stdout)["summary"]["nodes"]["changed"] == 1
    assert missing.stdout == "" and missing.stderr.count("\n") == 1 and "nope.onnx" in missing.stderr


def test_json_out_writes_the_same_document_as_json_on_stdout(sample_pairs, tmp_path, capsys):
    pair = [str(p) for p in sample_pairs["ndp_ep_rewrite"]]
    main(["diff", "--json", *pair])
    printed = capsys.readouterr().out
    target = tmp_path / "diff.json"
    assert main(["diff", "-q", "--json-out", str(target), *pair]) == 1
    assert capsys.readouterr().out == ""
    assert json.loads(target.read_text()) == json.loads(printed)


def test_html_names_the_provenance_in_plain_words(sample_pairs, tmp_path, capsys):
    target = tmp_path / "report.html"
    main(["diff", "-q", "--html", str(target), *map(str, sample_pairs["ndp_ep_rewrite"])])
    page = target.read_text(encoding="utf-8")
    assert "<th>replaced nodes</th><td>recorded by ndp-ep at conversion</td>" in page
    assert "replaced nodes from" not in page
