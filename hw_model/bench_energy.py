"""Energy of ``ndp-ep bench`` runs: the fields each record carries and the energy tables (markdown).

Each record (:func:`energy_fields`) gets ``energy_j`` (the whole request: prefill and decode, expert and non-expert
work, idle time at static power), ``prefill_j`` and ``decode_j``, ``joules_per_token`` (decode joules per generated
token: the figure an edge deployment's battery sees), ``prefill_j_per_token`` (per prompt token), ``avg_power_w``
(energy over the request's latency), ``moe_avg_power_w`` (the simulator's own accounting, which a power cap
bounds: the non-expert ops at static power only), ``edp_j_s`` (energy-delay product: ``energy_j x latency_s``),
the joules per resource (``energy_by_resource_j``) and the one that dominates. Hardware without energy tables gives
``None``s.
The model is :mod:`hw_model.energy`; the tables: :mod:`hw_model.bench_energy_tables`.
"""

from __future__ import annotations

from typing import Any

from hw_model.energy import EnergyReport

ENERGY_KEYS = ("energy_j", "prefill_j", "decode_j", "joules_per_token", "prefill_j_per_token", "avg_power_w", "edp_j_s")


def energy_fields(
    total: EnergyReport | None,
    prefill: EnergyReport | None,
    *,
    simulator: EnergyReport | None = None,
    latency_s: float,
    prompt_tokens: int,
    generated_tokens: int,
) -> dict[str, Any]:
    """The energy fields of one bench record: ``total`` over the whole request, ``prefill`` over its prefill;
    ``simulator`` is the simulator's own accounting (:meth:`~hw_model.simulator.MoESimulator.energy`: the MoE work,
    the non-expert time at static power only), whose average power a power cap bounds (``moe_avg_power_w``)."""
    if total is None or prefill is None:
        return {
            **dict.fromkeys(ENERGY_KEYS),
            "energy_by_resource_j": None,
            "energy_dominant": None,
            "moe_avg_power_w": None,
        }
    decode_j = total.total_j - prefill.total_j
    return {
        "energy_j": total.total_j,
        "prefill_j": prefill.total_j,
        "decode_j": decode_j,
        "joules_per_token": decode_j / max(1, generated_tokens),
        "prefill_j_per_token": prefill.total_j / max(1, prompt_tokens),
        "avg_power_w": total.total_j / latency_s if latency_s > 0 else 0.0,
        "edp_j_s": total.total_j * latency_s,
        "energy_by_resource_j": dict(total.by_resource_j),
        "gpu_idle_j": total.idle_j.get("gpu", 0.0),
        "energy_dominant": total.dominant,
        "moe_avg_power_w": simulator.avg_power_w if simulator is not None else None,
    }
