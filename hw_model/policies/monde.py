"""``monde``: the MoNDE baseline (DAC 2024)."""

from __future__ import annotations

from hw_model.policies.balanced import _Balanced


class Monde(_Balanced):
    name = "monde"
    role = "baseline"
    description = (
        "MoNDE: whole experts on their home unit; each invocation moves hot experts to the GPU, the hottest "
        "expert of the busiest DIMM first, as many as balance GPU and NDP time; no copy kept"
    )
    source = "MoNDE (DAC 2024, arXiv 2405.18832)"
