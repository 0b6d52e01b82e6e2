"""``ndp-ep generate`` explains tokens that differ from the reference's: where, by how much, and whether it is a near
tie (exit 3) or a real divergence (exit 1), on stderr and in ``--json``; a non-zero exit is never silent.

The classifier is checked on logits built by hand; the command end to end on the GPT-OSS fixture against a reference
copy whose lm_head was edited so that the reference's tokens leave the provider's at a known step: a column made
equal to the top token's (an exact tie, which the reference's argmax resolves to the lower index: a near tie), or
twice it (a clear margin: a real divergence).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from ndp_ep.divergence import EXIT_NEAR_TIE, NOISE_FLOOR_ULPS, Divergence, classify, first_difference

FIXTURE = Path(__file__).resolve().parents[2] / "sample_models" / "genai" / "gpt_oss_fp32"


def _logits(values: dict[int, float], size: int = 10) -> np.ndarray:
    logits = np.full(size, -5.0)
    for index, value in values.items():
        logits[index] = value
    return logits


def test_first_difference_is_the_first_unequal_step_or_where_one_sequence_ends():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 9, 3]) == 1
    assert first_difference([1, 2, 3], [1, 2]) == 2
    assert first_difference([], []) is None


def test_a_margin_within_stock_noise_is_a_near_tie():
    reference = _logits({3: 2.000, 7: 1.998})  # top-1 token 3, margin 0.002
    provider = _logits({3: 1.997, 7: 1.999})  # the provider's error (0.003) flips them
    alternate = _logits({3: 2.001, 7: 1.9975})  # stock with other threads: still token 3, noise 0.001...
    alternate[5] = -5.004  # ... and 0.004 elsewhere: the noise is the largest difference
    d = classify(4, 20, 7, reference, provider, alternate, alternate_threads=1)
    assert (d.reference_token, d.provider_token, d.alternate_token) == (3, 7, 3)
    assert d.reference_margin == pytest.approx(0.002)
    assert d.provider_error == pytest.approx(0.003)
    assert d.reference_noise == pytest.approx(0.004)
    assert d.reference_stable and d.near_tie and d.exit_code == EXIT_NEAR_TIE == 3
    message = d.message()
    assert "from step 5 of 20" in message and "near tie" in message and "within that noise" in message
    assert "0.002" in message and "0.003" in message and "0.004" in message


def test_a_reference_that_flips_with_another_thread_count_is_a_near_tie_whatever_the_noise_elsewhere():
    reference = _logits({3: 2.0, 7: 1.9})
    provider = _logits({3: 1.8, 7: 1.9})
    alternate = _logits({3: 1.89, 7: 1.9})  # stock itself picks 7 with other threads
    d = classify(0, 8, 7, reference, provider, alternate, alternate_threads=2)
    assert not d.reference_stable and d.near_tie and d.exit_code == 3
    assert "not stable" in d.message() and "token 7" in d.message() and "2 intra-op threads" in d.message()


def test_a_margin_above_stock_noise_is_a_real_divergence():
    reference = _logits({3: 2.0, 7: 1.5})  # margin 0.5
    provider = _logits({3: 1.4, 7: 1.5})  # error 0.6
    alternate = reference.copy()
    alternate[3] += 1e-6
    d = classify(2, 10, 7, reference, provider, alternate, alternate_threads=1)
    assert d.reference_stable and not d.near_tie and d.exit_code == 1
    assert d.reference_margin == pytest.approx(0.5) and d.provider_error == pytest.approx(0.6)
    message = d.message()
    assert "exceeds that noise" in message and "600000.0x stock's" in message.replace(",", "")


def test_an_exact_tie_is_a_near_tie_even_where_stock_shows_no_noise():
    reference = _logits({3: 2.0, 7: 2.0})  # argmax picks 3, the lower index
    provider = _logits({3: 2.0, 7: 2.0 + 1e-7})
    d = classify(1, 3, 7, reference, provider, reference.copy(), alternate_threads=1)
    assert d.reference_noise == 0.0 and d.reference_margin == 0.0
    assert d.noise_floor == NOISE_FLOOR_ULPS * float(np.spacing(np.float32(5.0)))
    assert d.near_tie and d.exit_code == 3


def test_the_json_form_carries_every_number_and_the_verdict():
    d = classify(0, 4, 1, _logits({0: 1.0, 1: 0.5}), _logits({0: 0.4, 1: 0.5}), _logits({0: 1.0, 1: 0.5}), 1)
    data = d.to_json()
    assert data["step"] == 0 and data["provider_token"] == 1 and data["reference_token"] == 0
    assert data["near_tie"] is False and data["reference_stable"] is True
    assert data["reference_margin"] == pytest.approx(0.5) and data["provider_logit_error"] == pytest.approx(0.6)
    json.dumps(data)  # plain JSON


def test_logits_of_different_sizes_and_impossible_steps_are_refused():
    with pytest.raises(ValueError, match="different sizes"):
        classify(0, 2, 1, np.zeros(4), np.zeros(5), np.zeros(4), 1)
    with pytest.raises(ValueError, match="outside"):
        Divergence(5, 3, 0, 1, 0.1, 0.1, 0.1, 0.0, 1, 0)


# -- end to end: the GPT-OSS fixture against an edited reference -------------------------------------------------


def _reference_with_column(tmp_path: Path, make) -> tuple[Path, int, int]:
    """A copy of the fixture whose lm_head column b = 0 is ``make(W[:, a])``, a being the fixture's first generated
    token (tests check it is); returns the copy, a and b."""
    import onnx
    from onnx import numpy_helper

    folder = tmp_path / "reference"
    shutil.copytree(FIXTURE, folder)
    model = onnx.load(str(folder / "model.onnx"))
    weight = next(t for t in model.graph.initializer if t.name == "lm_head.MatMul.weight")
    w = numpy_helper.to_array(weight).copy()
    assert w.shape == (64, 100)
    a = 86  # the fixture's first generated token for the seed-0 prompt of 8 tokens (checked below)
    b = 0
    w[:, b] = make(w[:, a])
    weight.CopyFrom(numpy_helper.from_array(w, weight.name))
    (folder / "model.onnx.data").unlink()
    onnx.save(model, str(folder / "model.onnx"), save_as_external_data=True, location="model.onnx.data")
    return folder, a, b


def _generate_against(reference: Path, capsys) -> tuple[int, dict, str]:
    from ndp_ep.cli import main

    capsys.readouterr()
    code = main(["generate", str(FIXTURE), "--reference", str(reference), "--prompt-tokens", "8",
                 "--new-tokens", "6", "--json"])  # fmt: skip
    done = capsys.readouterr()
    return code, json.loads(done.out), done.err


def test_a_flip_on_an_exact_tie_in_the_reference_exits_3_and_says_near_tie(tmp_path, capsys):
    pytest.importorskip("onnxruntime_genai")
    reference, a, b = _reference_with_column(tmp_path, lambda column: column)
    code, data, err = _generate_against(reference, capsys)
    assert data["tokens"][0] == a  # the provider on the unedited model
    assert code == 3, err
    divergence = data["divergence"]
    assert divergence["step"] == 0 and divergence["provider_token"] == a and divergence["reference_token"] == b
    assert divergence["reference_margin"] == 0.0 and divergence["near_tie"] is True
    assert divergence["reference_stable"] is True  # the tie resolves the same way with other threads
    (line,) = err.strip().splitlines()
    assert line.startswith("ndp-ep generate: warning: the tokens differ from the reference's from step 1 of 6")
    assert "near tie" in line and "(exit 3)" in line
    assert data["reference_tokens_identical"] is False


def test_a_real_divergence_exits_1_with_the_numbers_on_stderr(tmp_path, capsys):
    pytest.importorskip("onnxruntime_genai")
    reference, a, b = _reference_with_column(tmp_path, lambda column: 2 * column)
    code, data, err = _generate_against(reference, capsys)
    assert data["tokens"][0] == a
    assert code == 1, err
    divergence = data["divergence"]
    assert divergence["step"] == 0 and divergence["reference_token"] == b and divergence["near_tie"] is False
    assert divergence["reference_margin"] > 100 * divergence["reference_noise"]
    assert divergence["provider_logit_error"] >= divergence["reference_margin"]
    (line,) = err.strip().splitlines()
    assert line.startswith("ndp-ep generate: error: the tokens differ from the reference's from step 1 of 6")
    assert "exceeds that noise" in line
