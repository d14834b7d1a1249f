"""Pass 5, *schedule*: the order tasks run in, and what follows from it.

Before lowering — :func:`order` takes the :class:`~.fused.Fused` protos and gives them in
dependency order (create-phase tasks first, then by reference order), and :func:`last_reads`
the rank of the last task that reads each materialised tensor (for in-place writes).

After lowering — :func:`finish` takes the lowered tasks and gives them covering every reference
node (a layout op by the first task that reads or writes through it) and costed
(FLOPs, bytes, roofline time, bound: :mod:`.cost`); :func:`arena` gives arena offsets by
liveness (first fit, 256-byte aligned: buffers whose lifetimes overlap never share bytes); and
:data:`GRAPH_MIN_TASKS` decides whether the program captures its run as a CUDA graph.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from typing import Iterable, Mapping, Sequence

from ..device import Ceilings
from .buffers import Tensors
from .cost import spec_cost
from ..kinds.elementwise import EwProto
from .fused import Fused
from .specs import ARENA_ALIGN, Buffer, Task

#: A run with at least this many tasks is captured as a CUDA graph (launch-bound otherwise).
GRAPH_MIN_TASKS = 2


def _reads(fused: Fused, idx: int) -> list[str]:
    pr = fused.protos[idx]
    reads = list(pr.ins)
    for nm in pr.reading_nodes:
        reads.extend(fused.index.nodes[nm].inputs)
    return reads


def order(fused: Fused, tensors: Tensors) -> list[int]:
    """Proto indices in the order their tasks run (see the module docstring)."""
    ix, protos = fused.index, fused.protos
    deps: dict[int, set[int]] = {}
    for i in range(len(protos)):
        d = set()
        for t in _reads(fused, i):
            for r in tensors.roots(t):
                j = tensors.materialized.get(r)
                if j is not None and j != i:
                    d.add(j)
        deps[i] = d
    prio = {i: max((ix.pos.get(n, 0.0) for n in pr.nodes), default=0.0) for i, pr in enumerate(protos)}
    for i, pr in enumerate(protos):
        if isinstance(pr, EwProto) and not pr.nodes:
            prio[i] = min((prio[j] for j in range(len(protos)) if i in deps[j]), default=prio[i]) - 0.25
    done: list[int] = []
    left = set(range(len(protos)))
    while left:
        ready = [i for i in left if deps[i] <= set(done)]
        if not ready:
            raise AssertionError(f"cyclic task dependencies in plan {ix.name}")
        # create-phase tasks first (they run at create), then by reference order
        i = min(ready, key=lambda k: (protos[k].phase != "create", prio[k], k))
        done.append(i)
        left.remove(i)
    return done


def last_reads(fused: Fused, tensors: Tensors, ranks: list[int]) -> dict[str, float]:
    """Root tensor -> rank (position in ``ranks``) of the last task that reads it; infinite
    for what a graph output is read through (it outlives the run)."""
    last: dict[str, float] = {}
    for rank, idx in enumerate(ranks):
        for t in _reads(fused, idx):
            for r in tensors.roots(t):
                last[r] = max(last.get(r, -1), rank)
    for t in fused.index.g.outputs:
        for r in tensors.roots(t):
            last[r] = math.inf
    return last


def cover_views(fused: Fused, tasks: Sequence[Task], touch: Mapping[str, frozenset[str]], tensors: Tensors,
                cats_in_place: Iterable[tuple[str, Sequence[str]]]) -> list[Task]:
    """Every reference node must be covered: a layout op by the first task that reads or
    writes a tensor through it; a cat written in place by the tasks that wrote its parts."""
    g = fused.index.g
    covered = {c for t in tasks for c in t.covers}
    extra: dict[int, list[str]] = defaultdict(list)
    by_out: dict[str, int] = {}
    for i, t in enumerate(tasks):
        for x in touch.get(t.name, ()):
            by_out.setdefault(x, i)
    for cat, parts in cats_in_place:
        for x in parts:
            for r in tensors.chain(x):
                i = by_out.get(r)
                if i is not None:
                    extra[i].append(cat)
                    break
        covered.add(cat)
    for n in g.nodes:
        if n.name in covered:
            continue
        hit = None
        for o in n.outputs:
            if o.name in by_out:
                hit = by_out[o.name]
                break
        if hit is None:
            # a layout op whose result nobody reads (a split's unused part): the reader of a sibling
            for x in n.inputs:
                if x in by_out:
                    hit = by_out[x]
                    break
        if hit is None and tasks:
            hit = 0
        if hit is not None:
            extra[hit].extend(fused.index.expand([n.name]))
    order_of = {nm: k for k, nm in enumerate(n.name for n in g.nodes)}
    out = []
    for i, t in enumerate(tasks):
        if extra.get(i):
            covers = list(t.covers)
            for c in extra[i]:
                if c not in covers:
                    covers.append(c)
            covers.sort(key=lambda c: order_of.get(c, 1e9))
            t = dataclasses.replace(t, covers=tuple(covers))
        out.append(t)
    return out


def finish(fused: Fused, tasks: Sequence[Task], touch: Mapping[str, frozenset[str]], ceil: Ceilings) -> list[Task]:
    """Costs, and covers for tasks that had none (layout copies)."""
    g = fused.index.g
    out = []
    for t in tasks:
        flops, nbytes, peak = spec_cost(t.params, ceil)
        ct = flops / peak if peak else 0.0
        mt = nbytes / ceil.bandwidth
        bound = "compute" if ct > mt else "memory"
        if not t.covers:
            tt = touch.get(t.name, frozenset())
            t = dataclasses.replace(t, covers=tuple(n.name for n in g.nodes if any(o.name in tt for o in n.outputs)))
        out.append(dataclasses.replace(t, flops=int(flops), bytes=int(nbytes), est_time_s=max(ct, mt),
                                       bound=bound))
    return out


def _align(n: int) -> int:
    return (n + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


def arena(tasks: list[Task], buffers: Mapping[str, Buffer]) -> dict[str, Buffer]:
    """First-fit offsets by liveness: a buffer lives from the first task that writes it to the
    last that reads it; buffers whose lifetimes overlap never share bytes."""
    life: dict[str, list[int]] = {}
    run = [t for t in tasks if t.phase == "run"]
    for i, t in enumerate(run):
        for b in t.inputs + t.outputs:
            if buffers[b].kind == "arena":
                lo_hi = life.setdefault(b, [i, i])
                lo_hi[0] = min(lo_hi[0], i)
                lo_hi[1] = max(lo_hi[1], i)
    placed: list[tuple[int, int, int, int]] = []  # (start, end, lo, hi)
    out: dict[str, Buffer] = {}
    for b in sorted(life, key=lambda x: (-buffers[x].nbytes, life[x][0])):
        size = _align(buffers[b].nbytes)
        lo, hi = life[b]
        clashes = sorted((s, e) for s, e, l2, h2 in placed if not (h2 < lo or hi < l2))
        off = 0
        for s, e in clashes:
            if off + size <= s:
                break
            off = max(off, e)
        placed.append((off, off + size, lo, hi))
        out[b] = dataclasses.replace(buffers[b], offset=off)
    return out


def arena_bytes(buffers: Iterable[Buffer]) -> int:
    return max((b.offset + _align(b.nbytes) for b in buffers if b.kind == "arena"), default=0)


__all__ = ["GRAPH_MIN_TASKS", "order", "last_reads", "cover_views", "finish", "arena", "arena_bytes"]

