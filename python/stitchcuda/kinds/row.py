"""Row reductions through reduce.cuh: softmax, log-softmax, layer / RMS norm, sum, mean, max, min,
var, logsumexp and vector norms over the trailing dims (reductions over a middle run of dims are
:mod:`.axis`'s, and are claimed here).

Claim (*match*): RMS norm written out (``x * rsqrt(mean(x²) + eps) [* w]``, or ``x / sqrt(...)``)
and logsumexp written out (``m + log(sum(exp(x - m)))``) become one row reduction each. Claim
(*fuse*): every other reduction takes the unary elementwise ops before it as a prologue hook and
after it as an epilogue hook; a reduction over trailing dims is a row reduction, over a contiguous
run of middle dims (or a whole large tensor to one value) an axis reduction, and otherwise rows
after a permuting copy (moved back for ops that write a row; a softmax over a middle run of dims
that lie where the axis softmax can read them is lowered to :class:`~.axis.AxisRowSpec` instead).

Lowering: inputs whose rows are not unit-stride are copied first; a reduction whose output layout
the kernel cannot write writes rows into a fresh buffer and a copy puts them back; few, long rows of
a layer / RMS norm, and a long reduced axis, may split over blocks through a workspace.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .. import layout as L
from .. import ops
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .axis import AxisProto, emit_axis_row, emit_in_memory_order, kept_in_memory_order
from .base import FLOAT_DTYPES, ClaimRule, Proto, TaskKind, hooked_touched, reduction_hooks, view_bytes

A = ops.A
#: A reduction of a whole tensor at least this large to one value runs on the axis template,
#: which splits it over many blocks (the row template gives one row one block).
WHOLE_AXIS = 1 << 16


@dataclass(frozen=True)
class RowSpec:
    """A row reduction of reduce.cuh over rows x cols (``ldi`` / ``ldo`` leading dims; for a
    per-row result ``ldo`` is the stride between results). ``prologue`` / ``epilogue`` are
    single-input expressions (input ``a0``) applied before / after the reduction. A layer / rms
    norm with a ``workspace`` (fp32, ``workspace_floats``) may split few, long rows over many
    blocks (reduce.cuh decides by the device's SM count)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "row")

    kind: str
    op: str
    x: View
    ldi: int
    out: View
    ldo: int
    rows: int
    cols: int
    weight: View | None = None
    bias: View | None = None
    eps: float = 0.0
    unbiased: bool = False
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()
    workspace: View | None = None
    workspace_floats: int = 0


@dataclass(frozen=True)
class RowProto(Proto):
    """A row reduction over the last ``k`` dims (after ``perm`` when the reduced dims were not
    trailing), with unary prologue / epilogue hooks (node names)."""

    op: str = ""
    x: str = ""
    out: str = ""
    k: int = 1
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()
    weight: str | None = None
    bias: str | None = None
    eps: float = 0.0
    correction: float = 1.0
    perm: tuple[int, ...] | None = None
    writes_row: bool = False
    strategy: str = "auto"
    #: The op's own transforms of one value (instructions on ``a0``), applied after the prologue
    #: hook and before the epilogue hook (a vector norm: |x|^p before a sum, ^(1/p) after it).
    op_pro: tuple[EwInstr, ...] = ()
    op_epi: tuple[EwInstr, ...] = ()


# ---------------------------------------------------------------------- claim


def claim_rms(cx) -> None:
    ix = cx.ix
    for n in list(ix.g.nodes):
        if n.op in (A + "rsqrt.default", A + "sqrt.default") and cx.free(n):
            _rms(cx, n)


def _rms(cx, r: Node) -> None:
    """x * rsqrt(mean(x^2, -1, keepdim) + eps) [* w]  (also x / sqrt(...))."""
    ix = cx.ix
    add = ix.producer.get(r.inputs[0])
    if add is None or add.op != A + "add.Tensor" or len(add.inputs) != 1 or not cx.free(add):
        return
    eps = add.scalar("other")
    if eps is None or ix.only_user(add.outputs[0].name) is None:
        return
    mean = ix.producer.get(add.inputs[0])
    if mean is None or mean.op != A + "mean.dim" or not mean.attr("keepdim") or not cx.free(mean):
        return
    if ix.only_user(mean.outputs[0].name) is None:
        return
    sq = ix.producer.get(mean.inputs[0])
    if sq is None or not cx.free(sq) or ix.only_user(sq.outputs[0].name) is None:
        return
    if sq.op == A + "pow.Tensor_Scalar" and sq.scalar("exponent") == 2.0:
        x = sq.inputs[0]
    elif sq.op == A + "mul.Tensor" and len(sq.inputs) == 2 and sq.inputs[0] == sq.inputs[1]:
        x = sq.inputs[0]
    else:
        return
    xs = ix.shape(x)
    dims = mean.attr("dim")
    if not xs or dims is None or len(dims) != 1 or L.norm_dim(dims[0], len(xs)) != len(xs) - 1:
        return
    u = ix.only_user(r.outputs[0].name)
    if u is None or not cx.free(u):
        return
    want = A + "mul.Tensor" if r.op == A + "rsqrt.default" else A + "div.Tensor"
    if u.op != want or len(u.inputs) != 2 or x not in u.inputs or r.outputs[0].name not in u.inputs:
        return
    if u.op == A + "div.Tensor" and u.inputs[0] != x:
        return
    if ix.shape(u.outputs[0].name) != xs:
        return
    nodes = [sq.name, mean.name, add.name, r.name, u.name]
    out = u.outputs[0].name
    weight = None
    w = ix.only_user(out)
    if w is not None and cx.free(w) and w.op == A + "mul.Tensor" and len(w.inputs) == 2 and w.name not in cx.unfuse:
        other = w.inputs[1] if w.inputs[0] == out else w.inputs[0]
        if other != out and ix.shape(other) in ((xs[-1],), (1,) * (len(xs) - 1) + (xs[-1],)) and \
                ix.shape(w.outputs[0].name) == xs and ix.spec(other).dtype == "float32":
            weight = other
            nodes.append(w.name)
            out = w.outputs[0].name
    if cx.absorbs_unfused(nodes, anchor=sq.name):
        return
    ins = (x,) + ((weight,) if weight else ())
    cx.claim(RowProto(f"rms_norm_{r.name}", tuple(nodes), (out,), ins, op="rms_norm", x=x, out=out, k=1,
                      weight=weight, eps=eps, writes_row=True, strategy=cx.constraints.option(r.name, "auto")))


def claim_logsumexp(cx) -> None:
    ix = cx.ix
    for n in list(ix.g.nodes):
        if n.op == A + "amax.default" and cx.free(n):
            _logsumexp(cx, n)


def _logsumexp(cx, mx: Node) -> None:
    """m + log(sum(exp(x - m), -1, keepdim)) with m = amax(x, -1, keepdim)."""
    ix = cx.ix
    x = mx.inputs[0]
    xs = ix.shape(x)
    dims = mx.attr("dim")
    if not xs or not mx.attr("keepdim") or not dims or len(dims) != 1 or \
            L.norm_dim(dims[0], len(xs)) != len(xs) - 1:
        return
    m = mx.outputs[0].name
    us = ix.users[m]
    if len(us) != 2 or m in ix.graph_outputs:
        return
    sub = next((u for u in us if u.op == A + "sub.Tensor" and u.inputs == (x, m)), None)
    add = next((u for u in us if u.op == A + "add.Tensor" and m in u.inputs and len(u.inputs) == 2), None)
    if sub is None or add is None or (add.attr("alpha") not in (None, 1)) or (sub.attr("alpha") not in (None, 1)):
        return
    chain = []
    t = sub.outputs[0].name
    for op in (A + "exp.default", A + "sum.dim_IntList", A + "log.default"):
        u = ix.only_user(t)
        if u is None or u.op != op or not cx.free(u):
            return
        chain.append(u)
        t = u.outputs[0].name
    sm = chain[1]
    sd = sm.attr("dim")
    if not sm.attr("keepdim") or not sd or len(sd) != 1 or L.norm_dim(sd[0], len(xs)) != len(xs) - 1:
        return
    if t not in add.inputs or ix.only_user(t) is None:
        return
    nodes = [mx.name, sub.name] + [c.name for c in chain] + [add.name]
    if not all(cx.free(ix.nodes[nm]) for nm in nodes) or cx.absorbs_unfused(nodes, anchor=mx.name):
        return
    out = add.outputs[0].name
    cx.claim(RowProto(f"logsumexp_{mx.name}", tuple(nodes), (out,), (x,), op="logsumexp", x=x, out=out, k=1))


def claim(cx) -> None:
    """Claim every free reduction, in graph order, with its hooks."""
    for n in list(cx.ix.g.nodes):
        if ops.kind(n.op) == "row" and cx.free(n):
            claim_reduction(cx, n)


def claim_reduction(cx, n: Node, hooks: bool = True) -> None:
    """Claim row reduction ``n`` (``hooks``: with the unary ops around it as hooks)."""
    ix = cx.ix
    x = n.inputs[0]
    xs = ix.shape(x)
    out = n.outputs[0].name
    op = n.op
    weight = bias = None
    eps, correction = 0.0, 1.0
    op_pro: tuple[EwInstr, ...] = ()
    op_epi: tuple[EwInstr, ...] = ()
    if op in (A + "max.dim", A + "min.dim"):
        # The values of max / min along a dim (their indices are the arg template's).
        writes_row = False
        rop = op.split(".")[1]
        dims = [L.norm_dim(int(n.attr("dim")), len(xs))] if xs else []
    elif op == A + "linalg_vector_norm.default":
        writes_row = False
        dims = n.attr("dim")
        dims = list(range(len(xs))) if dims is None or dims == () else \
            sorted({L.norm_dim(int(d), len(xs)) for d in dims})
        rop, op_pro, op_epi = _vector_norm(float(n.attr("ord", 2.0)))
        if n.attr("dtype") is not None:
            raise cx.fail(n, "vector norm with a dtype argument")
    elif op in (A + "_softmax.default", A + "_log_softmax.default"):
        if n.attr("half_to_float"):
            raise cx.fail(n, "half_to_float softmax")
        rop = "softmax" if "_softmax" in op and "log" not in op else "log_softmax"
        dims = [L.norm_dim(int(n.attr("dim")), len(xs))] if xs else []
        writes_row = True
    elif op == A + "native_layer_norm.default":
        a = ix.args(n, ops.args(op))
        k = len(n.attr("normalized_shape"))
        for extra in n.outputs[1:]:
            if ix.users.get(extra.name) or extra.name in ix.graph_outputs:
                raise cx.fail(n, "layer norm's mean / rstd outputs are used; only the normalised output is supported")
        out = n.outputs[0].name
        rop, eps = "layer_norm", float(n.attr("eps"))
        weight = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
        bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
        dims = list(range(len(xs) - k, len(xs)))
        writes_row = True
    else:
        writes_row = False
        base = op.split(".")[1]
        dims = n.attr("dim")
        if op in (A + "sum.default", A + "mean.default") or dims is None or dims == ():
            dims = list(range(len(xs)))
        dims = [dims] if isinstance(dims, int) else dims
        dims = sorted({L.norm_dim(int(d), len(xs)) for d in dims}) if xs else []
        rop = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "logsumexp": "logsumexp",
               "var": "var", "max": "max", "min": "min", "any": "max"}[base]
        if base == "any":  # any: the largest of x != 0
            op_pro = (EwInstr("to_bool", ("a0",)),)
        if base == "var":
            corr = n.attr("correction")
            correction = 1.0 if corr is None else float(corr)
            if op == A + "var.dim":
                correction = 1.0 if n.attr("unbiased", True) else 0.0
        # (a dtype argument is the result's dtype, which the output's tensor carries: the
        # reduction runs in fp32 and is stored in it; float64 is refused for every tensor)
    if ix.spec(x).dtype not in FLOAT_DTYPES and (writes_row or rop not in ("sum", "mean", "max", "min")):
        raise cx.fail(n, f"reduction over {ix.spec(x).dtype}")
    if math.prod(xs[d] for d in dims) == 0 and math.prod(xs[d] for d in range(len(xs)) if d not in dims) > 0:
        # (the row and axis templates take no empty row; the result is a constant PyTorch defines)
        raise cx.fail(n, "a reduction over an empty extent")
    pro, x, epi, last = cx.hooks(n, x, out) if hooks else ([], x, [], out)
    nodes = pro + [n.name] + epi
    ins = [x] + [t for t in (weight, bias) if t]
    common: dict[str, Any] = dict(op=rop, x=x, out=last, pro=tuple(pro), epi=tuple(epi))
    if op_pro or op_epi:
        common.update(op_pro=op_pro, op_epi=op_epi)
    name = cx.name(nodes)
    proto_nodes, outs, tins = tuple(nodes), (last,), tuple(ins)
    nd = len(xs)
    trailing = dims == list(range(nd - len(dims), nd))
    strategy = cx.constraints.option(n.name, "auto")
    row = dict(weight=weight, bias=bias, eps=eps, correction=correction, writes_row=writes_row, strategy=strategy)
    if not dims:
        # A reduction over no dims (or of a 0-d tensor) is a copy through the hooks.
        cx.claim(RowProto(name, proto_nodes, outs, tins, k=0, **common, **row))
        return
    whole = not writes_row and rop in ("sum", "mean", "max", "min") and math.prod(xs[:nd - len(dims)]) == 1
    if trailing and whole and math.prod(xs) >= WHOLE_AXIS:
        # The whole tensor to one value: the axis template splits it over many blocks.
        cx.claim(AxisProto(name, proto_nodes, outs, tins, d0=0, d1=nd, **common))
        return
    if trailing:
        cx.claim(RowProto(name, proto_nodes, outs, tins, k=len(dims), **common, **row))
        return
    contiguous_run = dims == list(range(dims[0], dims[-1] + 1))
    if not writes_row and rop in ("sum", "mean", "max", "min") and contiguous_run:
        cx.claim(AxisProto(name, proto_nodes, outs, tins, d0=dims[0], d1=dims[-1] + 1, **common))
        return
    # Otherwise move the reduced dims last with a copy, reduce rows, and (for ops that write
    # a row) move them back.
    perm = tuple([d for d in range(nd) if d not in dims] + dims)
    cx.claim(RowProto(name, proto_nodes, outs, tins, k=len(dims), perm=perm, **common, **row))


def _vector_norm(p: float) -> tuple[str, tuple[EwInstr, ...], tuple[EwInstr, ...]]:
    """A vector p-norm as (reduction, transform of each element before it, of the result after)."""
    ab = EwInstr("abs", ("a0",))
    if p == 2.0:
        return "sum", (EwInstr("square", ("a0",)),), (EwInstr("sqrt", ("a0",)),)
    if p == 1.0:
        return "sum", (ab,), ()
    if p == math.inf:
        return "max", (ab,), ()
    if p == -math.inf:
        return "min", (ab,), ()
    if p == 0.0:
        return "sum", (EwInstr("ne", ("a0", "c0"), (0.0,)),), ()
    return "sum", (ab, EwInstr("pow", ("t0", "c0"), (p,))), (EwInstr("pow", ("a0", "c0"), (1.0 / p,)),)


# ---------------------------------------------------------------------- lower


def lower_row(lw, pr: RowProto, pre: list) -> None:
    op = pr.op
    x_t, out_t = pr.x, pr.out
    k = pr.k
    writes_row = op in ("softmax", "safe_softmax", "log_softmax", "layer_norm", "rms_norm")
    pro, epi = reduction_hooks(lw, pr)
    vx = lw.read(x_t, pre, pr.phase)
    perm = pr.perm
    # An input already laid out with the reduced dims innermost (a softmax over the channels of
    # channels-last data): the result is written in that layout too, rows and all, instead of
    # through rows and a copy back to the reference's layout.
    keep = perm if perm is not None and L.is_dense_in(vx, perm) else None
    if perm is not None and keep is None and writes_row:
        # A softmax over a middle run of dims (the channels of channels-first data): read and
        # written where they lie, when the layout allows, in place of a copy each way.
        dims = perm[len(perm) - k:]
        if list(dims) == list(range(dims[0], dims[0] + k)) and emit_axis_row(lw, pr, vx, dims[0], dims[0] + k, pro, epi):
            return
    if perm is not None:
        vx = L.permute(vx, perm)
    if k == 0:
        vx = L.unsqueeze(vx, vx.ndim)
        k = 1
    rc = L.rows_cols(vx, k)
    if rc is None and not writes_row and perm is None and op in _AXIS_OPS and vx.dtype in FLOAT_DTYPES:
        nd = len(vx.shape)
        middle = kept_in_memory_order(vx, nd - k, nd)
        if middle is not None:  # the reduced dims sit between kept ones in memory (channels-last)
            emit_in_memory_order(lw, pr, vx, nd - k, nd, middle, pro, epi)
            return
    if rc is None or vx.dtype not in FLOAT_DTYPES:
        # (integer and boolean tensors are reduced as float32: exact counts below 2^24)
        c = lw.copy_contiguous(x_t, vx, pre, pr.phase, why=f"{op} reads rows with unit stride",
                                  shape_view=vx, dtype=None if vx.dtype in FLOAT_DTYPES else "float32")
        vx = lw.views[c]
        rc = L.rows_cols(vx, k)
    rows, cols, ldi = rc

    if writes_row:
        def accept(tv: View) -> bool:  # a permuted reduction writes through a copy: any layout
            return (perm is not None or L.rows_cols(tv, k) is not None) and tv.dtype in FLOAT_DTYPES
        same = perm is None and x_t in lw.materialized and lw.shape(x_t) == lw.shape(out_t)
        vo = lw.out_view(pr, out_t, accept, inplace=[x_t] if same else [], order=keep)
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
            return L.collapse(tv.shape, tv.strides) is not None and tv.dtype in FLOAT_DTYPES
        vo = lw.out_view(pr, out_t, accept)
        wo = vo
        post = None
        cl = L.collapse(vo.shape, vo.strides)
        if cl is None or vo.dtype not in FLOAT_DTYPES:
            dt = vo.dtype if vo.dtype in FLOAT_DTYPES else "float32"  # an integer result goes through a cast
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
            # m2 / (cols - c) == (m2 / cols) * cols / (cols - c); PyTorch clamps cols - c at 0
            # (a correction of the row's length or more: m2 / 0, NaN for a constant row)
            factor = cols / (cols - corr) if cols > corr else math.inf
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
    lw.add(pr, pr.name, spec, reads, [wo] + ([ws] if ws else []), touched=hooked_touched(lw, pr))
    if post is not None:
        src, dst = post
        if perm is not None and writes_row:  # (a per-row result holds none of the dims moved last)
            src = L.permute(src, L.inverse_permutation(perm))
        lw.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), src, dst, pr.phase,
                                          note="writes the rows back in the reference's layout"))


#: The ops reduce.cuh's axis kernel computes.
_AXIS_OPS = ("sum", "mean", "max", "min")


def _shift_instr(i: EwInstr, by: int) -> EwInstr:
    return EwInstr(i.op, tuple(f"t{int(x[1:]) + by}" if x.startswith("t") else ("t0" if x == "a0" else x)
                               for x in i.args), i.consts)


#: reduce.cuh's kRowSplitMinCols and kRowMaxSplits: a layer / rms norm row this long may split.
ROW_SPLIT_MIN_COLS, ROW_MAX_SPLITS = 32768, 256
#: Below this many rows a split can pay (every SM of a large GPU already has a row past it).
ROW_SPLIT_MAX_ROWS = 1024


def row_workspace_floats(rows: int, cols: int) -> int:
    """reduce.cuh's row_reduce_workspace_floats, for the shapes worth splitting (0 otherwise)."""
    if cols < ROW_SPLIT_MIN_COLS or not 0 < rows < ROW_SPLIT_MAX_ROWS:
        return 0
    return rows * ROW_MAX_SPLITS * 3


# ---------------------------------------------------------------------- cost, interpret, render


def cost_row(spec: RowSpec, ceil) -> tuple[float, float, float]:
    per = {"softmax": 5, "safe_softmax": 5, "log_softmax": 5, "layer_norm": 8, "rms_norm": 4, "logsumexp": 4, "var": 4}.get(spec.op, 1)
    n = spec.rows * spec.cols
    writes_row = spec.op in ("softmax", "safe_softmax", "log_softmax", "layer_norm", "rms_norm")
    flops = n * (per + len(spec.prologue)) + len(spec.epilogue) * (n if writes_row else spec.rows)
    return float(flops), view_bytes(spec.x) + view_bytes(spec.out) + view_bytes(spec.weight) + \
        view_bytes(spec.bias), ceil.fp32


def interpret_row(mem, r: RowSpec) -> None:
    import torch

    assert r.rows <= 0 or r.cols >= 1, "reduce.cuh: launch_row_reduce refuses cols < 1"
    x = mem.hook(r.prologue, mem.read(r.x, (r.rows, r.cols), (r.ldi, 1)))
    op = r.op
    if op in ("softmax", "safe_softmax", "log_softmax", "layer_norm", "rms_norm"):
        if op == "softmax":
            y = torch.softmax(x, -1)
        elif op == "safe_softmax":  # a row of -inf gives zeros (scaled_dot_product_attention's rule)
            y = torch.where((x == -math.inf).all(-1, keepdim=True), 0.0, torch.softmax(x, -1))
        elif op == "log_softmax":
            y = torch.log_softmax(x, -1)
        elif op == "layer_norm":
            mean = x.mean(-1, keepdim=True)
            var = ((x - mean) ** 2).mean(-1, keepdim=True)
            y = (x - mean) * torch.rsqrt(var + r.eps)
            if r.weight is not None:
                y = y * mem.read(r.weight, (r.cols,), (1,))
            if r.bias is not None:
                y = y + mem.read(r.bias, (r.cols,), (1,))
        else:
            y = x * torch.rsqrt((x * x).mean(-1, keepdim=True) + r.eps)
            if r.weight is not None:
                y = y * mem.read(r.weight, (r.cols,), (1,))
        mem.write(r.out, mem.hook(r.epilogue, y), (r.rows, r.cols), (r.ldo, 1))
        return
    y = {"sum": lambda: x.sum(-1), "mean": lambda: x.mean(-1), "max": lambda: x.amax(-1), "min": lambda: x.amin(-1),
         "logsumexp": lambda: torch.logsumexp(x, -1),
         "var": lambda: x.var(-1, correction=1 if r.unbiased else 0)}[op]()
    mem.write(r.out, mem.hook(r.epilogue, y), (r.rows,), (r.ldo,))


_ROW_ENTRY = {"softmax": "launch_softmax", "safe_softmax": "launch_safe_softmax",
              "log_softmax": "launch_log_softmax", "logsumexp": "launch_logsumexp",
              "sum": "launch_row_sum", "mean": "launch_row_mean", "max": "launch_row_max", "min": "launch_row_min"}


def render_row(t, r: RowSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    hk = ""
    if r.prologue or r.epilogue:
        pre, hk = cxx.hooks(fn, r.prologue, r.epilogue)
    x, y = n("x"), n("out")
    tin, tout = ctype(r.x.dtype), ctype(r.out.dtype)
    # With a workspace, the _ws entry points may split few, long rows over many blocks.
    ws, sfx = (f"{n('workspace')}, {r.workspace_floats}, ", "_ws") if r.workspace is not None else ("", "")
    if r.op == "layer_norm":
        tw = ctype((r.weight or r.bias or r.x).dtype)
        call = (f"stitch::launch_layer_norm{sfx}<{tin}, {tout}, {tw}>({x}, {r.ldi}, {y}, {r.ldo}, "
                f"{n.opt('weight')}, {n.opt('bias')}, {r.rows}, {r.cols}, {cxx.flit(r.eps)}, {ws}stream{hk})")
    elif r.op == "rms_norm":
        tw = ctype((r.weight or r.x).dtype)
        call = (f"stitch::launch_rms_norm{sfx}<{tin}, {tout}, {tw}>({x}, {r.ldi}, {y}, {r.ldo}, {n.opt('weight')}, "
                f"{r.rows}, {r.cols}, {cxx.flit(r.eps)}, {ws}stream{hk})")
    elif r.op == "var":
        call = (f"stitch::launch_row_var({x}, {r.ldi}, {y}, {r.ldo}, {r.rows}, {r.cols}, "
                f"{'true' if r.unbiased else 'false'}, stream{hk})")
    else:
        call = f"stitch::{_ROW_ENTRY[r.op]}({x}, {r.ldi}, {y}, {r.ldo}, {r.rows}, {r.cols}, stream{hk})"
    return pre, [f"  return cuda_check({call},", f'                    "{t.name}");']


ROW = TaskKind("row", RowSpec, "reduction_template", cost_row, interpret_row, render_row,
               lowers=((RowProto, lower_row),),
               claims=(ClaimRule("match", 20, claim_rms), ClaimRule("match", 21, claim_logsumexp),
                       ClaimRule("fuse", 120, claim)),
               headers=("stitch/reduce.cuh",))
__all__ = ["RowSpec", "RowProto", "claim_reduction", "row_workspace_floats", "WHOLE_AXIS", "ROW"]
