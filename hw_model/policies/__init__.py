"""Placement policies as objects behind one small protocol, found in one registry.

A policy is a :class:`Policy` subclass (:mod:`hw_model.policies.base`) in a module of its own in this package,
registered by the loop below; the simulator and ``bench`` find policies only through :func:`get_policy` /
:func:`policy_names`, so adding one touches its module and that loop. Each
declares its ``name``, ``role`` (``baseline``, ``ours``, ``ablation`` or ``bound``), whether it needs NDP
units, whether its NDP work is tensor-parallel, where expert weights live (``layout``), whether it keeps
experts resident in GPU memory, its source, and implements :meth:`Policy.place` over a per-run
:class:`PolicyState`.

=====================  ==============================================================================
``gpu-offload``        baseline (offloading systems, e.g. MoE-Infinity/ProMoE): every expert on the GPU;
                       the same dataset-free prefetcher as ours keeps experts resident, misses are copied
                       on demand into an LRU staging area (plain DIMMs, no NDP compute)
``ndp-expert-per-unit`` baseline: whole experts on NDP units, expert ``e`` on unit ``e mod N``; no GPU
``monde``              baseline, MoNDE (DAC 2024): whole experts on their home unit; each invocation moves
                       hot experts to the GPU, load-aware (the hottest expert of the busiest DIMM first),
                       as many as balance GPU and NDP time; no copy kept across invocations
``monde+cache``        ``monde`` keeping the experts it moves in an LRU GPU cache as large as our
                       residency budget; cached experts cost no copy and are considered first
``duplex``             baseline, Duplex-style (MICRO 2024): tensor parallelism inside the NDP device
                       (every expert sliced over all units); experts whose Op/B exceeds the NDP ridge point
                       run on the GPU (weights copied); no residency, no load-balancing scheduler
``tp``                 ablation: ``monde``'s GPU/NDP balancing rule with every NDP expert sliced over all
                       units (so ``tp`` vs ``monde`` isolates tensor parallelism; prefill uses the GPU)
``tp+lb``              ablation: tensor parallelism + the load-balancing packer (:mod:`hw_model.scheduler`)
``tp+lb+prefetch``     ours, complete: ``tp+lb`` + dataset-free prefetch (:mod:`hw_model.prefetch`)
``lower-bound``        bound: expert compute spread fractionally over the GPU and all NDP units with no
                       copies; the GPU side only for as many experts per layer as GPU memory holds
=====================  ==============================================================================

Weight layouts: ``sliced`` stores every expert as N column/row slices, slice ``u`` on unit ``u``, so a copy
to the GPU reads all N DIMMs in parallel; ``whole`` stores expert ``e`` on unit ``e mod N``, so its copy reads
one DIMM at that DIMM's channel bandwidth; ``host`` (plain DIMMs) interleaves weights over all DIMMs. Every
copy also takes DRAM time from the NDP cores of the DIMMs it reads (see :class:`ExpertCosts`).

Placements of ``tp+lb`` and ``tp+lb+prefetch`` are reused while the layer's exponentially smoothed
activation histogram stays within ``drift_threshold`` (L1) of the one the plan was made on; a reused plan
respects residency (resident active experts run on the GPU at no copy cost, others where the plan said); it is not
reused for an invocation that does not select every expert the plan copied (``replan_on_copies``).
"""

from __future__ import annotations

from hw_model.policies.balanced import load_aware_order
from hw_model.policies.base import LAYOUTS, ROLES, Policy, PolicyState, get_policy, policy_names, register
from hw_model.policies.drift import DriftTracker, numpy_row_sum, row_selector
from hw_model.policies.duplex import Duplex
from hw_model.policies.gpu_offload import GpuOffload
from hw_model.policies.lower_bound import LowerBound, gpu_expert_slots
from hw_model.policies.monde import Monde
from hw_model.policies.monde_cache import MondeCache
from hw_model.policies.ndp_expert_per_unit import NdpExpertPerUnit
from hw_model.policies.richer import richer_choices, richer_problem
from hw_model.policies.splitting import SPLIT_PARTS, choose_whole, split_choice, variable_degree_choice
from hw_model.policies.tp import TensorParallel
from hw_model.policies.tp_lb import TensorParallelLoadBalanced
from hw_model.policies.tp_lb_prefetch import Ours
from hw_model.policies.tp_lb_prefetch_lookahead import OursLookahead
from hw_model.policies.tp_lb_prefetch_split import OursSplit
from hw_model.policies.tp_lb_prefetch_vtp import OursVariableDegree
from hw_model.run_context import ExpertCosts, RunContext

# Registered here rather than with a class decorator: a decorated class would not compile to a native class with
# mypyc (see native/compile_hw_model.py). Registration order is the order ``policy_names`` lists them in.
for _policy_class in (
    GpuOffload,
    NdpExpertPerUnit,
    Monde,
    MondeCache,
    Duplex,
    TensorParallel,
    TensorParallelLoadBalanced,
    Ours,
    OursLookahead,
    OursSplit,
    OursVariableDegree,
    LowerBound,
):
    register(_policy_class)

POLICIES: tuple[str, ...] = policy_names()

__all__ = [
    "LAYOUTS",
    "POLICIES",
    "ROLES",
    "SPLIT_PARTS",
    "DriftTracker",
    "Duplex",
    "ExpertCosts",
    "GpuOffload",
    "LowerBound",
    "Monde",
    "MondeCache",
    "NdpExpertPerUnit",
    "Ours",
    "OursLookahead",
    "OursSplit",
    "OursVariableDegree",
    "Policy",
    "PolicyState",
    "RunContext",
    "TensorParallel",
    "TensorParallelLoadBalanced",
    "choose_whole",
    "get_policy",
    "gpu_expert_slots",
    "load_aware_order",
    "numpy_row_sum",
    "policy_names",
    "register",
    "richer_choices",
    "richer_problem",
    "row_selector",
    "split_choice",
    "variable_degree_choice",
]
