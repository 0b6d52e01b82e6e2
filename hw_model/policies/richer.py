"""The richer placement problem of one invocation and the decisions of ours and of the split and
variable-degree extensions as its choices (for :func:`hw_model.oracles.solve_exact_modes`; used by the
tests and ``benchmarks/bench_scheduler.py``, not by the simulator)."""

from __future__ import annotations

import numpy as np

from hw_model.layout import InvocationLayout
from hw_model.oracles import ItemMode
from hw_model.policies.packing import _placement_problem
from hw_model.policies.splitting import SPLIT_PARTS, _split_mode, split_choice, variable_degree_choice
from hw_model.policies.tp_lb_prefetch import Ours
from hw_model.policies.tp_lb_prefetch_split import OursSplit
from hw_model.policies.tp_lb_prefetch_vtp import OursVariableDegree
from hw_model.run_context import RunContext
from hw_model.scheduler import PlacementProblem, pack


def richer_problem(
    ctx: RunContext, out: InvocationLayout, resident: list[bool]
) -> tuple[PlacementProblem, list[ItemMode]]:
    """The richer placement problem of the invocation ``out`` (``resident[i]``: active expert ``i`` on the GPU
    already), for :func:`hw_model.oracles.solve_exact_modes`: every active expert on the GPU, sliced over all
    units (the problem), whole on its home unit (the first mode, :func:`variable_degree_choice`'s alternative) or
    with 1/k of its FFN columns on the GPU and the rest sliced (one mode per k in :data:`SPLIT_PARTS`, as
    :func:`split_choice` splits one expert)."""
    active, tokens = out.active, out.active_tokens
    problem = _placement_problem(ctx, out, out.item_arrays(active, tokens, resident))
    whole = out.item_arrays(active, tokens, resident, [True] * len(active))
    modes = [ItemMode(whole["ndp"], dram_s=whole["dram"])]
    modes += [_split_mode(out, tokens, k) for k in SPLIT_PARTS]
    return problem, modes


def richer_choices(
    ctx: RunContext, out: InvocationLayout, resident: list[bool], problem: PlacementProblem
) -> dict[str, np.ndarray]:
    """The decisions of ours and of the variable-degree and split extensions for the invocation ``out``, as choices
    of its :func:`richer_problem` ``problem`` (per active expert: ``-1`` the GPU, ``0`` sliced, ``1`` whole on its
    home unit, ``k`` >= 2 split with 1/k on the GPU), by policy name."""
    packed = pack(problem)
    ours = np.where(packed, -1, 0)
    on_gpu, whole = variable_degree_choice(ctx, out, resident)
    split = ours.copy()
    chosen = split_choice(ctx, out, resident, packed)
    if chosen is not None:
        split[chosen[0]] = chosen[1]  # richer_problem's modes: whole first, then k = 2, 3, ...: mode k is 1/k
    return {
        Ours.name: ours,
        OursVariableDegree.name: np.where(on_gpu, -1, np.where(whole, 1, 0)),
        OursSplit.name: split,
    }
