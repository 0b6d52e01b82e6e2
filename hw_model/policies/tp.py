"""``tp``: the tensor-parallelism-only ablation (MoNDE's rule, every NDP expert sliced over all units)."""

from __future__ import annotations

from hw_model.policies.balanced import _Balanced


class TensorParallel(_Balanced):
    name = "tp"
    role = "ablation"
    description = (
        "ours, tensor parallelism only: monde's GPU/NDP balancing rule, every NDP expert sliced over all units "
        "(gate/up by columns, down by rows), partial sums reduced"
    )
    source = "arXiv 2601.03992 (tensor parallelism across NDP-DIMMs)"
    tensor_parallel = True
    layout = "sliced"
