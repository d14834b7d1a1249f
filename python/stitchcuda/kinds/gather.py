"""Gathers through index.cuh: gather, index_select, embedding, advanced indexing, flip, constant
padding, repeat, nearest upsampling — every output element read from one computed offset of x —
and linear interpolation (1-, 2- and 3-d), where each interpolated dim blends two neighbouring
offsets.

Claim: every free gather-like node (index tensors must be integers; boolean-mask indexing, whose
shape depends on the data, is refused); index_selects along distinct dims, each read only by the
next, as one gather with an index tensor per dim. Lowering reads the node's arguments into the
offset's coefficients (:class:`GatherSpec`).
"""


from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

from .. import layout as L
from .. import ops
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from . import cxx
from .base import ClaimRule, Proto, TaskKind, copy_back, view_bytes

A = ops.A


HEADER = "index.cuh"


#: Most dims a gather walks (index.cuh: kGatherMaxDims), and index tensors it reads.
GATHER_MAX_DIMS = 8
GATHER_MAX_INDICES = 4


@dataclass(frozen=True)
class GatherSpec:
    """index.cuh's gather: for every index p of ``out`` (rank <= 8),
    ``out[p] = x[base + sum_d src_d(p) * coef[d] + sum_k idx_k(p) * index_coef[k]]`` where
    ``src_d(p) = p_d - lo[d]`` (or ``min(floor(p_d * nearest[d]), size[d] - 1)`` in fp32 where
    ``nearest[d]`` > 0: nearest-neighbour upsampling), ``idx_k(p)`` is ``inputs[k]`` (int32 /
    int64, a view over out's shape) plus ``index_size[k]`` when negative; an element with some
    ``src_d`` outside
    ``[0, size[d])`` is ``fill`` (padding). Offsets are in elements of x from its first element
    and may be negative (flip). Covers gather, index_select, embedding, advanced indexing, flip,
    constant padding, repeat and nearest upsampling.

    Linear interpolation: a dim with ``linear[d]`` set reads two taps, ``i0 = min(trunc(s),
    size[d] - 1)`` and ``min(i0 + 1, size[d] - 1)``, for the fp32 source index ``s = scale * p_d``
    (``align_corners``) or ``max(scale * (p_d + 0.5) - 0.5, 0)``, ``scale = linear_scale[d]``, and
    blends them with weights ``1 - (s - i0)`` and ``s - i0``, the innermost dim first, as PyTorch's
    CUDA kernels do."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "gather")

    kind: str
    x: View
    out: View
    base: int
    coef: tuple[int, ...]
    lo: tuple[int, ...]
    size: tuple[int, ...]
    nearest: tuple[float, ...] = ()
    inputs: tuple[View, ...] = ()
    index_coef: tuple[int, ...] = ()
    index_size: tuple[int, ...] = ()
    fill: float = 0.0
    linear: tuple[int, ...] = ()
    linear_scale: tuple[float, ...] = ()
    align_corners: bool = False


@dataclass(frozen=True)
class GatherProto(Proto):
    """A gather-like node (gather, index_select, embedding, index, flip, pad, repeat, nearest
    upsampling): *lower* reads the node's arguments; ``x`` the tensor read, ``indices`` the
    index tensors."""

    node: str = ""
    x: str = ""
    indices: tuple[str, ...] = ()
    out: str = ""
    #: the index_selects before ``node``, in the order they apply, each read only by the next and
    #: each along a dim of its own: with ``node``, one gather with an index tensor per dim
    #: (torch.roll over several dims is such a chain)
    chain: tuple[str, ...] = ()


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    """Claim every free gather node, in graph order; a chain of index_selects along distinct dims,
    each read only by the next, as one."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "gather" and cx.free(n):
            chain = _index_select_chain(cx, n)
            if len(chain) > 1:
                for m in chain:
                    _check_indices(cx, m, m.inputs[1:])
                out = chain[-1].outputs[0].name
                cx.claim(GatherProto(cx.name([m.name for m in chain]), tuple(m.name for m in chain), (out,),
                                     (n.inputs[0],) + tuple(m.inputs[1] for m in chain), node=chain[-1].name,
                                     x=n.inputs[0], indices=tuple(m.inputs[1] for m in chain), out=out,
                                     chain=tuple(m.name for m in chain[:-1])))
            else:
                _gather(cx, n)


def _select_dim(ix, n: Node) -> int | None:
    """An index_select's dim (normalised), None for any other node."""
    if n.op.removeprefix(A).split(".")[0] != "index_select" or len(n.inputs) != 2:
        return None
    rank = len(ix.spec(n.inputs[0]).shape)
    return L.norm_dim(int(n.attr("dim")), rank) if rank else None


def _index_select_chain(cx, n: Node) -> list[Node]:
    """``n`` and the index_selects after it that compose with it into one gather: each the only
    reader of the one before (whose result nobody else needs), along a dim none before it used."""
    ix = cx.ix
    d = _select_dim(ix, n)
    if d is None:
        return [n]
    chain, dims = [n], {d}
    while len(chain) < GATHER_MAX_INDICES:
        t = chain[-1].outputs[0].name
        users = ix.users.get(t, [])
        if len(users) != 1 or t in ix.graph_outputs:
            break
        m = users[0]
        dm = _select_dim(ix, m)
        if dm is None or dm in dims or m.inputs[0] != t or not cx.free(m) or \
                cx.absorbs_unfused([c.name for c in chain] + [m.name]):
            break
        chain.append(m)
        dims.add(dm)
    return chain


def _check_indices(cx, n: Node, indices: Sequence[str], base: str = "") -> None:
    ix = cx.ix
    for t in indices:
        if ix.spec(t).dtype not in ("int64", "int32", "int16", "int8", "uint8", "bool"):
            raise cx.fail(n, f"indices of dtype {ix.spec(t).dtype}")
        if base == "index" and ix.spec(t).dtype in ("bool", "uint8"):
            raise cx.fail(n, "indexing with a boolean mask (the result's shape depends on the data)")


def _gather(cx, n: Node) -> None:
    base = n.op.removeprefix(A).split(".")[0]
    x = n.inputs[0]
    indices: Sequence[str] = n.inputs[1:]
    if base == "embedding":
        x, indices = n.inputs[0], n.inputs[1:2]
    _check_indices(cx, n, indices, base)
    if base.startswith("upsample") and (n.attr("output_size") is None and n.attr("scale_factors") is None
                                        and n.attr("scales_h") is None):
        raise cx.fail(n, "upsampling without a size")
    cx.claim(GatherProto(cx.name([n.name]), (n.name,), (n.outputs[0].name,), (x,) + tuple(indices), node=n.name,
                         x=x, indices=tuple(indices), out=n.outputs[0].name))


# ---------------------------------------------------------------------- lower


#: The linear interpolations and how many trailing (spatial) dims each blends.
LINEAR_MODES = {"upsample_linear1d": 1, "upsample_bilinear2d": 2, "upsample_trilinear3d": 3}


def _scales_given(n: Node, nsp: int) -> list[float | None]:
    """The scale factor each spatial dim was given (None: only a size), in either form of the op."""
    if n.op.endswith(".vec"):
        sf = n.attr("scale_factors")
        return [float(sf[j]) if sf and sf[j] else None for j in range(nsp)]
    names = {1: ("scales",), 2: ("scales_h", "scales_w"), 3: ("scales_d", "scales_h", "scales_w")}[nsp]
    return [float(n.attr(k)) if n.attr(k) else None for k in names]


def source_scale(n_in: int, n_out: int, align_corners: bool, given: float | None) -> float:
    """PyTorch's ``area_pixel_compute_scale`` in fp32: the source index step of one output step."""
    import numpy as np

    if align_corners:
        return float(np.float32(n_in - 1) / np.float32(n_out - 1)) if n_out > 1 else 0.0
    if given is not None and given > 0:
        return float(np.float32(1.0 / given))
    return float(np.float32(n_in) / np.float32(n_out))


def lower(lw, pr: GatherProto, pre: list) -> None:
    n = lw.ix.node(pr.node)
    kind = n.op.removeprefix("aten.").split(".")[0]
    if kind == "index":
        kind = "advanced"
    vx = lw.read(pr.x, pre, pr.phase)
    if any(s < 0 for s in vx.strides):
        c = lw.copy_contiguous(pr.x, vx, pre, pr.phase, why="gathers read non-negative strides")
        vx = lw.views[c]
    xs, st = vx.shape, vx.strides
    oshape = lw.shape(pr.out)
    R = len(oshape)
    coef = [0] * R
    lo = [0] * R
    size = list(oshape)
    nearest = [0.0] * R
    base = 0
    fill = 0.0
    index: list[tuple[str, tuple[int, ...]]] = []  # (tensor, its shape embedded in out's dims)
    icoef: list[int] = []
    isize: list[int] = []
    split = None  # repeat: the out dims, each split in (repeat, size)
    linear: list[int] = []
    linear_scale: list[float] = []
    align = False
    if kind == "gather":
        dim = L.norm_dim(int(n.attr("dim")), len(xs))
        coef = [st[d] if d != dim else 0 for d in range(R)]
        index.append((pr.indices[0], oshape))
        icoef.append(st[dim])
        isize.append(xs[dim])
    elif kind == "index_select":
        # one index_select, or a chain of them (each along its own dim): an index tensor per dim
        coef = list(st) if xs else [0] * R
        for m, t in zip([lw.ix.node(c) for c in pr.chain] + [n], pr.indices):
            dim = L.norm_dim(int(m.attr("dim")), len(xs)) if xs else 0
            ilen = oshape[dim] if R else 1
            index.append((t, tuple(ilen if d == dim else 1 for d in range(R))))
            icoef.append(st[dim] if xs else 0)
            isize.append(xs[dim] if xs else 1)
            if xs:
                coef[dim] = 0
    elif kind == "embedding":
        ish = lw.shape(pr.indices[0])
        coef = [0] * (R - 1) + [st[1]]
        index.append((pr.indices[0], tuple(ish) + (1,)))
        icoef.append(st[0])
        isize.append(xs[0])
    elif kind == "advanced":  # index.Tensor
        holes = n.attr("indices")
        idx = list(holes) if holes is not None else list(n.inputs[1:])
        pos = [k for k, t in enumerate(idx) if t is not None]
        if len(pos) > GATHER_MAX_INDICES:
            raise lw.fail(n, f"indexing with more than {GATHER_MAX_INDICES} index tensors")
        bshape = L.broadcast_shapes(*[lw.shape(idx[k]) for k in pos])
        rest = [d for d in range(len(xs)) if d not in pos]
        adjacent = pos == list(range(pos[0], pos[-1] + 1))
        start = pos[0] if adjacent else 0
        before = [d for d in rest if d < start] if adjacent else []
        after = [d for d in rest if d not in before]
        order = before + [None] * len(bshape) + after  # out dim -> x dim (None: an index dim)
        coef = [st[d] if d is not None else 0 for d in order]
        nb = len(before)
        for k in pos:
            shape = (1,) * nb + tuple([1] * (len(bshape) - len(lw.shape(idx[k])))) + lw.shape(idx[k]) + \
                (1,) * len(after)
            index.append((idx[k], shape))
            icoef.append(st[k])
            isize.append(xs[k])
    elif kind == "flip":
        dims = {L.norm_dim(int(d), len(xs)) for d in n.attr("dims")}
        coef = [-st[d] if d in dims else st[d] for d in range(R)]
        base = sum((xs[d] - 1) * st[d] for d in dims)
    elif kind == "constant_pad_nd":
        pad = list(n.attr("pad"))
        coef = list(st)
        size = list(xs)
        for j in range(len(pad) // 2):
            lo[R - 1 - j] = int(pad[2 * j])
        fill = float(n.attr("value") or 0.0)
    elif kind == "repeat":
        reps = list(n.attr("repeats"))
        xfull = (1,) * (R - len(xs)) + tuple(xs)
        sfull = (0,) * (R - len(xs)) + tuple(st)
        split = []
        for r, s_, c in zip(reps, xfull, sfull):
            split += [(r, 0), (s_, c)]
        split = [(s_, c) for s_, c in split if s_ != 1] or [(1, 0)]
    elif kind.startswith("upsample_nearest"):
        nsp = int(kind.removeprefix("upsample_nearest")[0])
        coef = list(st)
        sf = n.attr("scale_factors")
        if n.op.endswith(".default"):
            sf = [n.attr(k) for k in ("scales_d", "scales_h", "scales_w")[3 - nsp:]]
            sf = None if all(v is None for v in sf) else sf
        for j in range(nsp):
            d = R - nsp + j
            nearest[d] = 1.0 / float(sf[j]) if sf and sf[j] else xs[d] / oshape[d]
            size[d] = xs[d]
    elif kind in LINEAR_MODES:
        nsp = LINEAR_MODES[kind]
        coef = list(st)
        align = bool(n.attr("align_corners"))
        linear, linear_scale = [0] * R, [0.0] * R
        for j, given in enumerate(_scales_given(n, nsp)):
            d = R - nsp + j
            linear[d], linear_scale[d] = 1, source_scale(xs[d], oshape[d], align, given)
            size[d] = xs[d]
    else:
        raise lw.fail(n, "no gather lowering")
    # The output, and (repeat) its dims split in two.
    vo = lw.out_view(pr, pr.out, lambda tv: all(s >= 0 for s in tv.strides))
    post = None
    if split is not None:
        sshape = tuple(s_ for s_, _ in split)
        wo = L.reshape(vo, sshape)
        if wo is None:
            tmp = lw.alloc.add_tensor(f"{pr.out}_out", vo.shape, vo.dtype)
            fresh = lw.alloc.fresh(tmp, vo.dtype, vo.shape, pr.phase)
            lw.views[tmp] = fresh
            post = (fresh, vo)
            wo = L.reshape(fresh, sshape)
        coef = [c for _, c in split]
        R = len(sshape)
        lo, size, nearest = [0] * R, list(sshape), [0.0] * R
    else:
        wo = vo
    if R > GATHER_MAX_DIMS:
        raise lw.fail(n, f"a gather over more than {GATHER_MAX_DIMS} dims")
    views = []
    for t, shape in index:
        v = lw.read(t, pre, pr.phase)
        if v.dtype != "int64" or any(s < 0 for s in v.strides):
            c = lw.copy_contiguous(t, v, pre, pr.phase, why="index tensors are read as int64", dtype="int64")
            v = lw.views[c]
        if v.shape != shape:
            r = L.reshape(v, shape)
            if r is None:
                c = lw.copy_contiguous(t, v, pre, pr.phase, why="index layout")
                r = L.reshape(lw.views[c], shape)
            v = r
        views.append(L.broadcast_to(v, wo.shape))
    # The kernel walks out's dims with the last innermost: walk them in out's memory order. A
    # channels-last output walked width-innermost wrote one element per 32-byte sector (SegFormer's
    # decoder upsamples four maps into a channels-last concatenation: 6 % of the bandwidth). Every
    # per-dim coefficient follows; interpolated dims keep their order (it is the blends' order).
    perm = sorted(range(R), key=lambda d: (wo.shape[d] > 1, -wo.strides[d]))
    if [d for d in perm if linear and linear[d]] != [d for d in range(R) if linear and linear[d]]:
        perm = list(range(R))
    if perm != list(range(R)):
        wo = L.permute(wo, perm)
        views = [L.permute(v, perm) for v in views]
        coef, lo, size, nearest = ([seq[d] for d in perm] for seq in (coef, lo, size, nearest))
        if linear:
            linear, linear_scale = [linear[d] for d in perm], [linear_scale[d] for d in perm]
    spec = GatherSpec("gather", vx, wo, base, tuple(coef), tuple(lo), tuple(size),
                      tuple(nearest) if any(nearest) else (), tuple(views), tuple(icoef), tuple(isize), fill,
                      tuple(linear), tuple(linear_scale), align)
    lw.add(pr, pr.name, spec, [vx] + views, [wo], touched=list(pr.ins) + [pr.out])
    copy_back(lw, pr, post)


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: GatherSpec, ceil) -> tuple[float, float, float]:
    n = math.prod(spec.out.shape)
    x_bytes = min(view_bytes(spec.x), n * spec.x.itemsize)
    return 0.0, float(x_bytes + sum(view_bytes(v) for v in spec.inputs) + view_bytes(spec.out)), ceil.fp32


def interpret(mem, g: GatherSpec) -> None:
    import torch

    shape = g.out.shape
    grids = torch.meshgrid(*[torch.arange(d, device=mem.device) for d in shape], indexing="ij") if shape else []
    off = torch.full(shape, g.base, dtype=torch.int64, device=mem.device)
    valid = torch.ones(shape, dtype=torch.bool, device=mem.device)
    blends = []  # (offset of the second tap, its weight) per interpolated dim, the outermost first
    for d, p_ in enumerate(grids):
        if g.linear and g.linear[d]:
            pf, scale = p_.to(torch.float32), torch.tensor(g.linear_scale[d], dtype=torch.float32)
            s = scale * pf if g.align_corners else torch.clamp_min(scale * (pf + 0.5) - 0.5, 0.0)
            i0 = torch.clamp_max(s.to(torch.int64), g.size[d] - 1)
            off += i0 * g.coef[d]
            blends.append(((i0 < g.size[d] - 1).to(torch.int64) * g.coef[d], (s - i0.to(torch.float32)).double()))
            continue
        if g.nearest and g.nearest[d] > 0:
            scale = torch.tensor(g.nearest[d], dtype=torch.float32)
            src = torch.clamp_max(torch.floor(p_.to(torch.float32) * scale).to(torch.int64), g.size[d] - 1)
        else:
            src = p_ - g.lo[d]
        valid &= (src >= 0) & (src < g.size[d])
        off += src * g.coef[d]
    for v, c, n in zip(g.inputs, g.index_coef, g.index_size):
        i = mem.view(v).to(torch.int64)
        off += torch.where(i < 0, i + n, i) * c
    flat = mem.typed(g.x.buffer, g.x.dtype)
    xo = g.x.offset

    def tap(at):
        return flat[(xo + torch.where(valid, at, torch.zeros_like(at))).reshape(-1)].double().reshape(shape)

    # bit j of a tap's number: the second tap of the j-th interpolated dim counted from the innermost
    taps = [tap(off + sum((blends[-1 - j][0] for j in range(len(blends)) if m >> j & 1), torch.zeros_like(off)))
            for m in range(1 << len(blends))]
    for _, w1 in reversed(blends):  # the innermost dim first, as PyTorch's kernels nest the blends
        taps = [(1.0 - w1) * taps[2 * m] + w1 * taps[2 * m + 1] for m in range(len(taps) // 2)]
    vals = taps[0]
    mem.write(g.out, torch.where(valid, vals, torch.full_like(vals, g.fill)))


def render(t, g: GatherSpec, n, fn: str) -> tuple[list[str], list[str]]:
    o = g.out
    # The kernel walks its dims in the order given, the last fastest: out's memory order, so that
    # writes into a channels-last or sliced target are coalesced (any order computes the same).
    perm = sorted(range(o.ndim), key=lambda d: -abs(o.strides[d]))

    def permuted(vals):
        return [vals[d] for d in perm] if vals else []

    body = [f"  stitch::GatherParams<{ctype(g.x.dtype)}, {ctype(o.dtype)}> g{{}};",
            f"  g.x = {n('x')}; g.out = {n('out')}; g.ndim = {o.ndim}; g.base = {g.base}; g.fill = {cxx.flit(g.fill)};"]
    for field, vals in (("shape", o.shape), ("out_stride", o.strides), ("coef", g.coef), ("lo", g.lo),
                        ("size", g.size), ("linear", g.linear)):
        if vals:
            body.append("  " + " ".join(f"g.{field}[{d}] = {v};" for d, v in enumerate(permuted(vals))))
    for field, vals in (("nearest", g.nearest), ("linear_scale", g.linear_scale)):
        if vals:
            body.append("  " + " ".join(f"g.{field}[{d}] = {cxx.flit(v)};" for d, v in enumerate(permuted(vals))))
    if g.align_corners:
        body.append("  g.align_corners = 1;")
    body.append(f"  g.nidx = {len(g.inputs)};")
    for k, v in enumerate(g.inputs):
        body.append(f"  g.idx[{k}] = {n(f'inputs[{k}]')}; g.idx_coef[{k}] = {g.index_coef[k]}; "
                    f"g.idx_size[{k}] = {g.index_size[k]};")
        body.append("  " + " ".join(f"g.idx_stride[{k}][{d}] = {s_};" for d, s_ in enumerate(permuted(v.strides))))
    # what the kernel can be specialised on, known now (index.cuh: launch_gather's NLIN, NIDX): the
    # interpolated dims' count, or none and the index tensors' count
    nlin = sum(1 for v in g.linear if v)
    hint = f"<0, {len(g.inputs)}>" if nlin == 0 else f"<{nlin}>" if nlin <= 3 and not g.inputs else ""
    return cxx.include(HEADER), body + cxx.call(t.name, f"stitch::launch_gather{hint}(g, stream)")


KIND = TaskKind("gather", GatherSpec, "elementwise_kernel", cost, interpret, render, lowers=((GatherProto, lower),),
                claims=(ClaimRule("fuse", 180, claim),), scratch=frozenset())

__all__ = ["GatherSpec", "GatherProto", "GATHER_MAX_DIMS", "GATHER_MAX_INDICES", "KIND"]
