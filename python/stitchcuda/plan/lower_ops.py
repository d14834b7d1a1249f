"""Lowering the other protos: elementwise groups, row and axis reductions, attention (and its
mask summary), batch statistics and concatenation.

Takes a proto and the :class:`~.lower.Lowerer`; gives its task(s) with an
:class:`~.specs.EwSpec`, :class:`~.specs.RowSpec`, :class:`~.specs.AxisSpec`,
:class:`~.specs.AttentionSpec` (+ a create-time :class:`~.specs.AttentionMaskBlocksSpec` for a
constant mask), :class:`~.specs.BnStatsSpec` or :class:`~.specs.CopySpec`. Inputs whose layout
a kernel cannot read are copied first; a reduction whose output layout the kernel cannot write
writes rows into a fresh buffer and a copy puts them back.
"""

from __future__ import annotations

import dataclasses
import math

from .. import layout as L
from ..layout import View
from ..precision import get as get_policy
from .buffers import ident
from .cost import ATTENTION_MASK_CELL
from .lower import Lowerer, copy_item
from .protos import AttnProto, AxisProto, BnStatsProto, CatProto, EwProto, RowProto
from .specs import (AttentionMaskBlocksSpec, AttentionSpec, AxisSpec, BnStatsSpec, CopySpec, EwInstr, EwSpec, RowSpec,
                    Task, bn_by_planes)

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


def emit_ew(lw: Lowerer, pr: EwProto, pre: list[Task]) -> None:
    out_t = pr.outs[0]
    nodes = [lw.ix.nodes[x] for x in pr.members]
    shape = lw.shape(out_t)
    leaves: list[str] = []
    refs: dict[str, str] = {}
    instrs: list[EwInstr] = []

    def ref(t: str) -> str:
        if t in refs:
            return refs[t]
        if t not in leaves:
            leaves.append(t)
        return f"a{leaves.index(t)}"

    for nd in nodes:
        operands = {t: refs.get(t) or ref(t) for t in nd.inputs}
        new = lw.lower_ew(nd, operands, len(instrs))
        if new is None:
            raise lw.fail(nd, "no elementwise translation")
        instrs.extend(new)
        refs[nd.outputs[0].name] = f"t{len(instrs) - 1}"
    if pr.final is not None:
        src = refs.get(pr.root) or ref(pr.root)
        fin = pr.final
        instrs.append(EwInstr(fin.op, tuple(src if a == "x" else a for a in fin.args), fin.consts))
    elif not nodes:
        instrs.append(EwInstr("copy", (ref(pr.root),)))
    ins = [L.broadcast_to(lw.read(t, pre, pr.phase), shape) for t in leaves]
    # Written in place over an input that dies here, when no other input reads that buffer
    # through another layout (each element is read before it is written, by one thread).
    cands = []
    for t, v in zip(leaves, ins):
        if t in lw.materialized and lw.shape(t) == shape and all(
                w.buffer != v.buffer or (w.offset == v.offset and w.strides == v.strides) for w in ins):
            cands.append(t)
    vo = lw.out_view(pr, out_t, lambda tv: len(L.coalesce(tv.shape, tv.strides)[0]) <= 6, inplace=cands)
    if not ins:
        # A constant: the template needs one input to drive it; it reads (and ignores) one
        # element of the output.
        ins.append(dataclasses.replace(vo, strides=(0,) * len(shape)))
    cshape, cstr = L.coalesce(shape, vo.strides, *[v.strides for v in ins])
    if len(cshape) > 6:
        raise lw.fail(nodes[0] if nodes else lw.ix.node(pr.nodes[0]), "elementwise layout with more than 6 dims")
    spec = EwSpec("elementwise", vo, tuple(ins), tuple(instrs), cshape, cstr[0], tuple(cstr[1:]))
    reads = ins if leaves else []
    lw.add(pr, pr.name, "elementwise_kernel", spec, reads, [vo], touched=list(pr.ins) + leaves + [out_t] +
              [o.name for nd in nodes for o in nd.outputs])


# ---------------------------------------------------------------------- row / axis reductions


def emit_row(lw: Lowerer, pr: RowProto, pre: list[Task]) -> None:
    op = pr.op
    x_t, out_t = pr.x, pr.out
    k = pr.k
    writes_row = op in ("softmax", "log_softmax", "layer_norm", "rms_norm")
    pro, epi = _with_op(lw, pr)
    vx = lw.read(x_t, pre, pr.phase)
    perm = pr.perm
    if perm is not None:
        vx = L.permute(vx, perm)
    if k == 0:
        vx = L.unsqueeze(vx, vx.ndim)
        k = 1
    rc = L.rows_cols(vx, k)
    if rc is None or vx.dtype not in _FLOAT_DTYPES:
        # (integer and boolean tensors are reduced as float32: exact counts below 2^24)
        c = lw.copy_contiguous(x_t, vx, pre, pr.phase, why=f"{op} reads rows with unit stride",
                                  shape_view=vx, dtype=None if vx.dtype in _FLOAT_DTYPES else "float32")
        vx = lw.views[c]
        rc = L.rows_cols(vx, k)
    rows, cols, ldi = rc

    if writes_row:
        def accept(tv: View) -> bool:  # a permuted reduction writes through a copy: any layout
            return (perm is not None or L.rows_cols(tv, k) is not None) and tv.dtype in _FLOAT_DTYPES
        same = perm is None and x_t in lw.materialized and lw.shape(x_t) == lw.shape(out_t)
        vo = lw.out_view(pr, out_t, accept, inplace=[x_t] if same else [])
        wo = L.permute(vo, perm) if perm is not None else vo
        post = None
        if L.rows_cols(wo, k) is None:
            tmp = lw.alloc.add_tensor(f"{out_t}_rows", wo.shape, vo.dtype)
            wo = lw.alloc.fresh(tmp, vo.dtype, wo.shape, pr.phase)
            lw.views[tmp] = wo
            post = (wo, vo)
        _, _, ldo = L.rows_cols(wo, k)
    else:
        def accept(tv: View) -> bool:
            return L.collapse(tv.shape, tv.strides) is not None and tv.dtype in _FLOAT_DTYPES
        vo = lw.out_view(pr, out_t, accept)
        wo = vo
        post = None
        cl = L.collapse(vo.shape, vo.strides)
        if cl is None or vo.dtype not in _FLOAT_DTYPES:
            dt = vo.dtype if vo.dtype in _FLOAT_DTYPES else "float32"  # an integer result goes through a cast
            tmp = lw.alloc.add_tensor(f"{out_t}_rows", vo.shape, dt)
            wo = lw.alloc.fresh(tmp, dt, vo.shape, pr.phase)
            lw.views[tmp] = wo
            post = (wo, vo)
            cl = L.collapse(wo.shape, wo.strides)
        ldo = cl[1] if rows > 1 else 1
    weight = bias = None
    tw = None
    for key in ("weight", "bias"):
        t = getattr(pr, key)
        if not t:
            continue
        v = lw.read(t, pre, pr.phase)
        v2 = L.reshape(v, (cols,)) if v.numel == cols else None
        if v2 is None or (cols > 1 and v2.strides[0] != 1) or (tw and v2.dtype != tw):
            c = lw.copy_contiguous(t, v, pre, pr.phase, why=f"{op} {key} must be contiguous",
                                      dtype=tw or v.dtype)
            v2 = L.reshape(lw.views[c], (cols,))
        tw = v2.dtype
        if key == "weight":
            weight = v2
        else:
            bias = v2
    eps = float(pr.eps)
    unbiased = False
    if op == "var":
        corr = pr.correction
        if corr == 1.0:
            unbiased = True
        elif corr != 0.0:
            # m2 / (cols - c) == (m2 / cols) * cols / (cols - c)
            factor = cols / (cols - corr) if cols != corr else math.inf
            epi = (EwInstr("mul", ("a0", "c0"), (factor,)),) + tuple(_shift_instr(i, 1) for i in epi)
    ws, ws_floats = None, 0
    if op in ("layer_norm", "rms_norm") and pr.strategy != "single":
        ws_floats = row_workspace_floats(rows, cols)
    if ws_floats:  # few, long rows may split over blocks (reduce.cuh: row_reduce_workspace_floats)
        wt = lw.alloc.add_tensor(f"{out_t}_ws", (ws_floats,), "float32")
        ws = lw.alloc.fresh(wt, "float32", (ws_floats,), pr.phase)
        lw.views[wt] = ws
    spec = RowSpec("row", op, vx, ldi, wo, ldo, rows, cols, weight, bias, eps, unbiased, pro, epi, ws, ws_floats)
    reads = [vx, weight, bias]
    lw.add(pr, pr.name, "reduction_template", spec, reads, [wo] + ([ws] if ws else []), touched=list(pr.ins) + [out_t, x_t] +
              list(pr.pro + pr.epi) + [lw.ix.nodes[nm].outputs[0].name for nm in pr.pro + pr.epi])
    if post is not None:
        src, dst = post
        if perm is not None and writes_row:  # (a per-row result holds none of the dims moved last)
            src = L.permute(src, L.inverse_permutation(perm))
        lw.tasks.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), src, dst, pr.phase,
                                          note="writes the rows back in the reference's layout"))


def emit_axis(lw: Lowerer, pr: AxisProto, pre: list[Task]) -> None:
    x_t, out_t = pr.x, pr.out
    d0, d1 = pr.d0, pr.d1
    pro, epi = _with_op(lw, pr)
    vx = lw.read(x_t, pre, pr.phase)

    def groups(v: View):
        return (L.collapse(v.shape[:d0], v.strides[:d0]), L.collapse(v.shape[d0:d1], v.strides[d0:d1]),
                L.collapse(v.shape[d1:], v.strides[d1:]))

    gs = groups(vx)
    if any(g is None for g in gs) or vx.dtype not in _FLOAT_DTYPES:
        c = lw.copy_contiguous(x_t, vx, pre, pr.phase, why="reduction groups must collapse",
                               dtype=None if vx.dtype in _FLOAT_DTYPES else "float32")
        vx = lw.views[c]
        gs = groups(vx)
    (outer, so), (red, sr), (inner, si) = gs
    xs = vx.shape
    ow = d0

    def out_groups(v: View):
        if len(v.shape) == len(xs):  # keepdim
            return L.collapse(v.shape[:d0], v.strides[:d0]), L.collapse(v.shape[d1:], v.strides[d1:])
        return L.collapse(v.shape[:ow], v.strides[:ow]), L.collapse(v.shape[ow:], v.strides[ow:])

    vo = lw.out_view(pr, out_t, lambda tv: all(g is not None for g in out_groups(tv)) and
                        tv.dtype in _FLOAT_DTYPES)
    post = None
    if vo.dtype not in _FLOAT_DTYPES:  # an integer result: reduced in float32, then cast
        tmp = lw.alloc.add_tensor(f"{out_t}_f32", vo.shape, "float32")
        post = (lw.alloc.fresh(tmp, "float32", vo.shape, pr.phase), vo)
        lw.views[tmp] = post[0]
        vo = post[0]
    (o_o, out_so), (o_i, out_si) = out_groups(vo)
    if inner <= 1:
        si, out_si = 1, 1
    if outer <= 1:
        so, out_so = 0, 0
    ws_floats = _axis_workspace_floats(outer, red, inner, si, so, sr, vx.itemsize)
    ws = None
    if ws_floats:
        wt = lw.alloc.add_tensor(f"{out_t}_ws", (ws_floats,), "float32")
        ws = lw.alloc.fresh(wt, "float32", (ws_floats,), pr.phase)
        lw.views[wt] = ws
    spec = AxisSpec("axis", pr.op, vx, outer, red, inner, so, sr, si, vo, out_so, out_si, ws, ws_floats,
                    pro, epi)
    lw.add(pr, pr.name, "reduction_template", spec, [vx], [vo] + ([ws] if ws else []),
              touched=list(pr.ins) + [out_t, x_t])
    if post is not None:
        lw.tasks.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), post[0], post[1], pr.phase,
                                     note="casts the float32 result to the reference's dtype"))


# ---------------------------------------------------------------------- attention


def emit_attn(lw: Lowerer, pr: AttnProto, pre: list[Task]) -> None:
    st = lw.storage
    vq = lw.read(pr.q, pre, pr.phase)
    vk = lw.read(pr.k, pre, pr.phase)
    if pr.k_transposed:  # the pattern multiplied by kᵀ: read k through a transpose
        vk = L.transpose(vk, -1, -2)
    vv = lw.read(pr.v, pre, pr.phase)
    names = (pr.q, pr.k, pr.v)

    def four(v: View) -> View:
        return L.unsqueeze(v, 0) if v.ndim == 3 else v

    def fix(v: View, name: str) -> View:
        v4 = four(v)
        if v4.dtype != st or v4.strides[-1] != 1:
            c = lw.copy_contiguous(name, v, pre, pr.phase, why="attention reads rows with unit stride", dtype=st)
            v4 = four(lw.views[c])
        return v4

    q4, k4, v4 = fix(vq, names[0]), fix(vk, names[1]), fix(vv, names[2])
    out_t = pr.out

    def accept(tv: View) -> bool:
        return tv.dtype == st and four(tv).strides[-1] == 1

    vo = lw.out_view(pr, out_t, accept)
    o4 = four(vo)
    B, H, lq, d = q4.shape
    lk = k4.shape[2]
    mask_v, mask_kind = None, pr.mask_kind
    if pr.mask:
        mv = lw.read(pr.mask, pre, pr.phase)
        try:
            mv4 = L.broadcast_to(mv, (B, H, lq, lk))
        except ValueError:
            raise lw.fail(lw.ix.node(pr.nodes[0]), "attention mask does not broadcast to the scores")
        if mask_kind == "bool" and mv4.dtype not in ("bool", "uint8", "int8"):
            raise lw.fail(lw.ix.node(pr.nodes[0]), "boolean attention mask of another dtype")
        if mask_kind in ("add_same", "add_f32"):
            want = st if mask_kind == "add_same" else "float32"
            if mv4.dtype != want:  # a constant mask is cast once, at create
                phase = "create" if lw.buffers[mv.buffer].kind in ("weight", "const") else pr.phase
                c = lw.copy_contiguous(pr.mask, mv, pre, phase, why="additive mask dtype", dtype=want)
                mv4 = L.broadcast_to(lw.views[c], (B, H, lq, lk))
        mask_v = mv4
    blocks_v = None
    if mask_v is not None and lw.buffers[mask_v.buffer].kind in ("weight", "const"):
        blocks_v = mask_blocks(lw, pr, mask_v, mask_kind, B, H, lq, lk, pre)
    tf32 = get_policy(pr.policy or lw.f.policy).tf32 and st == "float32"
    spec = AttentionSpec("attention", q4, k4, v4, o4, B, H, lq, lk, d, int(pr.heads_per_kv),
                         float(pr.scale), bool(pr.causal), 0, mask_kind, mask_v,
                         tf32, blocks_v)
    lw.add(pr, pr.name, "attention_template", spec, [q4, k4, v4, mask_v, blocks_v], [o4],
              touched=list(pr.ins) + [out_t] + list(names))


def mask_blocks(lw: Lowerer, pr: AttnProto, mv4: View, kind: str, B: int, H: int, lq: int, lk: int,
                 pre: list[Task]) -> View:
    """A create-time task summarising a constant mask per 64 x 32 cell (which key tiles the
    kernel may skip, which it must mask); the summary's view, broadcast like the mask."""
    cq, ck = ATTENTION_MASK_CELL
    nb = B if B > 1 and mv4.strides[0] != 0 else 1
    nh = H if H > 1 and mv4.strides[1] != 0 else 1
    shape = (nb, nh, -(-lq // cq), -(-lk // ck))
    name = lw.alloc.add_tensor(f"{ident(pr.name)}_mask_blocks", shape, "uint8")
    v = lw.alloc.fresh(name, "uint8", shape, "create")
    lw.views[name] = v
    vb = L.broadcast_to(v, (B, H) + shape[2:])
    spec = AttentionMaskBlocksSpec("attention_mask_blocks", mv4, kind, lw.storage, B, H, lq, lk, vb)
    pre.append(Task(f"mask_blocks_{ident(pr.name)}", "attention_template", (), (mv4.buffer,), (v.buffer,), spec,
                    phase="create", note="which key tiles the constant mask hides (skipped) or cuts (masked)"))
    return vb


# ---------------------------------------------------------------------- batch norm statistics


def emit_bn_stats(lw: Lowerer, pr: BnStatsProto, pre: list[Task]) -> None:
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
        splits = _bn_splits(n * s, c, bn_by_planes(s, ss))
        wt = lw.alloc.add_tensor(f"{pr.scale}_ws", (splits * c * 3,), "float32")
        ws = lw.alloc.fresh(wt, "float32", (splits * c * 3,), pr.phase)
        lw.views[wt] = ws
    spec = BnStatsSpec("bn_stats", pr.mode, vx, n, c, s, sn, sc, ss, w, b, rm, rv, pr.eps,
                       L.reshape(scale, (c,)), L.reshape(shift, (c,)), ws, splits)
    lw.add(pr, pr.name, "custom_kernel", spec, [vx, w, b, rm, rv], [scale, shift] + ([ws] if ws else []),
              touched=pr.ins)


# ---------------------------------------------------------------------- cat


def emit_cat(lw: Lowerer, pr: CatProto, pre: list[Task]) -> None:
    out_t = pr.outs[0]
    vo = lw.out_view(pr, out_t, lambda tv: True)
    dim = pr.dim
    off = 0
    items = []
    reads = []
    for x in pr.parts:
        size = lw.shape(x)[dim] if lw.shape(x) else 1
        dst = L.slice_(vo, dim, off, off + size)
        off += size
        vx = lw.read(x, pre, pr.phase)
        if vx.buffer == dst.buffer and vx.offset == dst.offset and L.same_strides(vx.shape, vx.strides, dst.strides):
            continue  # its producer wrote it in place
        items.append(copy_item(vx, dst))
        reads.append(vx)
    if items:
        lw.add(pr, pr.name, "copy", CopySpec("copy", tuple(items)), reads, [vo], touched=list(pr.ins) + [out_t])
    else:
        # every part was written in place: the producers' tasks cover the cat
        lw.cats_in_place.append((pr.nodes[0], list(pr.parts)))
        lw.views[out_t] = vo


# ---------------------------------------------------------------------- helpers


def _with_op(lw: Lowerer, pr: RowProto | AxisProto) -> tuple[tuple[EwInstr, ...], tuple[EwInstr, ...]]:
    """A reduction's prologue and epilogue: its hook nodes' instructions around the op's own
    transforms (prologue hook, then the op's; the op's, then the epilogue hook)."""
    from .lower_tail import chain

    return chain(lw.hook(pr.pro), pr.op_pro), chain(pr.op_epi, lw.hook(pr.epi))


def _shift_instr(i: EwInstr, by: int) -> EwInstr:
    return EwInstr(i.op, tuple(f"t{int(x[1:]) + by}" if x.startswith("t") else ("t0" if x == "a0" else x)
                               for x in i.args), i.consts)


def _bn_splits(rows: int, c: int, planes: bool) -> int:
    """How many pieces the batch-statistics kernel cuts the reduced rows into: by planes, about
    1024 blocks in all, none under 8192 elements; lanes along c, about 1024 slices of 32 channels."""
    if planes:
        return max(1, min(-(-1024 // c), rows // 8192))
    tiles = max(1, (c + 31) // 32)
    want = max(1, 1024 // tiles)
    per = max(64, -(-rows // want))
    return max(1, -(-rows // per))


#: reduce.cuh's kRowSplitMinCols and kRowMaxSplits: a layer / rms norm row this long may split.
ROW_SPLIT_MIN_COLS, ROW_MAX_SPLITS = 32768, 256
#: Below this many rows a split can pay (every SM of a large GPU already has a row past it).
ROW_SPLIT_MAX_ROWS = 1024


def row_workspace_floats(rows: int, cols: int) -> int:
    """reduce.cuh's row_reduce_workspace_floats, for the shapes worth splitting (0 otherwise)."""
    if cols < ROW_SPLIT_MIN_COLS or not 0 < rows < ROW_SPLIT_MAX_ROWS:
        return 0
    return rows * ROW_MAX_SPLITS * 3


def _axis_workspace_floats(outer: int, red: int, inner: int, si: int, so: int, sr: int, itemsize: int) -> int:
    """Upper bound of reduce.cuh's reduce_axis_workspace_floats over both vector widths."""
    if outer <= 0 or inner <= 0 or red < 1:
        return 0
    best = 0
    for vec in (1, 16 // itemsize):
        if vec > 1 and not (si == 1 and inner % vec == 0 and so % vec == 0 and sr % vec == 0):
            continue
        ivec = inner // vec if vec else inner
        bx = 32 if ivec >= 32 else 1 << max(0, (max(ivec, 1) - 1).bit_length())
        tiles = outer * (-(-ivec // bx))
        max_by = 256 // bx
        splits = 1
        if tiles < 512:
            by_rows = -(-red // (max_by * 8))
            want = -(-1024 // max(tiles, 1))
            splits = max(1, min(want, by_rows))
        rps = -(-red // splits)
        splits = -(-red // rps)
        if splits > 1:
            best = max(best, splits * outer * inner)
    return best


__all__ = ["emit_ew", "emit_row", "emit_axis", "emit_attn", "emit_bn_stats", "emit_cat"]
