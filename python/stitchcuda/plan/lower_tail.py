"""Lowering the tail kinds: group statistics, pooling, scans, arg reductions, gathers, ``arange``.

Takes a proto and the :class:`~.lower.Lowerer`; gives its task with a
:class:`~.specs.GroupStatsSpec`, :class:`~.specs.PoolSpec`, :class:`~.specs.ScanSpec`,
:class:`~.specs.ArgSpec`, :class:`~.specs.GatherSpec` or :class:`~.specs.IotaSpec`. Like the
other emitters, an input whose layout the kernel cannot read (dims that do not collapse into the
[outer, n, inner] or [planes, ...] form it walks) is copied first, and an output it cannot write
in place of its placement target goes to a fresh buffer (a copy puts it back).
"""

from __future__ import annotations

from typing import Sequence

from .. import layout as L
from ..layout import View
from .lower import Lowerer, copy_item
from .protos import ArgProto, GatherProto, GroupStatsProto, IotaProto, PoolProto, ScanProto, ScatterProto
from .specs import ArgSpec, CopySpec, EwInstr, GatherSpec, GroupStatsSpec, IotaSpec, PoolSpec, ScanSpec, Task

#: Most dims a gather walks (index.cuh: kGatherMaxDims), and index tensors it reads.
GATHER_MAX_DIMS = 8
GATHER_MAX_INDICES = 4


def chain(first: Sequence[EwInstr], second: Sequence[EwInstr]) -> tuple[EwInstr, ...]:
    """The instructions of ``second`` applied to the result of ``first`` (both on input ``a0``)."""
    if not first:
        return tuple(second)
    if not second:
        return tuple(first)
    k = len(first)

    def arg(a: str) -> str:
        if a == "a0":
            return f"t{k - 1}"
        if a.startswith("t"):
            return f"t{int(a[1:]) + k}"
        return a

    return tuple(first) + tuple(EwInstr(i.op, tuple(arg(a) for a in i.args), i.consts) for i in second)


def _groups(v: View, cuts: Sequence[int]) -> list[tuple[int, int] | None]:
    """(size, stride) of the dims of ``v`` between consecutive ``cuts``, each collapsed."""
    edges = [0] + list(cuts) + [v.ndim]
    return [L.collapse(v.shape[a:b], v.strides[a:b]) for a, b in zip(edges, edges[1:])]


def _readable(lw: Lowerer, t: str, v: View, pre: list[Task], phase: str, cuts: Sequence[int], why: str,
              float_only: bool = True) -> View:
    if any(g is None for g in _groups(v, cuts)) or (float_only and v.dtype not in ("float32", "float16", "bfloat16")):
        c = lw.copy_contiguous(t, v, pre, phase, why=why, shape_view=v,
                               dtype=v.dtype if v.dtype in ("float32", "float16", "bfloat16") or not float_only
                               else "float32")
        v = lw.views[c]
    return v


def _writable(lw: Lowerer, pr, t: str, cuts: Sequence[int]) -> tuple[View, tuple[View, View] | None]:
    """The view a kernel writes ``t`` through (its placement target when its dims collapse), and
    the (written, wanted) pair of a copy back when the kernel writes a fresh buffer instead."""
    vo = lw.out_view(pr, t, lambda tv: all(g is not None for g in _groups(tv, cuts)) and
                     all(s >= 0 for s in tv.strides))
    if all(g is not None for g in _groups(vo, cuts)):
        return vo, None
    tmp = lw.alloc.add_tensor(f"{t}_out", vo.shape, vo.dtype)
    w = lw.alloc.fresh(tmp, vo.dtype, vo.shape, pr.phase)
    lw.views[tmp] = w
    return w, (w, vo)


def _copy_back(lw: Lowerer, pr, post: tuple[View, View] | None) -> None:
    if post is not None:
        lw.tasks.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), post[0], post[1], pr.phase,
                                     note="writes the result back in the reference's layout"))


# ---------------------------------------------------------------------- group statistics


def emit_group_stats(lw: Lowerer, pr: GroupStatsProto, pre: list[Task]) -> None:
    vx = lw.read(pr.x, pre, pr.phase)
    c = pr.groups * pr.cpg
    rows = pr.samples * pr.groups
    cols = vx.numel // rows if rows else 0
    v2 = L.reshape(vx, (rows, cols)) if vx.numel else None
    rc = L.rows_cols(v2, 1) if v2 is not None else None
    if rc is None or vx.dtype not in ("float32", "float16", "bfloat16"):
        cc = lw.copy_contiguous(pr.x, vx, pre, pr.phase, why="group statistics read rows with unit stride",
                                dtype=vx.dtype if vx.dtype in ("float32", "float16", "bfloat16") else "float32")
        v2 = L.reshape(lw.views[cc], (rows, cols))
        rc = L.rows_cols(v2, 1)
    _, _, ldi = rc

    def vec(t: str | None) -> View | None:
        return lw.channel_vector(t, c, pre, pr.phase)

    w, b = vec(pr.weight), vec(pr.bias)
    if w is not None and b is not None and w.dtype != b.dtype:
        cc = lw.copy_contiguous(pr.bias, b, pre, pr.phase, why="bias in the weight's dtype", dtype=w.dtype)
        b = L.reshape(lw.views[cc], (c,))
    scale = lw.out_view(pr, pr.scale, lambda tv: False)
    shift = lw.out_view(pr, pr.shift, lambda tv: False)
    splits = group_splits(rows, cols)
    wt = lw.alloc.add_tensor(f"{pr.scale}_ws", (rows * splits * 3,), "float32")
    ws = lw.alloc.fresh(wt, "float32", (rows * splits * 3,), pr.phase)
    lw.views[wt] = ws
    n = pr.samples * c
    spec = GroupStatsSpec("group_stats", v2, ldi, rows, cols, pr.groups, pr.cpg, w, b, float(pr.eps),
                          L.reshape(scale, (n,)), L.reshape(shift, (n,)), ws, splits)
    lw.add(pr, pr.name, "reduction_template", spec, [v2, w, b], [scale, shift, ws], touched=list(pr.ins))


def group_splits(rows: int, cols: int) -> int:
    """How many pieces the group-statistics kernel cuts each row into: enough blocks to fill a
    large GPU, each piece at least 4096 elements (norm.cuh's kGroupStatsThreads * 16)."""
    want = max(1, -(-1024 // max(rows, 1)))
    return max(1, min(want, -(-cols // 4096)))


# ---------------------------------------------------------------------- pooling


def emit_pool(lw: Lowerer, pr: PoolProto, pre: list[Task]) -> None:
    nsp = len(pr.kernel)
    pro, epi = lw.hook(pr.pro), lw.hook(pr.epi)
    vx = lw.read(pr.x, pre, pr.phase)
    lead = vx.ndim - nsp
    cuts = [lead] + list(range(lead + 1, vx.ndim))
    vx = _readable(lw, pr.x, vx, pre, pr.phase, cuts, "pooling reads planes that collapse")
    vo, post = _writable(lw, pr, pr.out, cuts)

    def as4(v: View) -> View:
        g = L.collapse(v.shape[:lead], v.strides[:lead])
        planes, sp = (g[0], g[1]) if g[0] > 1 else (g[0], 0)
        pad = 3 - nsp
        return View(v.buffer, v.offset, (planes,) + (1,) * pad + v.shape[lead:], (sp,) + (0,) * pad + v.strides[lead:],
                    v.dtype)

    def three(xs: Sequence[int], fill: int) -> tuple[int, int, int]:
        return tuple([fill] * (3 - nsp) + list(xs))

    spec = PoolSpec("pool", pr.op, as4(vx), as4(vo), three(pr.kernel, 1), three(pr.stride, 1), three(pr.padding, 0),
                    three(pr.dilation, 1), pr.adaptive, pr.count_include_pad, pr.divisor, pro, epi)
    lw.add(pr, pr.name, "reduction_template", spec, [spec.x], [spec.out], touched=list(pr.ins) + [pr.out, pr.x] +
           [lw.ix.nodes[nm].outputs[0].name for nm in pr.pro + pr.epi])
    _copy_back(lw, pr, post)


# ---------------------------------------------------------------------- scans and arg reductions


def _three(v: View, d: int) -> tuple[int, int, int, int, int, int]:
    """x as [outer, n, inner] around dim d: sizes and strides (unit dims get stride 0)."""
    (o, so), (n, sn), (i, si) = _groups(v, [d, d + 1])
    return o, n, i, (so if o > 1 else 0), (sn if n > 1 else 0), (si if i > 1 else 0)


def emit_scan(lw: Lowerer, pr: ScanProto, pre: list[Task]) -> None:
    pro, epi = lw.hook(pr.pro), lw.hook(pr.epi)
    vx = lw.read(pr.x, pre, pr.phase)
    d = pr.dim
    if vx.ndim == 0:
        vx = L.unsqueeze(vx, 0)
    vx = _readable(lw, pr.x, vx, pre, pr.phase, [d, d + 1], "scans read [outer, n, inner]", float_only=False)
    vo, post = _writable(lw, pr, pr.out, [d, d + 1] if lw.shape(pr.out) else [])
    wo = vo if vo.ndim else L.unsqueeze(vo, 0)
    outer, n, inner, so, sn, si = _three(vx, d)
    _, _, _, oso, osn, osi = _three(wo, d)
    spec = ScanSpec("scan", pr.op, vx, outer, n, inner, so, sn, si, vo, oso, osn, osi, pr.reverse, pro, epi)
    lw.add(pr, pr.name, "reduction_template", spec, [vx], [vo], touched=list(pr.ins) + [pr.out, pr.x] +
           [lw.ix.nodes[nm].outputs[0].name for nm in pr.pro + pr.epi])
    _copy_back(lw, pr, post)


def emit_arg(lw: Lowerer, pr: ArgProto, pre: list[Task]) -> None:
    vx = lw.read(pr.x, pre, pr.phase)
    if pr.dim is None or vx.ndim == 0:
        flat = L.reshape(vx, (vx.numel,))
        if flat is None:
            c = lw.copy_contiguous(pr.x, vx, pre, pr.phase, why="an arg reduction of the whole tensor")
            flat = L.reshape(lw.views[c], (vx.numel,))
        vx, d = flat, 0
        cut: list[int] = []
    else:
        d = pr.dim
        vx = _readable(lw, pr.x, vx, pre, pr.phase, [d, d + 1], "arg reductions read [outer, red, inner]")
        # out is x's shape without the reduced dim, or with it as a unit dim: [outer, inner]
        cut = [d, d + 1] if len(lw.shape(pr.out)) == len(lw.shape(pr.x)) else [d]
    outer, red, inner, so, sr, si = _three(vx, d)
    vo, post = _writable(lw, pr, pr.out, cut)
    gs = _groups(vo, cut)
    (o_o, oso), (o_i, osi) = (gs[0], gs[-1]) if cut else ((1, 0), (1, 0))
    spec = ArgSpec("arg", pr.op, vx, outer, red, inner, so, sr, si, vo, oso if o_o > 1 else 0,
                   osi if o_i > 1 else 0)
    lw.add(pr, pr.name, "reduction_template", spec, [vx], [vo], touched=list(pr.ins) + [pr.out, pr.x])
    _copy_back(lw, pr, post)


# ---------------------------------------------------------------------- gathers


def emit_gather(lw: Lowerer, pr: GatherProto, pre: list[Task]) -> None:
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
    if kind == "gather":
        dim = L.norm_dim(int(n.attr("dim")), len(xs))
        coef = [st[d] if d != dim else 0 for d in range(R)]
        index.append((pr.indices[0], oshape))
        icoef.append(st[dim])
        isize.append(xs[dim])
    elif kind == "index_select":
        dim = L.norm_dim(int(n.attr("dim")), len(xs)) if xs else 0
        coef = [st[d] if d != dim else 0 for d in range(R)]
        ilen = oshape[dim] if R else 1
        index.append((pr.indices[0], tuple(ilen if d == dim else 1 for d in range(R))))
        icoef.append(st[dim] if xs else 0)
        isize.append(xs[dim] if xs else 1)
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
    spec = GatherSpec("gather", vx, wo, base, tuple(coef), tuple(lo), tuple(size),
                      tuple(nearest) if any(nearest) else (), tuple(views), tuple(icoef), tuple(isize), fill)
    lw.add(pr, pr.name, "elementwise_kernel", spec, [vx] + views, [wo], touched=list(pr.ins) + [pr.out])
    _copy_back(lw, pr, post)


def emit_scatter(lw: Lowerer, pr: ScatterProto, pre: list[Task]) -> None:
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
    lw.add(pr, pr.name, "copy", CopySpec("copy", tuple(items)), [vx, vs], [vo], touched=list(pr.ins) + [pr.out])


def emit_iota(lw: Lowerer, pr: IotaProto, pre: list[Task]) -> None:
    vo = lw.out_view(pr, pr.out, lambda tv: tv.ndim == 1 and tv.strides[0] >= 0)
    spec = IotaSpec("iota", vo, float(pr.start), float(pr.step))
    lw.add(pr, pr.name, "elementwise_kernel", spec, [], [vo], touched=[pr.out])


__all__ = ["emit_group_stats", "emit_pool", "emit_scan", "emit_arg", "emit_gather", "emit_iota", "emit_scatter",
           "chain",
           "group_splits", "GATHER_MAX_DIMS", "GATHER_MAX_INDICES"]
