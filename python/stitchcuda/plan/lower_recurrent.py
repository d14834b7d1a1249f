"""Lowering a recurrent proto: per layer, the input projections as GEMMs, then one persistent kernel.

Takes a :class:`~.protos.RecurrentProto` and the :class:`~.lower.Lowerer`; gives, for every layer,

* one cuBLASLt GEMM per direction (strategy ``cublaslt_gemm``, a plain :class:`~.specs.GemmSpec`):
  ``gx[d] = X W_ihᵀ + b_ih`` over all T·B rows of the layer's input at once — the only part of a
  recurrence that does not depend on the previous step, so it runs at GEMM speed (and at the
  policy's GEMM precision) instead of step by step;
* one :class:`~.specs.RecurrentSpec` task (strategy ``recurrent_template``: recurrent.cuh's
  persistent kernel) that walks the steps of both directions inside one launch, computing
  ``h W_hhᵀ + b_hh`` and the cell per step with the state on chip.

The GEMM reads X's rows in whatever order they are stored ([T, B] or [B, T]: ``batch_first``), so a
dense input is never copied; ``gx`` keeps that row order and the kernel reads it through strides.
Layer ``l > 0`` reads layer ``l - 1``'s output sequence, a fresh [T, B, D·H] buffer; the last
layer writes the node's output where it is placed, and every layer its slice of ``h_n`` / ``c_n``.
Everything is in the policy's storage type; an operand in another dtype or layout is copied first,
an output whose target is in another dtype is written to a fresh buffer and copied back.
"""

from __future__ import annotations

from .. import layout as L
from ..layout import View
from ..precision import get as get_policy
from ..recurrent import recurrence
from .lower import Lowerer
from .protos import RecurrentProto
from .specs import GemmSpec, RecurrentSpec, Task


def emit_recurrent(lw: Lowerer, pr: RecurrentProto, pre: list[Task]) -> None:
    r = recurrence(lw.ix.nodes[pr.node], lw.shape)
    policy = pr.policy or lw.f.policy
    st = get_policy(policy).storage
    D, T, B, H, G = r.directions, r.steps, r.batch, r.hidden, r.gates
    phase = pr.phase

    def dense(t: str | None, why: str) -> View | None:
        if t is None:
            return None
        v = lw.read(t, pre, phase)
        if v.dtype == st and v.is_contiguous():
            return v
        return lw.views[lw.copy_contiguous(t, v, pre, phase, why=why, dtype=st)]

    def typed(t: str | None) -> View | None:
        """A state tensor in the storage type, any strides (the kernel reads through them)."""
        if t is None:
            return None
        v = lw.read(t, pre, phase)
        return v if v.dtype == st else lw.views[lw.copy_contiguous(t, v, pre, phase, why="recurrent state in "
                                                                   "the policy's storage type", dtype=st)]

    posts: list[tuple[View, View]] = []

    def output(t: str | None) -> View | None:
        if t is None:
            return None
        v = lw.out_view(pr, t, lambda tv: tv.dtype == st)
        if v.dtype == st:
            return v
        written = lw.fresh_rows(f"{t}_rnn", st, v.shape, phase)
        posts.append((written, v))
        return written

    h0, c0 = typed(r.h0), typed(r.c0)
    # An output sequence nobody reads still has to be written somewhere: a scratch buffer.
    out = output(r.out) if r.out in pr.outs else lw.fresh_rows(f"{r.out}_unused", st, lw.shape(r.out), phase)
    hn, cn = output(pr.hn), output(pr.cn)
    if r.batch_first:
        out = L.transpose(out, 0, 1)
    workspace = lw.fresh_rows(f"{pr.name}_state", "float32", (2 * D * B * H,), phase)

    x_view = lw.read(r.x, pre, phase)
    layer_in = L.transpose(x_view, 0, 1) if r.batch_first else x_view  # logical [T, B, F]
    for layer in range(r.layers):
        F = r.layer_input(layer)
        rows, first = _rows(layer_in, st)
        if rows is None:
            c = lw.copy_contiguous(r.x if layer == 0 else f"{pr.name}_y{layer - 1}", layer_in, pre, phase,
                                   why="the input projection reads the sequence as rows of a matrix", dtype=st)
            layer_in = lw.views[c]
            rows, first = _rows(layer_in, st)
        assert rows is not None
        M, lda, a_view = rows
        gx_buf = lw.fresh_rows(f"{pr.name}_gx{layer}", st, (D, M, G * H), phase)
        for d in range(D):
            w = r.weights[layer * D + d]
            w_ih = dense(w.w_ih, "the input projection reads W_ih dense")
            b_ih = dense(w.b_ih, "the input projection's bias is one dense vector")
            gxd = View(gx_buf.buffer, gx_buf.offset + d * M * G * H, (M, G * H), (G * H, 1), st)
            spec = GemmSpec("gemm", policy, M, G * H, F, 1, a_view, lda, 0, False, w_ih, F, 0, True, gxd, G * H, 0,
                            bias=b_ih, epilogue="bias" if b_ih is not None else "none")
            lw.add(pr, f"{pr.name}_l{layer}{'_reverse' if d else ''}_input", "cublaslt_gemm", spec,
                   [a_view, w_ih, b_ih], [gxd], touched=[r.x] if layer == 0 else [],
                   note=f"input projection of layer {layer}{' (reverse)' if d else ''}, every step at once")
        # gx logical [D, T, B, G·H], rows in the order the GEMM read them.
        gx = View(gx_buf.buffer, gx_buf.offset, (D, T, B, G * H),
                  (M * G * H, B * G * H, G * H, 1) if first == "t" else (M * G * H, G * H, T * G * H, 1), st)
        last = layer == r.layers - 1
        y = out if last else lw.fresh_rows(f"{pr.name}_y{layer}", st, (T, B, D * H), phase)
        ws = [r.weights[layer * D + d] for d in range(D)]
        whh = [dense(w.w_hh, "the recurrent kernel reads W_hh dense") for w in ws]
        bhh = [dense(w.b_hh, "the recurrent kernel reads b_hh as one dense vector") for w in ws]
        sl = slice(layer * D, (layer + 1) * D)

        def part(v: View | None) -> View | None:
            return None if v is None else L.slice_(v, 0, sl.start, sl.stop)

        spec_r = RecurrentSpec("recurrent", policy, r.mode, T, B, H, D, gx, whh[0], y, workspace,
                               w_hh_r=whh[1] if D == 2 else None, b_hh=bhh[0], b_hh_r=bhh[1] if D == 2 else None,
                               h0=part(h0), c0=part(c0), hn=part(hn), cn=part(cn))
        touched = [t for t in (r.out, pr.hn, pr.cn) if t] if last else []
        lw.add(pr, f"{pr.name}_l{layer}", "recurrent_template", spec_r,
               [gx, *whh, *bhh, part(h0), part(c0)], [y, part(hn), part(cn), workspace], touched=touched,
               note=f"layer {layer} of {r.layers}: every step of {'both directions' if D == 2 else 'the layer'} "
                    "in one persistent kernel")
        layer_in = y
    for written, target in posts:
        lw.tasks.append(lw.copy_task(f"{pr.name}_{written.buffer}_out", list(pr.nodes), written, target, phase, note="writes the recurrent result back in the reference's dtype"))


def _rows(v: View, st: str) -> tuple[tuple[int, int, View] | None, str]:
    """A [T, B, F] sequence as the A operand of one GEMM: ((rows, leading dim, 2-D view), "t") when
    its (t, b) rows have one stride, "b" when its (b, t) rows do (batch first), else (None, "")."""
    if v.dtype != st or (v.strides[2] != 1 and v.shape[2] != 1):
        return None, ""
    T, B, F = v.shape
    for first, shape, strides in (("t", (T, B), v.strides[:2]), ("b", (B, T), (v.strides[1], v.strides[0]))):
        c = L.collapse(shape, strides)
        if c is None:
            continue
        m, ld = c
        ld = ld if m > 1 and ld else F
        if m > 1 and ld < F:
            continue
        return (m, ld, View(v.buffer, v.offset, (m, F), (ld, 1), st)), first
    return None, ""


__all__ = ["emit_recurrent"]
