"""Lowering a GEMM proto: operand layouts, batching, and the epilogue split between cuBLASLt and
the runtime's chain.

Takes a :class:`~.protos.GemmProto` and the :class:`~.lower.Lowerer`; gives a task with a
:class:`~.specs.GemmSpec`. One big 2-D GEMM when ``b`` is one matrix and ``a``'s batch rows
stack with a uniform stride; otherwise a strided-batched GEMM. Operands that are not matrices
in the policy's storage type are copied (cast) first. The epilogue: a leading scale folds into
``alpha``, a per-column add into the bias, a same-shape add into ``beta·C`` (else a residual
op), a leading ReLU (or tanh GELU off fp32) into cuBLASLt's epilogue, the rest into the
runtime's chain in reference order.
"""

from __future__ import annotations

import math
from typing import Sequence

from .. import layout as L
from ..layout import View
from ..precision import get as get_policy
from .lower import Lowerer
from .protos import GemmProto, Operand
from .specs import EpOp, GemmSpec, Task


def emit_gemm(lw: Lowerer, pr: GemmProto, pre: list[Task]) -> None:
    policy = pr.policy or lw.f.policy
    st = get_policy(policy).storage

    def operand(x: Operand) -> View:
        v = lw.read(x.tensor, pre, pr.phase)
        return L.transpose(v, -1, -2) if x.transposed else v

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
    spec = GemmSpec("gemm", policy, M, n, kk, batch, a_view, ma.ld, ma.batch_stride, ma.trans,
                    vb2, mb.ld, mb.batch_stride, mb.trans, out_view, mo.ld, mo.batch_stride if batch > 1 else 0,
                    alpha=alpha, beta=beta, c=c_v, ldc=ldc, stride_c=stride_c, bias=bias_v, epilogue=epilogue,
                    chain=tuple(chain), residual=res_v, ldr=ldr)
    reads = [a_view, vb2, bias_v, c_v, res_v]
    lw.add(pr, pr.name, "cublaslt_gemm", spec, reads, [out_view], touched=list(pr.ins) + [out_t])


__all__ = ["emit_gemm"]
