"""Copies: ``cat``, slice assignments (``slice_scatter`` / ``select_scatter``) and the layout copies
the planner inserts, through elementwise.cuh's strided copy.

Claim: every free ``cat`` (a copy of each part into its slot, or nothing when every part's
producer wrote its slot in place), then every slice assignment (``out`` = ``x`` with a slice
replaced by ``src``: two copies, the first skipped when out is written over x in place).
Lowering also serves every other kind: :func:`copy_item` is the one way to describe a copy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..layout import View
from . import cxx
from .base import ClaimRule, Proto, TaskKind, view_bytes


@dataclass(frozen=True)
class CopyItem:
    """dst = src (with dtype conversion) over ``shape``, strides after coalescing."""

    src: View
    dst: View
    shape: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]


@dataclass(frozen=True)
class CopySpec:
    """One or more strided copies (elementwise.cuh's launch_strided_copy)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "copy")

    kind: str
    items: tuple[CopyItem, ...]


@dataclass(frozen=True)
class CatProto(Proto):
    dim: int = 0
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScatterProto(Proto):
    """``out`` = ``x`` with the slice ``node`` names (slice_scatter / select_scatter) replaced by
    ``src``: two copies, the first skipped when out is written over x in place."""

    node: str = ""
    x: str = ""
    src: str = ""
    out: str = ""


def copy_item(src: View, dst: View) -> CopyItem:
    """The copy of ``src`` into ``dst`` (same shape), its dims coalesced."""
    if src.shape != dst.shape:
        raise AssertionError(f"copy of {src.shape} into {dst.shape}")
    shape, (ss, ds) = L.coalesce(src.shape, src.strides, dst.strides)
    if len(shape) > 6:
        raise AssertionError("copy with more than 6 dims after coalescing")
    return CopyItem(src, dst, shape, ss, ds)


# ---------------------------------------------------------------------- claim


def claim_cat(cx) -> None:
    for n in list(cx.ix.g.nodes):
        if n.op == ops.CAT and cx.free(n):
            rank = len(n.outputs[0].shape)
            dim = L.norm_dim(int(n.attr("dim") or 0), rank)
            # PyTorch's cat skips 1-d empty tensors (its legacy behaviour) whatever the rank of the others.
            parts = tuple(x for x in n.inputs if rank == 1 or cx.ix.shape(x) != (0,))
            # a join of weights alone (merge_sibling_linears' joined weights) is made once, at create
            # (of weights themselves: a tensor computed from weights may be a run-time task's result,
            # RoPE's angles in Qwen2, which a create-time task cannot read)
            phase = "create" if all(x in cx.ix.weights for x in n.inputs) else "run"
            cx.claim(CatProto(n.name, (n.name,), (n.outputs[0].name,), tuple(n.inputs), phase, dim=dim,
                              parts=parts))


def claim_scatter(cx) -> None:
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "scatter" and cx.free(n):
            x, src = n.inputs[0], n.inputs[1]
            cx.claim(ScatterProto(cx.name([n.name]), (n.name,), (n.outputs[0].name,), (x, src), node=n.name, x=x,
                                  src=src, out=n.outputs[0].name))


# ---------------------------------------------------------------------- lower


def lower_cat(lw, pr: CatProto, pre: list) -> None:
    out_t = pr.outs[0]
    # Channels-last parts join into a channels-last result (each part's slot a strided copy).
    parts = [lw.views.get(x) for x in pr.parts]
    order = L.channels_last_order(len(lw.shape(out_t))) if any(v is not None and L.is_channels_last(v)
                                                                 for v in parts) else None
    vo = lw.out_view(pr, out_t, lambda tv: True, order=order)
    dim = pr.dim
    off = 0
    items = []
    reads = []
    for x in pr.parts:
        size = lw.shape(x)[dim] if lw.shape(x) else 1
        dst = L.slice_(vo, dim, off, off + size)
        off += size
        vx = lw.read(x, pre, pr.phase)
        if _same_place(vx, dst):
            continue  # its producer wrote it in place
        if any(_same_place(v, dst) for v in lw.joined.get(x, ())):
            continue  # an earlier join of the chain (placement: the front of this one) copied it there
        items.append(copy_item(vx, dst))
        reads.append(vx)
        lw.joined.setdefault(x, []).append(dst)
    if items:
        lw.add(pr, pr.name, CopySpec("copy", tuple(items)), reads, [vo], touched=list(pr.ins) + [out_t])
    else:
        # every part was written in place: the producers' tasks cover the cat
        lw.cats_in_place.append((pr.nodes[0], list(pr.parts)))
        lw.views[out_t] = vo


def _same_place(a: View, b: View) -> bool:
    return a.buffer == b.buffer and a.offset == b.offset and L.same_strides(a.shape, a.strides, b.strides)


def lower_scatter(lw, pr: ScatterProto, pre: list) -> None:
    n = lw.ix.node(pr.node)
    vx = lw.read(pr.x, pre, pr.phase)
    vs = lw.read(pr.src, pre, pr.phase)
    vo = lw.out_view(pr, pr.out, lambda tv: all(s >= 0 for s in tv.strides), inplace=[pr.x])
    dim = L.norm_dim(int(n.attr("dim", 0) or 0), vo.ndim)
    if n.op.endswith("select_scatter.default"):
        slot = L.select(vo, dim, int(n.attr("index")))
    else:
        slot = L.slice_(vo, dim, n.attr("start"), n.attr("end"), int(n.attr("step", 1) or 1))
    items = []
    if not (vx.buffer == vo.buffer and vx.offset == vo.offset and L.same_strides(vx.shape, vx.strides, vo.strides)):
        items.append(copy_item(vx, vo))  # x everywhere, then src into its slot (in this order)
    items.append(copy_item(L.broadcast_to(vs, slot.shape), slot))
    lw.add(pr, pr.name, CopySpec("copy", tuple(items)), [vx, vs], [vo], touched=list(pr.ins) + [pr.out])


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: CopySpec, ceil) -> tuple[float, float, float]:
    return 0.0, float(sum(view_bytes(i.src) + view_bytes(i.dst) for i in spec.items)), ceil.fp32


def interpret(mem, s: CopySpec) -> None:
    for it in s.items:
        mem.write(it.dst, mem.read(it.src, it.shape, it.src_strides), it.shape, it.dst_strides)


def render(t, c: CopySpec, n, fn: str) -> tuple[list[str], list[str]]:
    lines = []
    for i, it in enumerate(c.items):
        lines.append(f"  const stitch::EwLayout<1> l{i}{{{len(it.shape)}, {cxx.ilist(it.shape)}, "
                     f"{cxx.ilist(it.dst_strides)}, {{{cxx.ilist(it.src_strides)}}}}};")
        lines.append(f"  ST_TRY(cuda_check(stitch::launch_strided_copy({n(f'items[{i}].src')}, "
                     f"{n(f'items[{i}].dst')}, l{i}, stream), \"{t.name}\"));")
    lines.append("  return ST_OK;")
    return [], lines


def out_order(pr, order_of) -> tuple[int, ...] | None:
    """A join of channels-last parts is channels-last."""
    if not isinstance(pr, CatProto):
        return None
    orders = [order_of(x) for x in pr.parts]
    return next((o for o in orders if o is not None and o == L.channels_last_order(len(o))), None)


KIND = TaskKind("copy", CopySpec, "copy", cost, interpret, render,
                lowers=((CatProto, lower_cat), (ScatterProto, lower_scatter)),
                claims=(ClaimRule("fuse", 140, claim_cat), ClaimRule("fuse", 200, claim_scatter)),
                headers=("stitch/elementwise.cuh",), writes=frozenset(), scratch=frozenset(), out_order=out_order)

__all__ = ["CopyItem", "CopySpec", "CatProto", "ScatterProto", "copy_item", "KIND"]
