"""GEMMs and their epilogue chains: ``linear``, ``matmul``, ``addmm``, ``bmm`` through cuBLASLt.

Claim: each GEMM takes the chain after it — a leading scalar into ``alpha``, a per-column add as
the cuBLASLt bias, a same-shape add as ``beta·C`` (or a residual op), relu (and, off fp32, the
tanh GELU) into cuBLASLt's epilogue, the rest as the runtime's fused epilogue chain (which ops may
join: :func:`stitchcuda.ops.epilogue_of`), at most :data:`MAX_CHAIN` ops.

Lowering: one big 2-D GEMM when ``b`` is one matrix and ``a``'s batch rows stack with a uniform
stride; otherwise a strided-batched GEMM. Operands that are not matrices in the policy's storage
type are copied (cast) first, but for one case: ``a`` a permuted tensor reshaped into a batch that
no one stride spans (a state-space model's einsum: batch (b, c, h) of its input as it lies, strides
b·c and h), where the copy would cost more than the calls, is read as it lies by one strided-batched
call per item of an outer batch dim (at most :data:`MAX_OUTER` calls; a plain product, no epilogue).
The epilogue: a leading scale folds into ``alpha``, a per-column add into the bias, a same-shape add
into ``beta·C`` (else a residual op), a leading ReLU (or tanh GELU off fp32) into cuBLASLt's
epilogue, the rest into the runtime's chain in reference order. ``addmm``'s added matrix is that
``beta·C`` too, broadcast to the output, unless it is a per-column bias at beta 1 (the bias), or beta
is 0 (left out: PyTorch ignores it).

Precision where it costs nothing (as the convolutions' short sums, kinds/conv.py): under a policy
that rounds to TF32, a GEMM whose sums are shorter than :data:`SHORT_K` computes at fp32. Such a
product is bound by its output's bytes (2K flops per 4-byte element: under 8 flop/byte, below the
fp32 SIMT units' ridge of about 22 on an H100), so tensor cores save nothing; and rounding its
operands can cost the most. The rotary embedding's angles, positions x frequencies as a product
over K = 1, are the first example: at TF32 a frequency keeps 11 bits, and at position 1000 its
angle is off by up to half a radian. It was the single most sensitive task of the zoo's decoders
(the interpreter's TF32 model, BENCHMARKS.md), and PyTorch rounds it too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

from .. import layout as L
from .. import ops
from ..dtypes import st_enum
from ..ir import Node
from ..layout import View
from ..ops import EpOp
from ..precision import get as get_policy
from . import cxx
from .base import ClaimRule, Proto, TaskKind, view_bytes

A = ops.A
#: cuBLASLt / runtime limit on the fused epilogue chain.
MAX_CHAIN = 8
#: Sums shorter than this compute at fp32 under TF32 (module docstring): bound by their bytes.
SHORT_K = 16


@dataclass(frozen=True)
class GemmSpec:
    """``out[b] = ep(alpha * op(A[b]) @ op(B[b]) + beta * C[b] + bias)`` through st_gemm.

    Row-major conventions of stitchrt.h: A is m x k (stored k x m when trans_a), B is k x n,
    out is m x n with leading dim ldo; strides between batch items (0: broadcast).
    ``epilogue`` is cuBLASLt's (``none``, ``bias``, ``relu``, ``gelu``, ``bias_relu``,
    ``bias_gelu``), ``chain`` the runtime's epilogue ops applied after it, in place.
    ``outer`` > 1: the product runs ``outer`` times (one st_gemm call each), A, B and out moved on by
    ``outer_a``, ``outer_b``, ``outer_out`` elements a call: a batch whose dims no one stride spans (a
    permuted tensor reshaped into the batch, read as it lies instead of copied; see :func:`_through_reshape`).
    ``split``: how an fp32 task of a TF32 program (the loop's precision repair raised it) runs on
    tensor cores instead of the SIMT units: ``bf16`` three bf16 products of split operands
    (st_gemm_split_bf16: about 2^-16 relative error a product, well below TF32's, on tensor cores
    at twice TF32's rate), ``tf32`` three TF32 products (st_gemm_split_tf32: fp32-grade, 4-5x
    fp32's error, at 3x TF32's time); ``""`` not split. The node's strategy option (``gemm``: ``bf16x3``,
    the default, or ``tf32x3``) chooses; the loop's precision repair asks for ``tf32x3`` where bf16
    parts were not enough.
    """

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "gemm")

    kind: str
    policy: str
    m: int
    n: int
    k: int
    batch: int
    a: View
    lda: int
    stride_a: int
    trans_a: bool
    b: View
    ldb: int
    stride_b: int
    trans_b: bool
    out: View
    ldo: int
    stride_out: int
    alpha: float = 1.0
    beta: float = 0.0
    c: View | None = None
    ldc: int = 0
    stride_c: int = 0
    bias: View | None = None
    epilogue: str = "none"
    chain: tuple[EpOp, ...] = ()
    residual: View | None = None
    ldr: int = 0
    split: str = ""
    outer: int = 1
    outer_a: int = 0
    outer_b: int = 0
    outer_out: int = 0


@dataclass(frozen=True)
class Operand:
    """A GEMM operand: a graph tensor, read transposed (``linear``'s weight) or not."""

    tensor: str
    transposed: bool = False


@dataclass(frozen=True)
class ChainStep:
    """One step of a GEMM's epilogue chain, in reference order: ``scale`` / ``div`` by
    ``value``, ``bias`` (per-column ``tensor``), ``residual`` (same-shape ``tensor`` times
    ``value``), or ``op`` (an :class:`EpOp`)."""

    kind: str
    value: float = 0.0
    tensor: str | None = None
    op: EpOp | None = None


@dataclass(frozen=True)
class GemmProto(Proto):
    a: Operand = Operand("")
    b: Operand = Operand("")
    bias: str | None = None
    alpha: float = 1.0
    steps: tuple[ChainStep, ...] = ()
    out: str = ""
    policy: str = ""
    parts: str = "auto"  #: the gemm strategy option: how a raised task splits (GemmSpec.split)


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    """Claim every free GEMM, in graph order, with the chain after it."""
    for n in list(cx.ix.g.nodes):
        if ops.kind(n.op) == "gemm" and cx.free(n):
            _gemm(cx, n)


def _operands(cx, n: Node) -> tuple[Operand, Operand, str | None, float, tuple[ChainStep, ...]]:
    """A, B, a per-column bias, alpha, and the steps that come first in the epilogue (addmm's added
    matrix when it is no plain bias: ``beta * M``, any shape that broadcasts to the output)."""
    ix = cx.ix
    if n.op == A + "linear.default":
        a = ix.args(n, ops.args(n.op))
        bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
        return Operand(a["input"][1]), Operand(a["weight"][1], True), bias, 1.0, ()
    if n.op == A + "addmm.default":
        a = ix.args(n, ops.args(n.op))
        beta, alpha = float(n.attr("beta", 1)), float(n.attr("alpha", 1))
        mat1, mat2, m = Operand(a["mat1"][1]), Operand(a["mat2"][1]), a["self"][1]
        if beta == 0.0:  # PyTorch ignores the added matrix then: its NaN and inf do not propagate
            return mat1, mat2, None, alpha, ()
        ms, ncols = ix.shape(m), ix.shape(n.outputs[0].name)[-1]
        if beta == 1.0 and len(ms) in (1, 2) and ms[-1] == ncols and math.prod(ms) == ncols:
            return mat1, mat2, m, alpha, ()
        if ix.spec(m).dtype != "float32":
            raise cx.fail(n, f"addmm whose added matrix is {ix.spec(m).dtype}")
        return mat1, mat2, None, alpha, (ChainStep("residual", beta, tensor=m),)  # GEMM's beta * C
    return Operand(n.inputs[0]), Operand(n.inputs[1]), None, 1.0, ()


def _gemm(cx, n: Node) -> None:
    ix = cx.ix
    a, b, bias, alpha, lead = _operands(cx, n)
    out = n.outputs[0].name
    if ix.spec(out).dtype != "float32":
        raise cx.fail(n, f"GEMM on {ix.spec(out).dtype} tensors (policies store float32 as fp32/tf32/bf16/fp16)")
    os_ = ix.shape(out)
    ncols = os_[-1] if os_ else 1
    nodes = [n.name]
    steps: list[ChainStep] = list(lead)
    has_bias = bias is not None
    residual = bool(lead)
    n_chain = len(lead)
    t = out
    while True:
        u = ix.only_user(t)
        if u is None or not cx.free(u) or u.name in cx.unfuse:
            break
        if u.op in ops.TRANSPARENT:
            nodes.append(u.name)
            t = u.outputs[0].name
            continue
        if ops.kind(u.op) != "elementwise" or ix.shape(u.outputs[0].name) != ix.shape(t):
            break
        step = _chain_step(cx, u, t, ncols, has_bias, residual)
        if step is None:
            break
        if step.kind == "op":
            if n_chain >= MAX_CHAIN:
                break
            n_chain += 1
        elif step.kind == "scale":
            n_chain += 1  # may fold into alpha; counted conservatively
        elif step.kind == "bias":
            has_bias = True
        elif step.kind == "residual":
            residual = True
            n_chain += 1
        if n_chain > MAX_CHAIN:
            break
        steps.append(step)
        nodes.append(u.name)
        t = u.outputs[0].name
    ins = [x for x in (a.tensor, b.tensor, bias) if x]
    for s in steps:
        if s.kind in ("bias", "residual"):
            ins.append(s.tensor)
    cx.claim(GemmProto(cx.name(nodes), tuple(nodes), (t,), tuple(ins), a=a, b=b, bias=bias, alpha=alpha,
                       steps=tuple(steps), out=t, policy=cx.policy_of(nodes),
                       parts=_parts(cx, nodes)))


def _parts(cx, nodes) -> str:
    """The gemm strategy option any of the task's nodes asks for (a GEMM merged from several, as a
    query-key-value projection, is asked through any of them)."""
    asked = {cx.constraints.option(x, "auto") for x in nodes} & {"bf16x3", "tf32x3"}
    return "tf32x3" if "tf32x3" in asked else asked.pop() if asked else "auto"


def _chain_step(cx, u: Node, cur: str, ncols: int, has_bias: bool, residual: bool) -> ChainStep | None:
    """How consumer ``u`` of the GEMM's running result ``cur`` joins its epilogue, or None."""
    ix = cx.ix
    op = u.op.removeprefix(A)
    if u.outputs[0].dtype != "float32":
        return None
    if len(u.inputs) == 1 and u.inputs[0] == cur:
        s = u.scalar("other")
        alpha = u.scalar("alpha")
        alpha = 1.0 if alpha is None else alpha
        if op == "mul.Tensor" and s is not None:
            return ChainStep("scale", s)
        if op == "div.Tensor" and s is not None:
            return ChainStep("div", s)
        if op == "add.Tensor" and s is not None:
            return ChainStep("op", op=EpOp("ADD_SCALAR", alpha * s))
        if op == "sub.Tensor" and s is not None:
            return ChainStep("op", op=EpOp("ADD_SCALAR", -alpha * s))
        e = ops.epilogue_of(u, lambda i: ix.spec(u.inputs[i]).dtype, ix.args)
        return ChainStep("op", op=e) if e is not None else None
    if op in ("add.Tensor", "sub.Tensor") and len(u.inputs) == 2 and u.inputs[0] != u.inputs[1]:
        alpha = float(u.attr("alpha", 1) or 1)
        first = u.inputs[0] == cur
        other = u.inputs[1] if first else u.inputs[0]
        if ix.spec(other).dtype != "float32":
            return None
        if op == "sub.Tensor" and not first:
            return None
        if not first and alpha != 1.0:
            return None
        coef = (-alpha if op == "sub.Tensor" else alpha) if first else 1.0
        os_ = ix.shape(other)
        if math.prod(os_) == ncols and os_ and os_[-1] == ncols and coef == 1.0 and not has_bias:
            return ChainStep("bias", tensor=other)
        if os_ == ix.shape(cur) and not residual:
            return ChainStep("residual", coef, tensor=other)
    return None


# ---------------------------------------------------------------------- lower

#: The most GEMM calls a batch is split into where no one stride spans it (:func:`_through_reshape`).
MAX_OUTER = 16


def _through_reshape(lw, pr: GemmProto, pre: list):
    """(A's view with its batch dims as they lie, the outer batch dim) where A is a permuted tensor
    reshaped into a batch that no one stride spans, so that reading it would copy it, and the copy
    would cost more than the calls it saves (at the default device's bandwidth and launch cost): a
    state-space model's einsum read its 537 MB input through such a copy. The batch then runs as
    ``outer`` calls over one of its dims (at most ``MAX_OUTER``), each a strided batch over the rest.
    None where A reads as it is, or no dim serves (B and out must split the same way)."""
    from ..device import DEFAULT

    x = pr.a
    if x.transposed or x.tensor in lw.views:
        return None
    n = lw.ix.producer.get(x.tensor)
    if n is None or n.op not in ops.RESHAPES:
        return None
    ys, bs = lw.shape(x.tensor), lw.shape(pr.b.tensor)
    if len(ys) != 3 or len(bs) != 3 or bs[0] != ys[0] or lw.ix.spec(n.inputs[0]).dtype != "float32":
        return None  # (B a batch of its own, item for item)
    vx = lw.read(n.inputs[0], pre, pr.phase)
    if L.reshape(vx, ys) is not None:
        return None  # A reads as it is
    vx = L.squeeze(vx, None)  # (unit dims are free: 3:49's A is [b, c, h, p, l, 1])
    if tuple(vx.shape[-2:]) != tuple(ys[-2:]) or vx.ndim < 4:
        return None
    if 2 * view_bytes(vx) / DEFAULT.bandwidth <= MAX_OUTER * DEFAULT.launch_s:
        return None  # a small copy costs less than the calls
    dense = L.contiguous_strides(vx.shape[:-2])  # (B and out, dense, must split the same way)
    for d in range(vx.ndim - 2):
        if 1 < vx.shape[d] <= MAX_OUTER and L.as_matrix(L.select(vx, d, 0)) is not None and \
                L.collapse(vx.shape[:d] + vx.shape[d + 1:-2], dense[:d] + dense[d + 1:]) is not None:
            return vx, d
    return None


def _lower_outer(lw, pr: GemmProto, pre: list, policy: str, va: View, d: int) -> None:
    """A plain product (no epilogue) over a batch split as :func:`_through_reshape` found: A as it lies,
    B and out viewed with A's batch dims (B copied dense first where it cannot be)."""
    m, kk = va.shape[-2:]
    if kk < SHORT_K and policy == "tf32":
        policy = "fp32"  # (a short sum, as the one-call path plans it)
    st = get_policy(policy).storage
    dims = va.shape[:-2]
    vb = lw.read(pr.b.tensor, pre, pr.phase)
    vb = L.transpose(vb, -1, -2) if pr.b.transposed else vb
    n = vb.shape[-1]

    def split(v: View, shape: tuple[int, ...], out: bool = False) -> View | None:  # in A's batch dims, split as A
        w = L.reshape(v, shape) if v.dtype == st else None
        return w if w is not None and L.as_matrix(L.select(w, d, 0), allow_trans=not out) is not None else None

    wb = split(vb, dims + (kk, n))
    if wb is None:
        c = lw.copy_contiguous(pr.b.tensor, vb, pre, pr.phase, why="GEMM operand B in A's batch dims", dtype=st)
        wb = L.reshape(lw.views[c], dims + (kk, n))
    vo = lw.out_view(pr, pr.out, lambda tv: split(tv, dims + (m, n), out=True) is not None)
    wo = L.reshape(vo, dims + (m, n))
    assert wo is not None, "out is its target in A's batch dims, or a fresh dense buffer"
    vb, vo = wb, wo

    def inner(v: View) -> tuple[View, int]:  # the view's first item along dim d, and d's stride
        return L.select(v, d, 0), v.strides[d]

    (ia, oa), (ib, ob), (io, oo) = inner(va), inner(vb), inner(vo)
    ma, mb, mo = L.as_matrix(ia), L.as_matrix(ib), L.as_matrix(io, allow_trans=False)
    assert ma is not None and mb is not None and mo is not None, "an outer split needs matrices inside"
    batch = math.prod(ia.shape[:-2])
    spec = GemmSpec("gemm", policy, m, n, kk, batch, va, ma.ld, ma.batch_stride, ma.trans,
                    vb, mb.ld, mb.batch_stride, mb.trans, vo, mo.ld, mo.batch_stride if batch > 1 else 0,
                    alpha=float(pr.alpha), outer=va.shape[d], outer_a=oa, outer_b=ob, outer_out=oo)
    lw.add(pr, pr.name, spec, [va, vb], [vo], touched=list(pr.ins) + [pr.out],
           note=f"{va.shape[d]} calls over a batch no one stride spans, its A read as it lies")



def lower(lw, pr: GemmProto, pre: list) -> None:
    policy = pr.policy or lw.f.policy
    st = get_policy(policy).storage
    short = False  # a short sum under TF32: planned at fp32 (module docstring), not raised

    def operand(x: Operand) -> View:
        v = lw.read(x.tensor, pre, pr.phase)
        return L.transpose(v, -1, -2) if x.transposed else v

    outer = _through_reshape(lw, pr, pre) if not pr.steps and pr.bias is None and policy == lw.f.policy else None
    if outer is not None:
        _lower_outer(lw, pr, pre, policy, *outer)
        return
    va, vb = operand(pr.a), operand(pr.b)
    out_t = pr.out
    os_ = lw.shape(out_t)
    # Logical shapes: a [..., M, K], b [..., K, N] (vectors get a unit dim), out [..., M, N].
    a_vec, b_vec = va.ndim == 1, vb.ndim == 1
    if a_vec:
        va = L.unsqueeze(va, 0)
    if b_vec:
        vb = L.unsqueeze(vb, -1)
    m, kk, n = va.shape[-2], va.shape[-1], vb.shape[-1]
    if kk < SHORT_K and policy == "tf32":
        policy, short = "fp32", True
    batch_shape = L.broadcast_shapes(va.shape[:-2], vb.shape[:-2])
    out_logical = batch_shape + (m, n)

    def to_logical(v: View) -> View:
        # N's unit dim first: for a vector times a vector (a dot product) out is 0-d, and M's unit
        # dim goes before N's.
        if b_vec:
            v = L.unsqueeze(v, -1)
        if a_vec:
            v = L.unsqueeze(v, -2)
        return v

    def accept(tv: View) -> bool:
        if tv.dtype != st:
            return False
        lv = to_logical(tv)
        mat = L.as_matrix(lv, allow_trans=False)
        if mat is None:
            return False
        lead = L.collapse(lv.shape[:-1], lv.strides[:-1])
        return lead is not None and (lead[0] <= 1 or lead[1] >= n)

    vo = to_logical(lw.out_view(pr, out_t, accept))
    assert vo.shape == out_logical, (vo.shape, out_logical, os_)

    def need(v: View, what: str, shape: Sequence[int]) -> View:
        full = L.broadcast_to(v, shape)
        if v.dtype == st and L.as_matrix(full) is not None:
            return full
        c = lw.copy_contiguous(what, v, pre, pr.phase, why=f"GEMM operand {what} needs a matrix layout",
                                  dtype=st, shape_view=full)
        return lw.views[c]

    a_name, b_name = pr.a.tensor, pr.b.tensor
    # One big 2-D GEMM when b is one matrix and a's batch rows stack with a uniform stride.
    flat = None
    if all(d == 1 for d in vb.shape[:-2]) or vb.ndim == 2:
        if va.dtype == st and (va.strides[-1] == 1 or va.shape[-1] == 1):
            ca = L.collapse(va.shape[:-1], va.strides[:-1])
            co = L.collapse(vo.shape[:-1], vo.strides[:-1])
            if ca is not None and co is not None and (ca[0] <= 1 or ca[1] >= kk) and (co[0] <= 1 or co[1] >= n):
                flat = (ca, co)
    vb2 = need(L.reshape(vb, vb.shape[-2:]) if (flat and vb.ndim > 2) else vb, b_name,
               vb.shape[-2:] if flat else batch_shape + (kk, n))
    if flat:
        (mm, lda), (_, ldo) = flat
        mm = mm if mm > 0 else 0
        lda = lda if mm > 1 else kk
        ldo = ldo if mm > 1 else n
        ma = L.Matrix(lda, False, 0)
        mb = L.as_matrix(vb2)
        mo = L.Matrix(ldo, False, 0)
        a_view, out_view = va, vo
        M, batch = mm, 1
    else:
        a_view = need(va, a_name, batch_shape + (m, kk))
        ma, mb = L.as_matrix(a_view), L.as_matrix(vb2)
        mo = L.as_matrix(vo, allow_trans=False)
        out_view = vo
        M, batch = m, math.prod(batch_shape)
        assert mo is not None
    assert ma is not None and mb is not None
    # Epilogue: alpha, bias, beta * C, cuBLASLt's epilogue, the runtime's chain.
    alpha = float(pr.alpha)
    bias_t = pr.bias
    beta = 0.0
    c_t = None
    chain: list[EpOp] = []
    residual_t = None
    for step in pr.steps:
        kind = step.kind
        if kind in ("scale", "div"):
            s = step.value if kind == "scale" else 1.0 / step.value
            if not chain and bias_t is None and c_t is None and residual_t is None:
                alpha *= s
            else:
                chain.append(EpOp("SCALE", step.value) if kind == "scale" else EpOp("DIV_SCALAR", step.value))
        elif kind == "bias":
            bias_t = step.tensor
            if chain:
                chain.append(EpOp("BIAS_ADD"))
        elif kind == "residual":
            if not chain and c_t is None:
                c_t, beta = step.tensor, step.value
            else:
                residual_t = step.tensor
                chain.append(EpOp("RESIDUAL_ADD", step.value))
        else:
            chain.append(step.op)
    epilogue = "none"
    bias_in_chain = any(e.kind == "BIAS_ADD" for e in chain)
    if bias_t is not None and not bias_in_chain:
        epilogue = "bias"
    if beta == 0.0 and chain and not bias_in_chain:
        head = chain[0].kind
        if head == "RELU" or (head == "GELU_TANH" and policy != "fp32"):
            epilogue = {"none": "", "bias": "bias_"}[epilogue] + ("relu" if head == "RELU" else "gelu")
            chain = chain[1:]
    bias_v = None
    if bias_t is not None:
        bv = lw.read(bias_t, pre, pr.phase)
        bv = L.reshape(bv, (n,)) or bv
        if bv.dtype != st or bv.ndim != 1 or (n > 1 and bv.strides[0] != 1):
            c2 = lw.copy_contiguous(bias_t, bv, pre, pr.phase, why="bias must be contiguous", dtype=st,
                                       shape_view=L.reshape(bv, (n,)) if bv.ndim != 1 else bv)
            bv = lw.views[c2]
        bias_v = bv
    c_v, ldc, stride_c = None, 0, 0
    if c_t is not None:
        cv = lw.read(c_t, pre, pr.phase)
        full = L.broadcast_to(cv, out_logical) if not flat else L.broadcast_to(cv, vo.shape)
        if flat:
            full = L.reshape(full, (M, n)) if L.reshape(full, (M, n)) is not None else None
        mc = L.as_matrix(full, allow_trans=False) if full is not None else None
        if cv.dtype != st or mc is None:
            src = L.broadcast_to(cv, out_logical)
            c2 = lw.copy_contiguous(c_t, cv, pre, pr.phase, why="C must be a row-major matrix", dtype=st,
                                       shape_view=src)
            full = lw.views[c2]
            if flat:
                full = L.reshape(full, (M, n))
            mc = L.as_matrix(full, allow_trans=False)
        c_v, ldc, stride_c = full, mc.ld, mc.batch_stride
    res_v, ldr = None, 0
    if residual_t is not None:
        rv = L.broadcast_to(lw.read(residual_t, pre, pr.phase), out_logical)
        rc = L.rows_cols(rv, 1)
        if rv.dtype != st or rc is None:
            c2 = lw.copy_contiguous(residual_t, rv, pre, pr.phase, why="residual must be row-major", dtype=st,
                                       shape_view=rv)
            rv = lw.views[c2]
            rc = L.rows_cols(rv, 1)
        res_v, ldr = rv, rc[2]
    if chain and batch > 1 and mo.batch_stride != M * mo.ld:
        raise AssertionError("batched epilogue needs a dense batch")
    # A task the constraints raised to fp32 in a TF32 program: a split product on tensor cores (a
    # chained epilogue applied after it by the epilogue kernel).
    split = ""
    if policy == "fp32" and not short and get_policy(lw.f.policy).tf32 and \
            all(v.dtype == "float32" for v in (a_view, vb2, out_view)):
        split = "tf32" if pr.parts == "tf32x3" else "bf16"
    spec = GemmSpec("gemm", policy, M, n, kk, batch, a_view, ma.ld, ma.batch_stride, ma.trans,
                    vb2, mb.ld, mb.batch_stride, mb.trans, out_view, mo.ld, mo.batch_stride if batch > 1 else 0,
                    alpha=alpha, beta=beta, c=c_v, ldc=ldc, stride_c=stride_c, bias=bias_v, epilogue=epilogue,
                    chain=tuple(chain), residual=res_v, ldr=ldr, split=split)
    reads = [a_view, vb2, bias_v, c_v, res_v]
    lw.add(pr, pr.name, spec, reads, [out_view], touched=list(pr.ins) + [out_t],
           note=f"raised: three {split.upper()} products of split operands" if split else
           f"fp32: a sum of {kk} terms, bound by its bytes" if short else "")


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: GemmSpec, ceil) -> tuple[float, float, float]:
    items = spec.batch * spec.outer
    flops = 2.0 * spec.m * spec.n * spec.k * items + spec.m * spec.n * items * (len(spec.chain) + 1)
    nbytes = sum(view_bytes(v) for v in (spec.a, spec.b, spec.c, spec.bias, spec.residual)) + view_bytes(spec.out)
    if spec.split:  # three products over the split operands, written once a call (3x, in the parts' type)
        a_n, b_n = view_bytes(spec.a), view_bytes(spec.b)
        nbytes += (a_n + b_n) * (1 + 3 * (0.5 if spec.split == "bf16" else 1.0))
        return flops, nbytes, ceil.gemm_peak(spec.split) / 3
    return flops, nbytes, ceil.gemm_peak(spec.policy)


def interpret(mem, g: GemmSpec) -> None:
    if g.outer > 1:  # (plain products only: no epilogue, C or chain)
        import dataclasses

        for o in range(g.outer):
            one = dataclasses.replace(g, outer=1, a=_moved(g.a, o * g.outer_a), b=_moved(g.b, o * g.outer_b),
                                      out=_moved(g.out, o * g.outer_out))
            interpret(mem, one)
        return
    import torch

    b = g.batch
    a = mem.read(g.a, (b, g.m, g.k), (g.stride_a, 1, g.lda) if g.trans_a else (g.stride_a, g.lda, 1))
    bm = mem.read(g.b, (b, g.k, g.n), (g.stride_b, 1, g.ldb) if g.trans_b else (g.stride_b, g.ldb, 1))
    acc = g.alpha * torch.bmm(a, bm)
    if g.beta != 0.0:
        acc = acc + g.beta * mem.read(g.c, (b, g.m, g.n), (g.stride_c, g.ldc, 1))
    if "bias" in g.epilogue:
        acc = acc + mem.read(g.bias, (g.n,), (1,))
    if g.epilogue.endswith("relu"):
        acc = torch.clamp_min(acc, 0)
    elif g.epilogue.endswith("gelu"):
        acc = torch.nn.functional.gelu(acc, approximate="tanh")
    out_strides = (g.stride_out, g.ldo, 1)
    mem.write(g.out, acc, (b, g.m, g.n), out_strides)
    if g.chain:
        assert b == 1 or g.stride_out == g.m * g.ldo, "batched epilogue over a non-dense batch"
        rows = g.m * b
        x = mem.read(g.out, (rows, g.n), (g.ldo, 1))
        ctx = {}
        if g.residual is not None:
            ctx["residual"] = mem.read(g.residual, (rows, g.n), (g.ldr, 1))
        if g.bias is not None:
            ctx["bias"] = mem.read(g.bias, (g.n,), (1,))
        for e in g.chain:
            x = ops.EPILOGUES[e.kind].ref(x, e.a, e.b, ctx)
        mem.write(g.out, x, (rows, g.n), (g.ldo, 1))


def _moved(v: View, by: int) -> View:
    import dataclasses

    return dataclasses.replace(v, offset=v.offset + by)


_EPILOGUE = {"none": "ST_EPI_NONE", "bias": "ST_EPI_BIAS", "relu": "ST_EPI_RELU", "gelu": "ST_EPI_GELU",
             "bias_relu": "ST_EPI_BIAS_RELU", "bias_gelu": "ST_EPI_BIAS_GELU"}


def render(t, g: GemmSpec, n, fn: str) -> tuple[list[str], list[str]]:
    lines = ["  st_gemm_args g{};",
         f"  g.policy = {get_policy(g.policy).c_enum};",
         f"  g.epilogue = {_EPILOGUE[g.epilogue]};",
         f"  g.m = {g.m}; g.n = {g.n}; g.k = {g.k}; g.batch = {g.batch};",
         f"  g.a = {n('a')}; g.lda = {g.lda}; g.stride_a = {g.stride_a}; g.trans_a = {int(g.trans_a)}; "
         f"g.a_dtype = {st_enum(g.a.dtype)};",
         f"  g.b = {n('b')}; g.ldb = {g.ldb}; g.stride_b = {g.stride_b}; g.trans_b = {int(g.trans_b)}; "
         f"g.b_dtype = {st_enum(g.b.dtype)};"]
    if g.c is not None:
        lines.append(f"  g.c = {n('c')}; g.ldc = {g.ldc}; g.stride_c = {g.stride_c};")
    lines.append(f"  g.out = {n('out')}; g.ldo = {g.ldo}; g.stride_out = {g.stride_out}; "
             f"g.out_dtype = {st_enum(g.out.dtype)};")
    if g.bias is not None:
        lines.append(f"  g.bias = {n('bias')};")
    lines.append(f"  g.alpha = {cxx.flit(g.alpha)}; g.beta = {cxx.flit(g.beta)};")
    call = f"st_gemm_split_{g.split}" if g.split else "st_gemm"
    if g.outer > 1:  # one call per item of the outer dim, the operands moved on by its strides
        lines += [f"  for (int64_t o = 0; o < {g.outer}; ++o) {{",
                  f"    g.a = {n('a')} + o * {g.outer_a}; g.b = {n('b')} + o * {g.outer_b}; "
                  f"g.out = {n('out')} + o * {g.outer_out};",
                  f"    if (st_status s = {call}(&g, stream)) return s;",
                  "  }",
                  "  return ST_OK;"]
        return [], lines
    if not g.chain:
        lines.append(f"  return {call}(&g, stream);")
        return [], lines
    chain = ", ".join(f"{{ST_EP_{e.kind}, {cxx.flit(e.a)}, {cxx.flit(e.b)}}}" for e in g.chain)
    lines.append(f"  const st_ep_op ops[] = {{{chain}}};")
    if g.split:  # the split product, then the chain in place by the epilogue kernel
        lines += [f"  if (st_status s = {call}(&g, stream)) return s;",
                  "  st_epilogue_args e{};",
                  f"  e.dtype = g.out_dtype; e.rows = {g.m * g.batch}; e.cols = {g.n};",
                  "  e.x = g.out; e.ldx = g.ldo; e.out = g.out; e.ldo = g.ldo; e.bias = g.bias;",
                  f"  e.residual = {n.opt('residual')}; e.ldr = {g.ldr}; e.ops = ops; e.n_ops = {len(g.chain)};",
                  "  return st_epilogue_apply(&e, stream);"]
        return [], lines
    lines.append(f"  return st_gemm_epilogue(&g, ops, {len(g.chain)}, {n.opt('residual')}, {g.ldr}, stream);")
    return [], lines


KIND = TaskKind("gemm", GemmSpec, "cublaslt_gemm", cost, interpret, render, lowers=((GemmProto, lower),),
                claims=(ClaimRule("fuse", 130, claim),), scratch=frozenset())

__all__ = ["GemmSpec", "GemmProto", "Operand", "ChainStep", "MAX_CHAIN", "KIND"]
