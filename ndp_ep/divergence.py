"""Why generated tokens differ from the reference's: the first diverging step, measured and classified.

``ndp-ep generate`` compares its greedy tokens with ONNX Runtime GenAI's without the provider (the reference). Up
to the first step where they differ both saw the same tokens, so their logits at that step are comparable. There:

- the reference's margin: its top-1 minus its top-2 logit (how close the reference was to picking another token);
- the provider's logit error: ``max |provider - reference|`` over the vocabulary;
- stock ONNX Runtime's own numerical noise: the reference replayed with another intra-op thread count (its
  matrix products then split, and round, differently), ``max |reference - that|``, and whether that run picks the
  reference's token too (the reference is *stable* at that step) or not.

A divergence is a **near tie** when the reference is not stable at that step, or its margin is within that noise
(never below a floor of :data:`NOISE_FLOOR_ULPS` float32 units in the last place of the largest logit, so an exact
tie is one): a flip any float32 computation of the model may make, stock ONNX Runtime's included. Otherwise it is a
**real divergence**: the provider's error moved a logit further than stock ONNX Runtime's own rounding does.
``ndp-ep generate`` exits 3 for the first, 1 for the second, and says which on stderr either way (docs/cli.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

NOISE_FLOOR_ULPS = 8  # float32 units in the last place of the largest |logit|: an exact tie is a near tie
EXIT_NEAR_TIE = 3  # ndp-ep generate's exit code for tokens that differ on a near tie (1: a real divergence)


def first_difference(reference: list[int], tokens: list[int]) -> int | None:
    """The first step whose tokens differ (or where one sequence ends before the other), or None."""
    for step, (a, b) in enumerate(zip(reference, tokens, strict=False)):
        if a != b:
            return step
    return None if len(reference) == len(tokens) else min(len(reference), len(tokens))


def _top_two(logits: np.ndarray) -> tuple[int, float, float]:
    """The top-1 index (the lowest index among equal maxima, as argmax picks), its logit and the runner-up's."""
    top = int(np.argmax(logits))
    rest = np.delete(logits, top)
    return top, float(logits[top]), float(rest.max()) if rest.size else float("-inf")


@dataclass(frozen=True)
class Divergence:
    """The first step where the provider's tokens leave the reference's, and what the logits there say."""

    step: int  # 0-based index of the first differing generated token
    steps: int  # tokens generated
    reference_token: int
    provider_token: int
    reference_margin: float  # the reference's top-1 minus top-2 logit at that step
    provider_error: float  # max |provider - reference| logit there
    reference_noise: float  # max |reference - reference with alternate_threads| there
    noise_floor: float  # NOISE_FLOOR_ULPS float32 ulps of the largest |reference logit| there
    alternate_threads: int  # the intra-op thread count of the reference's replay
    alternate_token: int  # the token that replay picks

    def __post_init__(self) -> None:
        if not 0 <= self.step < max(self.steps, 1):
            raise ValueError(f"divergence step {self.step} outside the {self.steps} generated tokens")
        for name in ("reference_margin", "provider_error", "reference_noise", "noise_floor"):
            if not getattr(self, name) >= 0.0:
                raise ValueError(f"{name} must be a non-negative number, got {getattr(self, name)!r}")

    @property
    def reference_stable(self) -> bool:
        """The reference picks the same token at this step with another intra-op thread count."""
        return self.alternate_token == self.reference_token

    @property
    def near_tie(self) -> bool:
        return not self.reference_stable or self.reference_margin <= max(self.reference_noise, self.noise_floor)

    @property
    def exit_code(self) -> int:
        return EXIT_NEAR_TIE if self.near_tie else 1

    def message(self) -> str:
        """One line saying where the tokens part and why (the CLI prefixes it)."""
        where = (
            f"the tokens differ from the reference's from step {self.step + 1} of {self.steps} (token "
            f"{self.provider_token} instead of {self.reference_token})"
        )
        numbers = (
            f"the reference's top-1/top-2 logit margin there is {self.reference_margin:.3g}, the provider's logit "
            f"error {self.provider_error:.3g}, stock ONNX Runtime's own noise {self.reference_noise:.3g} "
            f"(the reference replayed with {self.alternate_threads} intra-op thread"
            f"{'' if self.alternate_threads == 1 else 's'}, which picks "
            f"{'the same token' if self.reference_stable else f'token {self.alternate_token}'})"
        )
        if self.near_tie:
            why = (
                "the reference itself is not stable at that step"
                if not self.reference_stable
                else "the margin is within that noise"
            )
            return f"{where} on a near tie: {numbers}; {why} (exit {EXIT_NEAR_TIE})"
        ratio = self.provider_error / self.reference_noise if self.reference_noise > 0 else float("inf")
        times = f"{ratio:.1f}x" if np.isfinite(ratio) else "while stock's own is 0"
        return (
            f"{where}: {numbers}; the margin exceeds that noise, so the provider's error ({times} stock's) "
            f"changed a token stock ONNX Runtime keeps"
        )

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "steps": self.steps,
            "reference_token": self.reference_token,
            "provider_token": self.provider_token,
            "reference_margin": self.reference_margin,
            "provider_logit_error": self.provider_error,
            "reference_noise": self.reference_noise,
            "noise_floor": self.noise_floor,
            "alternate_threads": self.alternate_threads,
            "alternate_token": self.alternate_token,
            "reference_stable": self.reference_stable,
            "near_tie": self.near_tie,
        }


def classify(
    step: int,
    steps: int,
    provider_token: int,
    reference_logits: np.ndarray,
    provider_logits: np.ndarray,
    alternate_logits: np.ndarray,
    alternate_threads: int,
) -> Divergence:
    """The :class:`Divergence` at ``step`` from the three runs' logits there (each a vector over the vocabulary:
    the reference's, the provider's, the reference replayed with ``alternate_threads``)."""
    reference = np.asarray(reference_logits, np.float64).reshape(-1)
    provider = np.asarray(provider_logits, np.float64).reshape(-1)
    alternate = np.asarray(alternate_logits, np.float64).reshape(-1)
    if not reference.size or reference.shape != provider.shape or reference.shape != alternate.shape:
        raise ValueError(
            f"logits of different sizes: reference {reference.size}, provider {provider.size}, "
            f"alternate {alternate.size}"
        )
    top, best, second = _top_two(reference)
    scale = float(np.max(np.abs(reference)))
    return Divergence(
        step=step,
        steps=steps,
        reference_token=top,
        provider_token=provider_token,
        reference_margin=best - second if np.isfinite(second) else float("inf"),
        provider_error=float(np.max(np.abs(provider - reference))),
        reference_noise=float(np.max(np.abs(alternate - reference))),
        noise_floor=NOISE_FLOOR_ULPS * float(np.spacing(np.float32(scale))),
        alternate_threads=alternate_threads,
        alternate_token=int(np.argmax(alternate)),
    )


def alternate_thread_count(config: dict) -> int:
    """Another intra-op thread count than the reference's (the config's, or ONNX Runtime's default, one per core):
    1, or 2 where the reference runs on one thread."""
    options = config["model"]["decoder"].get("session_options") or {}
    threads = options.get("intra_op_num_threads") if isinstance(options, dict) else None
    if not isinstance(threads, int) or isinstance(threads, bool) or threads < 1:
        threads = os.cpu_count() or 1
    return 2 if threads == 1 else 1


def replay_logits(
    og, folder: Path, config: dict, prompt: list[int], forced: list[int], max_length: int, threads: int | None
) -> np.ndarray:
    """The logits GenAI without the provider computes after ``prompt`` and then ``forced`` (one token a step, as
    greedy generation appends them) in ``folder``, with ``threads`` intra-op threads (None: the config's)."""
    settings = og.Config(str(folder))
    session_options: dict = {"log_severity_level": 4}
    if threads is not None:
        session_options["intra_op_num_threads"] = threads
    settings.overlay(json.dumps({"model": {"decoder": {"session_options": session_options}}}))
    settings.clear_providers()
    model = og.Model(settings)
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray(prompt, dtype=np.int32))
    for token in forced:
        generator.append_tokens(np.asarray([token], dtype=np.int32))
    return np.array(generator.get_logits(), dtype=np.float64).reshape(-1)
