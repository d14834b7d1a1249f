"""Batch norm, group norm and instance norm: per-channel statistics as a scale and a shift, then an
elementwise ``x * scale + shift`` (a synthetic ``stitch.affine_channel`` node) that fuses with what
follows.

Claim (*match*, in graph order over both): batch norm (training: batch statistics over
batch_norm.cuh's two passes; eval: running statistics, once at create when they are weights) and
group norm / instance norm (per-(sample, group) statistics over rows, norm.cuh). The statistics
task reads x too: the norm node stays among x's users, so no elementwise group swallows the
producer of x.

Batch statistics take the elementwise ops that make x from one tensor (an activation after a
convolution: mish, ReLU, ...) as a prologue hook, and the affine reads copies of those ops on the
same tensor: x itself is never written. Before, the ops were a pass of their own, x written once
and read twice; now their input is read twice, which saves writing and reading x once each.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..dtypes import SIZES, ctype
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .base import FLOAT_DTYPES, ClaimRule, Proto, TaskKind, view_bytes

A = ops.A


@dataclass(frozen=True)
class BnStatsSpec:
    """Per-channel batch statistics of x viewed as [n, c, s] (strides sn, sc, ss), turned into
    ``scale = weight * rsqrt(var + eps)`` and ``shift = bias - mean * scale`` (fp32, c each).
    ``mode`` ``batch``: biased variance over n and s (training-mode batch norm), computed by a
    generated two-pass Welford kernel with ``splits`` partial results in ``workspace``, of
    ``prologue``(x) (a hook: the elementwise ops that made the norm's input);
    ``running``: from the running statistics (eval mode)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "bn_stats")

    kind: str
    mode: str
    x: View | None
    n: int
    c: int
    s: int
    sn: int
    sc: int
    ss: int
    weight: View | None
    bias: View | None
    running_mean: View | None
    running_var: View | None
    eps: float
    scale: View
    shift: View
    workspace: View | None = None
    splits: int = 1
    prologue: tuple[EwInstr, ...] = ()

    @property
    def by_planes(self) -> bool:
        """Whether pass 1 walks each channel's contiguous runs (see :func:`bn_by_planes`)."""
        return bn_by_planes(self.s, self.ss)


def bn_by_planes(s: int, ss: int) -> bool:
    """Batch statistics of x as [n, c, s]: with runs of at least 64 contiguous elements per
    (sample, channel) (NCHW), a block per channel slice reads along the runs; otherwise (NHWC,
    or few elements per plane) a block's lanes run along the channels."""
    return s >= 64 and ss == 1


@dataclass(frozen=True)
class GroupStatsSpec:
    """norm.cuh's group statistics: x as ``rows`` x ``cols`` (row r at ``r * ldi``, unit stride
    along the row), one normalisation group per row; row r is group ``r % groups`` of sample
    ``r // groups``, covering channels ``g * cpg ...`` (``cpg`` per group, ``cols / cpg``
    elements each). Per (sample, channel): ``scale = weight[c] * rsqrt(var + eps)``, ``shift =
    bias[c] - mean * scale`` (fp32, biased variance over the row) into ``scale`` / ``shift``
    ([samples * groups * cpg]). Group norm, and instance norm (one channel per group). A row is
    cut into ``splits`` pieces whose Welford partials go through ``workspace``.

    ``channels_last``: x is read in place instead, sample n's channel c at position j (of ``s``)
    at ``n * sn + c + j * ss`` (``ldi`` unused): batch statistics' lanes-along-channels kernel per
    sample, each sample's positions cut into ``splits`` pieces (``workspace``: samples * splits *
    channels * 3 floats)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "group_stats")

    kind: str
    x: View
    ldi: int
    rows: int
    cols: int
    groups: int
    cpg: int
    weight: View | None
    bias: View | None
    eps: float
    scale: View
    shift: View
    workspace: View | None = None
    splits: int = 1
    channels_last: bool = False
    s: int = 0
    sn: int = 0
    ss: int = 0


@dataclass(frozen=True)
class BnStatsProto(Proto):
    """A batch norm's scale and shift; ``pro``: the hook's nodes (on ``x``), batch statistics only."""

    mode: str = "batch"
    x: str = ""
    pro: tuple[str, ...] = ()
    weight: str | None = None
    bias: str | None = None
    rm: str | None = None
    rv: str | None = None
    eps: float = 0.0
    scale: str = ""
    shift: str = ""


@dataclass(frozen=True)
class GroupNormProto(Proto):
    """What a group norm reads (instance norm: one channel per group): x [samples, groups * cpg,
    ...], the per-channel weight and bias (or None), eps."""

    x: str = ""
    weight: str | None = None
    bias: str | None = None
    eps: float = 0.0
    samples: int = 1
    groups: int = 1
    cpg: int = 1


@dataclass(frozen=True)
class GroupStatsProto(GroupNormProto):
    """Per-(sample, channel) scale and shift of a group norm; the affine itself is a synthetic
    elementwise node."""

    scale: str = ""
    shift: str = ""


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    ix = cx.ix
    for n in list(ix.g.nodes):
        if ops.kind(n.op) == "batch_norm" and cx.free(n):
            _batch_norm(cx, n)
        elif ops.kind(n.op) == "group_norm" and cx.free(n):
            _group_norm(cx, n)


def _batch_norm(cx, n: Node) -> None:
    ix = cx.ix
    a = ix.args(n, ops.args(n.op))
    x = a["input"][1]
    xs = ix.shape(x)
    if len(xs) < 2:
        raise cx.fail(n, "batch norm needs at least 2 dims")
    no_stats = n.op == A + "_native_batch_norm_legit.no_stats"
    training = no_stats or (n.op in (A + "_native_batch_norm_legit_functional.default",
                                     A + "_native_batch_norm_legit.default") and bool(n.attr("training")))
    c = xs[1]
    eps = float(n.attr("eps"))
    for extra in n.outputs[1:]:
        if ix.users.get(extra.name) or extra.name in ix.graph_outputs:
            raise cx.fail(n, "batch norm's saved statistics are used; only the normalised output is supported")
    w = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
    b = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
    if no_stats and xs[0] == 1:
        # Batch statistics of one sample (instance norm, as F.instance_norm calls it): each
        # channel's elements are one row, the group statistics' layout.
        _group_stats(cx, n, x, w, b, 1, c, 1, eps)
        return
    rm = a["running_mean"][1] if a.get("running_mean") else None
    rv = a["running_var"][1] if a.get("running_var") else None
    bshape = (c,) + (1,) * (len(xs) - 2)
    scale = ix.add_tensor(f"{n.name}_scale", bshape, "float32")
    shift = ix.add_tensor(f"{n.name}_shift", bshape, "float32")
    cx.keep_f32.update((scale, shift))
    pro, src = cx.prologue(n, x) if training else ([], x)
    ins = tuple(t for t in ((src if training else None), w, b, None if training else rm, None if training else rv)
                if t)
    phase = "run" if training or any(t not in ix.const for t in ins) else "create"
    cx.claim(BnStatsProto(f"{n.name}_stats", (*pro, n.name), (scale, shift), ins, phase,
                          mode="batch" if training else "running", x=src, weight=w, bias=b, rm=rm, rv=rv, eps=eps,
                          scale=scale, shift=shift, pro=tuple(pro)))
    # The normalisation itself is elementwise and fuses with what follows; the synthetic
    # node that does it covers the batch-norm node too. In training the statistics task
    # reads x as well: the batch-norm node stays among x's users, so no elementwise group
    # swallows the producer of x (x must be materialised for the statistics) — unless the
    # statistics took x's producers as their hook: then the affine reads copies of them.
    xa = _recompute(cx, pro, x, ix.pos[n.name]) if pro else x
    syn = Node(f"{n.name}_affine", "stitch.affine_channel", (xa, scale, shift), (n.outputs[0],), (), n.source)
    ix.insert_node(syn, [n.name], ix.pos[n.name] + 0.5, takes_from=n.name, take_inputs=[] if training else [x])


def _recompute(cx, names: list[str], x: str, pos: float) -> str:
    """Copies of the hook nodes ``names`` (which make ``x`` from the hook's one source) for a second
    reader, placed after ``pos``, each standing for the node it copies: the copy of ``x``."""
    ix = cx.ix
    ren: dict[str, str] = {}
    for k, nm in enumerate(names):
        m = ix.nodes[nm]
        o = m.outputs[0]
        t = ix.add_tensor(f"{o.name}_again", o.shape, o.dtype)
        ren[o.name] = t
        name = f"{nm}_again"
        while name in ix.nodes:
            name += "_"
        copy = Node(name, m.op, tuple(ren.get(i, i) for i in m.inputs), (ix.specs[t],), m.attrs, m.source)
        ix.insert_node(copy, [nm], pos + 0.25 * (k + 1) / (len(names) + 1))
    return ren[x]


def _group_norm(cx, n: Node) -> None:
    """native_group_norm(x, w, b, N, C, HxW, G, eps): per-(sample, group) statistics, then the
    per-(sample, channel) affine as an elementwise node that fuses with what follows."""
    ix = cx.ix
    a = ix.args(n, ops.args(n.op))
    x = a["input"][1]
    xs = ix.shape(x)
    for extra in n.outputs[1:]:
        if ix.users.get(extra.name) or extra.name in ix.graph_outputs:
            raise cx.fail(n, "group norm's mean / rstd outputs are used; only the normalised output is supported")
    groups = int(n.attr("group"))
    if len(xs) < 2 or xs[1] % groups:
        raise cx.fail(n, f"group norm of {list(xs)} in {groups} groups")
    w = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
    b = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
    _group_stats(cx, n, x, w, b, xs[0], groups, xs[1] // groups, float(n.attr("eps")))


def _group_stats(cx, n: Node, x: str, w: str | None, b: str | None, samples: int, groups: int, cpg: int,
                 eps: float) -> None:
    ix = cx.ix
    xs = ix.shape(x)
    if ix.spec(x).dtype not in FLOAT_DTYPES:
        raise cx.fail(n, f"normalisation of {ix.spec(x).dtype}")
    bshape = (samples, groups * cpg) + (1,) * (len(xs) - 2)
    scale = ix.add_tensor(f"{n.name}_scale", bshape, "float32")
    shift = ix.add_tensor(f"{n.name}_shift", bshape, "float32")
    cx.keep_f32.update((scale, shift))
    ins = tuple(t for t in (x, w, b) if t)
    phase = "create" if all(t in ix.const for t in ins) else "run"
    cx.claim(GroupStatsProto(f"{n.name}_stats", (n.name,), (scale, shift), ins, phase, x=x, weight=w, bias=b,
                             eps=eps, samples=samples, groups=groups, cpg=cpg, scale=scale, shift=shift))
    # The statistics task reads x too: the norm node stays among x's users (see batch_norm).
    syn = Node(f"{n.name}_affine", "stitch.affine_channel", (x, scale, shift), (n.outputs[0],), (), n.source)
    ix.insert_node(syn, [n.name], ix.pos[n.name] + 0.5, takes_from=n.name, take_inputs=[])


# ---------------------------------------------------------------------- lower


def lower_bn(lw, pr: BnStatsProto, pre: list) -> None:
    c = lw.shape(pr.scale)[0]
    vx = None
    n = s = 1
    sn = sc = ss = 0
    if pr.mode == "batch":
        vx = lw.read(pr.x, pre, pr.phase)

        def g(v: View):
            return (L.collapse(v.shape[:1], v.strides[:1]), L.collapse(v.shape[1:2], v.strides[1:2]),
                    L.collapse(v.shape[2:], v.strides[2:]))
        gs = g(vx)
        if any(x is None for x in gs):
            cc = lw.copy_contiguous(pr.x, vx, pre, pr.phase, why="batch statistics layout")
            vx = lw.views[cc]
            gs = g(vx)
        (n, sn), (_, sc), (s, ss) = gs
        if s <= 1:
            ss = 1

    def vec(t: str | None) -> View | None:
        return lw.channel_vector(t, c, pre, pr.phase)

    w, b = vec(pr.weight), vec(pr.bias)
    rm = vec(pr.rm) if pr.mode == "running" else None
    rv = vec(pr.rv) if pr.mode == "running" else None
    scale = lw.out_view(pr, pr.scale, lambda tv: False)
    shift = lw.out_view(pr, pr.shift, lambda tv: False)
    splits, ws = 1, None
    if pr.mode == "batch":
        planes = bn_by_planes(s, ss)
        splits = _bn_splits(n * s, c, planes, 0 if planes else bn_vec_width(vx, c, sn, sc, ss))
        wt = lw.alloc.add_tensor(f"{pr.scale}_ws", (splits * c * 3,), "float32")
        ws = lw.alloc.fresh(wt, "float32", (splits * c * 3,), pr.phase)
        lw.views[wt] = ws
    spec = BnStatsSpec("bn_stats", pr.mode, vx, n, c, s, sn, sc, ss, w, b, rm, rv, pr.eps,
                       L.reshape(scale, (c,)), L.reshape(shift, (c,)), ws, splits, lw.hook(pr.pro))
    lw.add(pr, pr.name, spec, [vx, w, b, rm, rv], [scale, shift] + ([ws] if ws else []),
              touched=pr.ins)


def _bn_splits(rows: int, c: int, planes: bool, vec: int = 0) -> int:
    """How many pieces the batch-statistics kernel cuts the reduced rows into: by planes, about
    1024 blocks in all, none under 8192 elements; lanes along c, about 1024 blocks of 32 channels
    (``vec`` channels a lane: of min(c / vec, 256) lanes), none under 64 rows. (Under 65536 rows
    that is rows / 64 pieces, linear in a batch: a dynamic program's plan stays one bucket.)"""
    if planes:
        return max(1, min(-(-1024 // c), rows // 8192))
    if vec:
        tiles = -(-(c // vec) // min(c // vec, 256))
    else:
        tiles = max(1, (c + 31) // 32)
    want = max(1, 1024 // tiles)
    per = max(64, -(-rows // want))
    return max(1, min(65535, -(-rows // per)))


def bn_vec_width(vx: View, c: int, sn: int, sc: int, ss: int) -> int:
    """Channels a lane of batch_norm.cuh's launch_bn_partial_lanes (16 bytes of them) when the
    view meets its terms but for the pointer's alignment (checked when it runs), else 0."""
    v = 16 // SIZES[vx.dtype]
    return v if sc == 1 and c % v == 0 and sn % v == 0 and ss % v == 0 and vx.offset % v == 0 else 0


#: reduce.cuh's kRowSplitMinCols and kRowMaxSplits: a layer / rms norm row this long may split.


def _channels_last(vx: View, samples: int) -> tuple[int, int, int] | None:
    """(positions, sample stride, position stride) when x [samples, C, ...] has unit channel
    stride and its positions fold into one strided dim (channels-last); None otherwise."""
    if len(vx.shape) < 3 or vx.strides[1] != 1 or vx.shape[1] < 2 or not 1 <= samples <= 65535:
        return None
    sp = L.collapse(vx.shape[2:], vx.strides[2:])
    if sp is None or sp[0] < 2:
        return None
    return sp[0], vx.strides[0], sp[1]


def lower_group(lw, pr: GroupStatsProto, pre: list) -> None:
    vx = lw.read(pr.x, pre, pr.phase)
    c = pr.groups * pr.cpg
    rows = pr.samples * pr.groups
    cols = vx.numel // rows if rows else 0
    v2 = L.reshape(vx, (rows, cols)) if vx.numel else None
    rc = L.rows_cols(v2, 1) if v2 is not None else None
    cl = _channels_last(vx, pr.samples) if rc is None and vx.dtype in FLOAT_DTYPES else None
    if cl is not None:  # read in place, lanes along the channels
        _lower_group_cl(lw, pr, pre, vx, cl)
        return
    if rc is None or vx.dtype not in FLOAT_DTYPES:
        cc = lw.copy_contiguous(pr.x, vx, pre, pr.phase, why="group statistics read rows with unit stride",
                                dtype=vx.dtype if vx.dtype in FLOAT_DTYPES else "float32")
        v2 = L.reshape(lw.views[cc], (rows, cols))
        rc = L.rows_cols(v2, 1)
    _, _, ldi = rc

    w, b = group_vectors(lw, pr, pre)
    scale = lw.out_view(pr, pr.scale, lambda tv: False)
    shift = lw.out_view(pr, pr.shift, lambda tv: False)
    splits = group_splits(rows, cols)
    wt = lw.alloc.add_tensor(f"{pr.scale}_ws", (rows * splits * 3,), "float32")
    ws = lw.alloc.fresh(wt, "float32", (rows * splits * 3,), pr.phase)
    lw.views[wt] = ws
    n = pr.samples * c
    spec = GroupStatsSpec("group_stats", v2, ldi, rows, cols, pr.groups, pr.cpg, w, b, float(pr.eps),
                          L.reshape(scale, (n,)), L.reshape(shift, (n,)), ws, splits)
    lw.add(pr, pr.name, spec, [v2, w, b], [scale, shift, ws], touched=list(pr.ins))


def group_vectors(lw, pr: GroupNormProto, pre: list) -> tuple[View | None, View | None]:
    """The weight and bias as channel vectors, in one dtype."""
    c = pr.groups * pr.cpg
    w = lw.channel_vector(pr.weight, c, pre, pr.phase)
    b = lw.channel_vector(pr.bias, c, pre, pr.phase)
    if w is not None and b is not None and w.dtype != b.dtype:
        cc = lw.copy_contiguous(pr.bias, b, pre, pr.phase, why="bias in the weight's dtype", dtype=w.dtype)
        b = L.reshape(lw.views[cc], (c,))
    return w, b


def _lower_group_cl(lw, pr: GroupStatsProto, pre: list, vx: View, cl: tuple[int, int, int]) -> None:
    s, sn, ss = cl
    c = pr.groups * pr.cpg
    w, b = group_vectors(lw, pr, pre)
    scale = lw.out_view(pr, pr.scale, lambda tv: False)
    shift = lw.out_view(pr, pr.shift, lambda tv: False)
    splits = group_cl_splits(pr.samples, c, s, bn_vec_width(vx, c, sn, 1, ss))
    size = pr.samples * splits * c * 3
    wt = lw.alloc.add_tensor(f"{pr.scale}_ws", (size,), "float32")
    ws = lw.alloc.fresh(wt, "float32", (size,), pr.phase)
    lw.views[wt] = ws
    n = pr.samples * c
    spec = GroupStatsSpec("group_stats", vx, 0, pr.samples * pr.groups, vx.numel // max(1, pr.samples * pr.groups),
                          pr.groups, pr.cpg, w, b, float(pr.eps), L.reshape(scale, (n,)), L.reshape(shift, (n,)), ws,
                          splits, channels_last=True, s=s, sn=sn, ss=ss)
    lw.add(pr, pr.name, spec, [vx, w, b], [scale, shift, ws], touched=list(pr.ins))


def group_cl_splits(samples: int, channels: int, s: int, vec: int = 0) -> int:
    """Pieces of each sample's positions in the channels-last statistics: about 1024 blocks in all
    (32 channels a block; ``vec`` channels a lane: min(channels / vec, 256) lanes a block), none
    under 512 positions."""
    tiles = -(-(channels // vec) // min(channels // vec, 256)) if vec else -(-channels // 32)
    return max(1, min(-(-1024 // (tiles * samples)), s // 512, 65535))


def group_splits(rows: int, cols: int) -> int:
    """How many pieces the group-statistics kernel cuts each row into: enough blocks to fill a
    large GPU, each piece at least 4096 elements (norm.cuh's kGroupStatsThreads * 16)."""
    want = max(1, -(-1024 // max(rows, 1)))
    return max(1, min(want, -(-cols // 4096)))


# ---------------------------------------------------------------------- cost, interpret, render


def cost_bn(spec: BnStatsSpec, ceil) -> tuple[float, float, float]:
    n = spec.n * spec.c * spec.s
    stats = (spec.running_mean, spec.running_var) if spec.mode != "batch" else ()
    reads = sum(view_bytes(v) for v in (spec.x, spec.weight, spec.bias) + stats)
    return float((4 + len(spec.prologue)) * n), float(reads + view_bytes(spec.scale) + view_bytes(spec.shift)), ceil.fp32


def cost_group(spec: GroupStatsSpec, ceil) -> tuple[float, float, float]:
    reads = sum(view_bytes(v) for v in (spec.x, spec.weight, spec.bias))
    return float(4 * spec.rows * spec.cols), float(reads + view_bytes(spec.scale) + view_bytes(spec.shift)), ceil.fp32


def interpret_bn(mem, b: BnStatsSpec) -> None:
    import torch

    if b.mode == "batch":
        x = mem.hook(b.prologue, mem.read(b.x, (b.n, b.c, b.s), (b.sn, b.sc, b.ss)))
        mean = x.mean((0, 2))
        var = ((x - mean[None, :, None]) ** 2).mean((0, 2))
    else:
        mean = mem.read(b.running_mean, (b.c,), (1,))
        var = mem.read(b.running_var, (b.c,), (1,))
    w = mem.read(b.weight, (b.c,), (1,)) if b.weight is not None else torch.ones(b.c, dtype=torch.float64, device=mem.device)
    bias = mem.read(b.bias, (b.c,), (1,)) if b.bias is not None else torch.zeros(b.c, dtype=torch.float64, device=mem.device)
    scale = w * torch.rsqrt(var + b.eps)
    mem.write(b.scale, scale, (b.c,), (1,))
    mem.write(b.shift, bias - mean * scale, (b.c,), (1,))


def interpret_group(mem, g: GroupStatsSpec) -> None:
    import torch

    assert g.rows <= 0 or g.cols >= 1, "norm.cuh: launch_group_stats refuses cols < 1"
    if g.channels_last:  # x[n * sn + c + j * ss] -> rows of (sample, group), channel-major within
        samples, c = g.rows // g.groups, g.groups * g.cpg
        x = mem.read(g.x, (samples, g.groups, g.cpg, g.s), (g.sn, g.cpg, 1, g.ss)).reshape(g.rows, g.cpg * g.s)
    else:
        x = mem.read(g.x, (g.rows, g.cols), (g.ldi, 1))
    mean = x.mean(1)
    var = ((x - mean[:, None]) ** 2).mean(1)
    rstd = torch.rsqrt(var + g.eps)
    c = g.groups * g.cpg
    ch = (torch.arange(g.rows, device=mem.device) % g.groups)[:, None] * g.cpg + \
        torch.arange(g.cpg, device=mem.device)[None, :]
    w = mem.read(g.weight, (c,), (1,))[ch] if g.weight is not None else torch.ones_like(ch, dtype=torch.float64)
    b = mem.read(g.bias, (c,), (1,))[ch] if g.bias is not None else torch.zeros_like(ch, dtype=torch.float64)
    scale = w * rstd[:, None]
    n = g.rows * g.cpg
    mem.write(g.scale, scale.reshape(-1), (n,), (1,))
    mem.write(g.shift, (b - mean[:, None] * scale).reshape(-1), (n,), (1,))


def render_bn(t, b: BnStatsSpec, n, fn: str) -> tuple[list[str], list[str]]:
    sc, sh = n("scale"), n("shift")
    tw = ctype((b.weight or b.bias or b.running_mean or b.scale).dtype)
    wp = n.opt("weight", f"static_cast<const {tw}*>(nullptr)")
    bp = n.opt("bias", f"static_cast<const {tw}*>(nullptr)")
    blocks = (b.c + 255) // 256
    done = f'  return cuda_check(cudaGetLastError(), "{t.name}");'
    if b.mode == "running":
        return cxx.include("batch_norm.cuh"), [
            f"  stitch::bn_running_kernel<<<{blocks}, 256, 0, stream>>>({n('running_mean')}, {n('running_var')}, "
            f"{wp}, {bp}, {b.c}, {cxx.flit(b.eps)}, {sc}, {sh});", done]
    rows = b.n * b.s
    per = -(-rows // b.splits)
    ws = n("workspace")
    pre, pro = (cxx.hook(f"{fn}_pro", b.prologue), f"{fn}_pro{{}}") if b.prologue else ([], "stitch::Identity{}")
    if b.by_planes:
        first = [f"  const dim3 grid({b.c}, {b.splits});",
                 f"  stitch::bn_plane_partial_kernel<<<grid, 256, 0, stream>>>({n('x')}, {b.n}, {b.c}, {b.s}, "
                 f"{b.sn}, {b.sc}, {per}, {ws}, {pro});",
                 f'  ST_TRY(cuda_check(cudaGetLastError(), "{t.name}"));']
    else:  # (the launcher returns the launch's status itself)
        first = [f"  ST_TRY(cuda_check(stitch::launch_bn_partial_lanes({n('x')}, {b.n}, {b.c}, {b.s}, {b.sn}, {b.sc}, "
                 f"{b.ss}, {per}, {b.splits}, {ws}, {pro}, stream), \"{t.name}\"));"]
    return cxx.include("batch_norm.cuh") + pre, first + [
        f"  stitch::bn_finish_kernel<<<{b.c}, 128, 0, stream>>>({ws}, {b.splits}, {b.c}, {wp}, {bp}, "
        f"{cxx.flit(b.eps)}, {sc}, {sh});", done]


def render_group(t, g: GroupStatsSpec, n, fn: str) -> tuple[list[str], list[str]]:
    tw = ctype((g.weight or g.bias or g.scale).dtype)
    null = f"static_cast<const {tw}*>(nullptr)"
    if g.channels_last:
        call = (f"stitch::launch_group_stats_cl<{ctype(g.x.dtype)}, {tw}>({n('x')}, {g.rows // g.groups}, {g.s}, "
                f"{g.sn}, {g.ss}, {g.groups}, {g.cpg}, {n.opt('weight', null)}, {n.opt('bias', null)}, "
                f"{cxx.flit(g.eps)}, {n('scale')}, {n('shift')}, {n('workspace')}, {g.splits}, stream)")
        return cxx.include("norm.cuh"), cxx.call(t.name, call)
    call = (f"stitch::launch_group_stats<{ctype(g.x.dtype)}, {tw}>({n('x')}, {g.ldi}, {g.rows}, {g.cols}, "
            f"{g.groups}, {g.cpg}, {n.opt('weight', null)}, {n.opt('bias', null)}, {cxx.flit(g.eps)}, {n('scale')}, "
            f"{n('shift')}, {n('workspace')}, {g.splits}, stream)")
    return cxx.include("norm.cuh"), cxx.call(t.name, call)


BN_STATS = TaskKind("bn_stats", BnStatsSpec, "custom_kernel", cost_bn, interpret_bn, render_bn,
                    lowers=((BnStatsProto, lower_bn),), claims=(ClaimRule("match", 30, claim),),
                    writes=frozenset({"scale", "shift"}))
GROUP_STATS = TaskKind("group_stats", GroupStatsSpec, "reduction_template", cost_group, interpret_group,
                       render_group, lowers=((GroupStatsProto, lower_group),), writes=frozenset({"scale", "shift"}))

__all__ = ["BnStatsSpec", "GroupStatsSpec", "BnStatsProto", "GroupNormProto", "GroupStatsProto", "bn_by_planes", "group_splits",
           "BN_STATS", "GROUP_STATS"]
