"""Plan: a captured Graph in, an ordered list of fused Tasks out — the deterministic Planner.

``plan(graph, policy, ceilings, constraints=...)`` runs the passes in order, each a module that
takes frozen values and gives frozen values:

1. :mod:`.rewrite` — library choices made on every graph (a pointwise convolution as a GEMM), and
   exact algebraic rewrites the constraints ask for (graph -> graph);
2. :mod:`.match` — *check* that every op is one the registry maps, then the task kinds' pattern
   rules (attention, RMS norm, logsumexp, tanh-GELU, batch / group norm) make one proto each;
3. :mod:`.fuse` — the kinds' node rules: reductions take their unary neighbours as hooks, GEMMs
   their epilogue chains, the remaining elementwise ops are grouped: every node is now in a proto
   (:class:`~.fused.Fused`);
4. :mod:`.place` — where a task could write its result so that no copy is needed;
5. :mod:`.schedule` (before) — the order tasks run in and when each tensor is last read;
6. :mod:`.lower` — each proto becomes tasks, by its kind, with specs over concrete layouts;
7. :mod:`.schedule` (after) — covering, costs (:mod:`.cost`), arena offsets, CUDA graph.

What a kind of task is — its claim rule, lowering, cost, interpreter and renderer — lives in one
module of :mod:`stitchcuda.kinds`; the passes here dispatch through that registry.

The result is a frozen, JSON-serialisable :class:`~.specs.Plan`; ``str(plan)`` is a readable
table. The planner never imports PyTorch.
"""

from __future__ import annotations

import dataclasses

from .. import layout as L
from .. import ops
from ..device import DEFAULT as _DEFAULT_CEILINGS
from ..device import H100, H200, Ceilings
from ..ir import Graph
from ..kinds import TaskSpec
from ..kinds.arg import ArgSpec
from ..kinds.attention import (ATTENTION_EFFICIENCY, ATTENTION_HEAD_DIMS, ATTENTION_MASK_CELL, GEMM_EFFICIENCY,
                               AttentionMaskBlocksSpec, AttentionSpec, attention_time)
from ..kinds.axis import AxisRowSpec, AxisSpec
from ..kinds.conv import ConvSpec
from ..kinds.copy import CopyItem, CopySpec
from ..kinds.elementwise import EwSpec
from ..kinds.gather import GatherSpec
from ..kinds.gemm import MAX_CHAIN, GemmSpec
from ..kinds import narrow_conv, norm_stream
from ..kinds.iota import IotaSpec
from ..kinds.norm import BnStatsSpec, GroupStatsSpec
from ..kinds.pool import PoolSpec
from ..kinds.recurrent import RecurrentSpec
from ..kinds.row import RowSpec
from ..kinds.scan import ScanSpec
from ..ops import EpOp, EwInstr
from ..precision import NAMES as POLICIES
from ..precision import get as get_policy
from . import buffers as _buffers
from . import place as _place
from . import schedule as _schedule
from .constraints import Choices, ConstraintError, Constraints, STRATEGIES
from .cost import node_cost
from .fuse import fuse
from .graph import GraphIndex
from .lower import lower
from .match import match
from .rewrite import REWRITES, apply_always, apply_rewrites
from .schedule import GRAPH_MIN_TASKS
from .specs import ARENA_ALIGN, GENERATOR, SCHEMA, Buffer, IOSpec, NodeCost, Plan, PlanError, Task

#: Kept for readers of older code: the one ceilings type.
DeviceCeilings = Ceilings


def plan(graph: Graph, policy: str = "fp32", ceilings: Ceilings | None = None, *, cuda_graph: bool | None = None,
         constraints: Constraints | None = None) -> Plan:
    """Plan ``graph`` under precision ``policy`` (fp32, tf32, bf16, fp16).

    ``ceilings`` (default :data:`stitchcuda.device.DEFAULT`) drive the cost model only.
    ``cuda_graph`` forces the graph-capture flag; by default a run of :data:`GRAPH_MIN_TASKS` or
    more tasks is captured. ``constraints`` (see :mod:`.constraints`) ask for per-node precision,
    fusion boundaries, strategies and rewrites; a constraint that does not fit the graph raises
    :class:`ConstraintError`. Raises :class:`PlanError` for operators or patterns the planner
    cannot map.
    """
    pol = get_policy(policy)
    ceil = ceilings or _DEFAULT_CEILINGS
    constraints = constraints or Constraints()
    if constraints:
        choices(graph).check(constraints)
    # The library choices' new nodes (<node>__rw<k>) stand for the reference node they came from;
    # the nodes of a rewrite the constraints asked for keep their own names (the loop reads them).
    reference_nodes = {n.name for n in graph.nodes}
    reference_order = {n.name: (i, n.op) for i, n in enumerate(graph.nodes)}
    several: dict[str, tuple[str, ...]] = {}  # a new node standing for several reference nodes
    graph = apply_always(graph, pol.tensor_cores, several)
    chosen = {n.name: n.name.rsplit("__rw", 1)[0] for n in graph.nodes if n.name not in reference_nodes}
    graph = apply_rewrites(graph, constraints.rewrites)
    ix = GraphIndex(graph)
    ix.synthetic_cover.update((n, [origin]) for n, origin in chosen.items() if origin in reference_nodes)
    for n, old in several.items():  # (to the node's heir where a later rewrite replaced it)
        for m in [n] if n in ix.nodes else [m for m, origin in chosen.items() if origin == n and m in ix.nodes]:
            ix.synthetic_cover[m] = list(dict.fromkeys(ix.synthetic_cover.get(m, []) + list(old)))
    fused = fuse(match(ix, pol.name, constraints, ceil), constraints, ceil)

    alloc = _buffers.Alloc(fused)
    tensors = _buffers.Tensors(fused)
    inputs, outputs, weights, views = _io_buffers(graph, alloc, pol)
    targets = _place.targets(fused, alloc, tensors, pol.storage_of)
    lowered = lower(fused, alloc, tensors, targets, _schedule.order(fused, tensors), views)
    tasks = _schedule.cover_views(fused, lowered.tasks, lowered.touched, tensors, lowered.cats_in_place)
    tasks = _schedule.finish(fused, tasks, lowered.touched, ceil)
    arena = _schedule.arena(tasks, alloc.buffers)
    used = {b for t in tasks for b in t.inputs + t.outputs}
    bufs = tuple(arena.get(b.name, b) for b in alloc.buffers.values()
                 if b.kind in ("input", "output", "weight") or b.name in used)
    run_tasks = [t for t in tasks if t.phase == "run"]
    graphed = cuda_graph if cuda_graph is not None else len(run_tasks) >= GRAPH_MIN_TASKS
    notes = list(fused.notes)
    if graphed:
        notes.append("the run is captured as a CUDA graph on its second call with the same stream and "
                     "buffers, and replayed after that")

    # One cost per reference node: a rewrite's new nodes count towards the node they came from.
    merged: dict[str, NodeCost] = {}
    for n in graph.nodes:
        c = node_cost(n, ix, pol.name, ceil)
        stands_for = ix.expand([n.name])
        name = n.name if n.name in stands_for else stands_for[0]
        prev = merged.get(name)
        if prev is not None:  # the op named is the one of the node that kept the reference's name
            c = NodeCost(name, c.op if n.name == name else prev.op, prev.flops + c.flops, prev.bytes + c.bytes,
                         prev.time_s + c.time_s, max((prev, c), key=lambda x: x.time_s).bound)
        merged[name] = dataclasses.replace(c, node=name)
        for other in stands_for:  # the other nodes it stands for (views it absorbed): no cost of their own
            if other != name and other in reference_order and other not in merged:
                merged[other] = NodeCost(other, reference_order[other][1], 0, 0, 0.0, c.bound)
    # (in the reference's order: a rewrite may put the node standing for several where the last was)
    node_costs = tuple(sorted(merged.values(), key=lambda c: reference_order.get(c.node, (len(reference_order),))[0]))
    return Plan(name=graph.name, policy=pol.name, ceilings=ceil, inputs=tuple(inputs), outputs=tuple(outputs),
                weights=tuple(weights), buffers=bufs, tasks=tuple(tasks), node_costs=node_costs,
                arena_bytes=_schedule.arena_bytes(bufs), cuda_graph=bool(graphed), notes=tuple(notes),
                constraints=constraints)


def _io_buffers(graph: Graph, alloc: _buffers.Alloc, pol):
    """The program's inputs, weights (converted to the policy's storage at create) and outputs,
    and the layouts of the inputs and weights."""
    inputs, outputs, weights = [], [], []
    views = {}
    used_names: set[str] = set()
    for i, s in enumerate(graph.inputs):
        alloc.new_buffer(f"in{i}", "input", s.dtype, s.shape, index=i, source=s.name)
        views[s.name] = L.contiguous(f"in{i}", s.shape, s.dtype)
        inputs.append(IOSpec(s.name, s.dtype, s.shape, s.name))
        used_names.add(s.name)
    for i, s in enumerate(graph.weights):
        dt = pol.storage_of(s.dtype)
        alloc.new_buffer(f"w{i}", "weight", dt, s.shape, index=i, source=s.name,
                         source_dtype=s.dtype if dt != s.dtype else "")
        views[s.name] = L.contiguous(f"w{i}", s.shape, dt)
        weights.append(IOSpec(s.name, s.dtype, s.shape, s.name))
        used_names.add(s.name)
    for i, t in enumerate(graph.outputs):
        s = graph.spec(t)
        name = t if t not in used_names else f"output{i}"
        while name in used_names:
            name += "_"
        used_names.add(name)
        alloc.new_buffer(f"out{i}", "output", s.dtype, s.shape, index=i, source=t)
        outputs.append(IOSpec(name, s.dtype, s.shape, t))
    return inputs, outputs, weights, views


def choices(graph: Graph) -> Choices:
    """What may be constrained when planning ``graph``: its nodes, the strategy options of the
    nodes the planner decides something about, and the rewrites that apply."""
    strat = []
    for n in graph.nodes:
        if n.op in (ops.A + "_softmax.default", ops.SDPA):
            strat.append((n.name, STRATEGIES["attention"]))
        if ops.kind(n.op) == "row" and n.op != ops.A + "_softmax.default":
            strat.append((n.name, STRATEGIES["row"]))
        elif n.op in (ops.A + "rsqrt.default", ops.A + "sqrt.default"):
            strat.append((n.name, STRATEGIES["row"]))
        elif ops.kind(n.op) == "conv":
            strat.append((n.name, STRATEGIES["narrow_conv" if narrow_conv.narrow(graph, n) else "conv"]))
        elif ops.kind(n.op) == "gemm":
            strat.append((n.name, STRATEGIES["gemm"]))
        elif norm_stream.rows_of(graph, n) is not None:
            strat.append((n.name, STRATEGIES["norm"]))
    # a rewrite the constraints ask for is applied after the library choices (:func:`plan`), which
    # can make its place: a per-feature subtract folded into a linear's bias leaves the linear read
    # by the mean after it (KernelBench 2:51) — so where it applies is asked of that graph too,
    # under either kind of policy
    after = [apply_always(graph, tensor_cores) for tensor_cores in (False, True)]
    applicable = tuple(name for name, rw in REWRITES.items() if any(rw.applies(g) for g in [graph, *after]))
    return Choices(tuple(n.name for n in graph.nodes), tuple(strat), applicable)


__all__ = [
    "SCHEMA", "GENERATOR", "POLICIES", "ARENA_ALIGN", "ATTENTION_HEAD_DIMS", "ATTENTION_MASK_CELL",
    "ATTENTION_EFFICIENCY", "GEMM_EFFICIENCY", "MAX_CHAIN", "GRAPH_MIN_TASKS", "Ceilings", "DeviceCeilings", "H100",
    "H200", "EwInstr", "EpOp", "GemmSpec", "EwSpec", "RowSpec", "AxisSpec", "AxisRowSpec", "AttentionSpec",
    "AttentionMaskBlocksSpec",
    "attention_time", "CopyItem", "CopySpec", "BnStatsSpec", "GroupStatsSpec", "PoolSpec", "ScanSpec", "ArgSpec",
    "GatherSpec", "IotaSpec", "ConvSpec", "RecurrentSpec", "TaskSpec", "Buffer", "Task", "NodeCost", "IOSpec", "Plan",
    "PlanError", "Constraints", "ConstraintError", "Choices", "plan", "choices",
]
