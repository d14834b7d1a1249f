"""Pass 4, *place*: where each task could write its result so that no copy is needed.

Takes the :class:`~.fused.Fused` protos, the buffer table (:class:`~.buffers.Alloc`, which
already holds the program's inputs, weights and outputs) and :class:`~.buffers.Tensors`; gives
:class:`Targets`: for a tensor, the layout (a :class:`~stitchcuda.layout.View` into a graph
output's buffer, a ``cat``'s slot, or the layout a reader's kind asks for — a channels-last
convolution's input: :func:`stitchcuda.kinds.input_layouts`) its producer should write, traced back through the layout
ops (views, permutes, reshapes, squeezes) between them. *lower* takes a target when the task's
kernel can write that layout; otherwise it writes a fresh buffer and the layout becomes a copy.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Mapping

from .. import kinds
from .. import layout as L
from .. import ops
from ..ir import Node
from ..layout import View
from .buffers import Alloc, Tensors
from .fused import Fused

A = ops.A


@dataclass(frozen=True)
class Targets:
    """``view``: tensor -> the layout its producer should write; ``came_from``: tensor -> the
    downstream tensor whose target it was traced back from."""

    view: Mapping[str, View]
    came_from: Mapping[str, str]


def _inverse(n: Node, vy: View, xs: tuple[int, ...]) -> View | None:
    """The layout of layout op ``n``'s input that makes its output ``vy``, if strides can say it."""
    op = n.op
    if op in ops.TRANSPARENT:
        return vy
    if op == A + "permute.default":
        return L.permute(vy, L.inverse_permutation(n.attr("dims")))
    if op == A + "transpose.int":
        return L.transpose(vy, int(n.attr("dim0")), int(n.attr("dim1")))
    if op == A + "t.default":
        return L.transpose(vy, 0, 1) if vy.ndim == 2 else vy
    if op in ops.RESHAPES:
        return L.reshape(vy, xs)
    if op in (A + "unsqueeze.default", A + "squeeze.dims", A + "squeeze.dim", A + "squeeze.default"):
        return L.reshape(vy, xs)  # only size-1 dims differ: always expressible
    return None


def _chain_ends(fused: Fused, tensors: Tensors) -> set[str]:
    """Clone outputs whose layout-op chain reaches back to a run-phase task's result (not an
    input or weight, which would need a copy anyway)."""
    ix = fused.index
    ends = set()
    for n in ix.g.nodes:
        if n.op == A + "clone.default":
            x = n.inputs[0]
            while x not in tensors.materialized and x not in ix.inputs and x not in ix.weights:
                pn = ix.producer.get(x)
                if pn is None or ops.kind(pn.op) != "view":
                    break
                x = pn.inputs[0]
            if x in tensors.materialized and fused.protos[tensors.materialized[x]].phase == "run":
                ends.add(n.outputs[0].name)
    return ends


def targets(fused: Fused, alloc: Alloc, tensors: Tensors, storage_of) -> Targets:
    """Placement targets (see the module docstring); ``alloc`` gains the buffers of ``cat``
    results and of ``.contiguous()`` results that their producers write directly."""
    ix, g = fused.index, fused.index.g
    target: dict[str, View] = {}
    came_from: dict[str, str] = {}
    done: set[str] = set()
    ends: set[str] | None = None
    for i, t in enumerate(g.outputs):
        if t in done or t in ix.inputs or t in ix.weights:
            continue
        done.add(t)
        target[t] = L.contiguous(f"out{i}", g.spec(t).shape, g.spec(t).dtype)
    orders: dict[str, tuple[int, ...] | None] = {}

    def order_of(t: str) -> tuple[int, ...] | None:
        """The dim order tensor ``t``'s producer writes it in when nothing asks (through layout
        ops that keep it: none)."""
        if t not in orders:
            orders[t] = None  # a cycle cannot happen; this only ends the recursion early
            j = tensors.materialized.get(t)
            orders[t] = kinds.output_order(fused.protos[j], order_of) if j is not None else None
        return orders[t]

    for pr in fused.protos:
        for t, order in kinds.input_layouts(pr):
            # The layout a task wants its input in, written so by the input's producer.
            j = tensors.materialized.get(t)
            if t in target or j is None or fused.protos[j].phase != "run":
                continue
            s = ix.spec(t)
            target[t] = alloc.fresh(t, fused.tensor_storage(t, storage_of), s.shape, "run", order)
    later_cats: list[tuple[int, tuple[str, ...], View]] = []  # (dim, parts, target) of cats placed
    for n in reversed(g.nodes):
        if n.op == ops.CAT and n.name in fused.claimed:
            out = n.outputs[0].name
            dim = L.norm_dim(int(n.attr("dim") or 0), len(ix.shape(out)))
            parts = fused.protos[fused.claimed[n.name]].parts  # (without the legacy empty ones)
            if out not in target:
                if fused.protos[fused.claimed[n.name]].phase != "run":
                    continue
                wider = next((tv2 for d2, p2, tv2 in later_cats if d2 == dim and len(p2) > len(parts) and
                              tuple(p2[:len(parts)]) == tuple(parts)), None)
                if wider is not None:
                    # The same parts, first, of a later join (DenseNet's torch.cat(features) as the
                    # list grows): this join is the front of that one's buffer, each part written
                    # once for every join of the chain (lower_cat copies a part only where no
                    # earlier join did).
                    target[out] = L.slice_(wider, dim, 0, ix.shape(out)[dim])
                else:
                    # The cat's own buffer, so that its parts can be written into their slots (laid
                    # out as its parts are: channels-last parts join channels-last).
                    s = ix.spec(out)
                    target[out] = alloc.fresh(out, fused.tensor_storage(out, storage_of), s.shape, "run",
                                              order_of(out))
            tv = target[out]
            later_cats.append((dim, tuple(parts), tv))
            off = 0
            counts: dict[str, int] = defaultdict(int)
            for x in parts:
                counts[x] += 1
            for x in parts:
                size = ix.shape(x)[dim] if ix.shape(x) else 1
                if counts[x] == 1 and x not in target and x not in ix.inputs and x not in ix.weights:
                    target[x] = L.slice_(tv, dim, off, off + size)
                    came_from[x] = out
                off += size
            continue
        if ops.kind(n.op) != "view" or n.op in (A + "split_with_sizes.default", A + "split.Tensor"):
            continue
        y = n.outputs[0].name
        x = n.inputs[0]
        if y not in target and n.op == A + "clone.default" and n.attr("memory_format") == "contiguous_format":
            if ends is None:
                ends = _chain_ends(fused, tensors)
            if y in ends:
                # .contiguous(): let the producer write the contiguous layout directly.
                s = ix.spec(y)
                target[y] = alloc.fresh(y, storage_of(s.dtype), s.shape, "run")
        if y not in target or x in target or x in ix.inputs or x in ix.weights:
            continue
        inv = _inverse(n, target[y], ix.shape(n.inputs[0]))
        if inv is not None:
            target[x] = inv
            came_from[x] = y
    return Targets(target, came_from)


__all__ = ["Targets", "targets"]
