"""Recurrent layers (``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM``): one node each, claimed whole.

Lowering: per layer, the input projections as GEMMs, then one persistent kernel —

* one cuBLASLt GEMM per direction (strategy ``cublaslt_gemm``, a plain :class:`~.gemm.GemmSpec`):
  ``gx[d] = X W_ihᵀ + b_ih`` over all T·B rows of the layer's input at once — the only part of a
  recurrence that does not depend on the previous step, so it runs at GEMM speed (and at the
  policy's GEMM precision) instead of step by step;
* one :class:`RecurrentSpec` task (strategy ``recurrent_template``: recurrent.cuh's
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

from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..dtypes import ctype
from ..layout import View
from ..precision import get as get_policy
from ..recurrent import cell, recurrence
from . import cxx
from .base import FLOAT_DTYPES, ClaimRule, Proto, TaskKind, view_bytes
from .gemm import GemmSpec


@dataclass(frozen=True)
class RecurrentSpec:
    """One layer of a recurrent module (both directions) through recurrent.cuh's persistent kernel:
    for every step t (direction 1 walking t from ``steps - 1`` down),
    ``gh = h W_hhᵀ + b_hh`` and ``(h, c) = cell(gx[d, t], gh, h, c)`` (:func:`stitchcuda.recurrent.
    cell`; ``mode`` ``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``), written to ``out[t, :, d·H:(d+1)·H]``.

    ``gx`` [D, T, B, G·H] (last dim dense) holds ``x W_ihᵀ + b_ih`` for every step, computed before
    by the layer's input-projection GEMMs; ``w_hh`` / ``w_hh_r`` [G·H, H] dense; ``b_hh`` /
    ``b_hh_r`` [G·H] or None; ``h0`` / ``c0`` [D, B, H] (None: zeros); ``out`` [T, B, D·H]; ``hn``
    / ``cn`` [D, B, H] the final state (None: not written); any strides. All in the storage type of
    ``policy``; the state stays fp32 (``workspace``: 2·D·B·H floats for the steps' exchange)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "recurrent")

    kind: str
    policy: str
    mode: str
    steps: int
    batch: int
    hidden: int
    directions: int
    gx: View
    w_hh: View
    out: View
    workspace: View
    w_hh_r: View | None = None
    b_hh: View | None = None
    b_hh_r: View | None = None
    h0: View | None = None
    c0: View | None = None
    hn: View | None = None
    cn: View | None = None


@dataclass(frozen=True)
class RecurrentProto(Proto):
    """One recurrent node (``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM``; :class:`~stitchcuda.recurrent.
    Recurrence` says what it computes): per layer, one input-projection GEMM per direction and one
    persistent recurrent kernel. ``hn`` / ``cn`` are None when nobody reads them."""

    node: str = ""
    out: str = ""
    hn: str | None = None
    cn: str | None = None
    policy: str = ""


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    """Claim every recurrent node (one proto each: see the module docstring)."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) != "recurrent" or not cx.free(n):
            continue
        try:
            r = recurrence(n, ix.shape)
        except ValueError as err:
            raise cx.fail(n, str(err)) from None
        for t in n.inputs:
            if ix.spec(t).dtype not in FLOAT_DTYPES:
                raise cx.fail(n, f"a recurrent layer over {ix.spec(t).dtype}")
        hn = r.hn if cx.used(r.hn) else None
        cn = r.cn if r.cn and cx.used(r.cn) else None
        outs = tuple(t for t in (r.out if cx.used(r.out) else None, hn, cn) if t)
        cx.claim(RecurrentProto(cx.name([n.name]), (n.name,), outs, tuple(dict.fromkeys(n.inputs)), node=n.name,
                                out=r.out, hn=hn, cn=cn, policy=cx.policy_of([n.name])))



# ---------------------------------------------------------------------- lower


def lower(lw, pr: RecurrentProto, pre: list) -> None:
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
            lw.add(pr, f"{pr.name}_l{layer}{'_reverse' if d else ''}_input", spec,
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
        lw.add(pr, f"{pr.name}_l{layer}", spec_r,
               [gx, *whh, *bhh, part(h0), part(c0)], [y, part(hn), part(cn), workspace], touched=touched,
               note=f"layer {layer} of {r.layers}: every step of {'both directions' if D == 2 else 'the layer'} "
                    "in one persistent kernel")
        layer_in = y
    for written, target in posts:
        lw.append(lw.copy_task(f"{pr.name}_{written.buffer}_out", list(pr.nodes), written, target, phase, note="writes the recurrent result back in the reference's dtype"))


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


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: RecurrentSpec, ceil) -> tuple[float, float, float]:
    # h W_hhᵀ every step (the input projections are GEMM tasks of their own) plus the cell;
    # W_hh is read once per launch (the kernel keeps it on chip), the sequences once.
    gh = spec.directions * spec.steps * 2 * spec.batch * spec.hidden * spec.gx.shape[-1]
    flops = gh + spec.directions * spec.steps * spec.batch * spec.gx.shape[-1] * 4
    nbytes = sum(view_bytes(v) for v in (spec.gx, spec.w_hh, spec.w_hh_r, spec.b_hh, spec.b_hh_r, spec.h0,
                                         spec.c0, spec.out, spec.hn, spec.cn))
    return float(flops), nbytes, ceil.fp32


def interpret(mem, s: RecurrentSpec) -> None:
    """One layer of a recurrence in float64 (recurrent.cuh): every step of every direction, the
    state carried unrounded (the kernel keeps it in fp32), the sequence and final state stored."""
    import torch

    D, T, B, H = s.directions, s.steps, s.batch, s.hidden
    assert s.gx.strides[-1] == 1 and s.w_hh.is_contiguous(), "recurrent.cuh: gx rows and W_hh dense"
    gx = mem.read(s.gx)
    for d in range(D):
        w = mem.read(s.w_hh if d == 0 else s.w_hh_r)
        bv = s.b_hh if d == 0 else s.b_hh_r
        b = mem.read(bv) if bv is not None else torch.zeros((), dtype=torch.float64, device=mem.device)
        h = mem.read(s.h0)[d] if s.h0 is not None else torch.zeros((B, H), dtype=torch.float64, device=mem.device)
        c = (mem.read(s.c0)[d] if s.c0 is not None else torch.zeros_like(h)) if s.mode == "lstm" else None
        out = mem.view(s.out)
        for step in range(T):
            t = T - 1 - step if d == 1 else step
            h, c = cell(s.mode, gx[d, t], h @ w.T + b, h, c)
            out[t, :, d * H:(d + 1) * H].copy_(h.to(out.dtype))
        if s.hn is not None:
            mem.write(s.hn, h, shape=(B, H), strides=s.hn.strides[1:], offset=d * s.hn.strides[0])
        if s.cn is not None:
            mem.write(s.cn, c, shape=(B, H), strides=s.cn.strides[1:], offset=d * s.cn.strides[0])


_RNN_MODE = {"lstm": "Lstm", "gru": "Gru", "rnn_tanh": "RnnTanh", "rnn_relu": "RnnRelu"}


def render(t, r: RecurrentSpec, n, fn: str) -> tuple[list[str], list[str]]:
    """recurrent.cuh: one cooperative launch walking every step of the layer (both directions);
    a tag type named after the task names the kernel in profiles."""

    def strides(field: str, v: View | None, dims: str) -> str:
        if v is None:
            return f"p.{field} = nullptr;"
        return f"p.{field} = {n(field)}; " + " ".join(f"p.{field}_s{c} = {s_};" for c, s_ in zip(dims, v.strides))

    body = [f"  stitch::RecurrentParams<{ctype(r.gx.dtype)}> p{{}};",
            f"  p.steps = {r.steps}; p.batch = {r.batch}; p.hidden = {r.hidden}; p.directions = {r.directions};",
            "  " + strides("gx", r.gx, "dtb"),
            f"  p.w_hh[0] = {n('w_hh')}; p.w_hh[1] = {n.opt('w_hh_r')};",
            f"  p.b_hh[0] = {n.opt('b_hh')}; p.b_hh[1] = {n.opt('b_hh_r')};",
            "  " + strides("h0", r.h0, "dbh"), "  " + strides("c0", r.c0, "dbh"),
            "  " + strides("out", r.out, "tbh"), "  " + strides("hn", r.hn, "dbh"), "  " + strides("cn", r.cn, "dbh"),
            f"  p.state = {n('workspace')};"]
    pre = [f"struct {fn}_tag {{}};  // names the kernel after its task", ""]
    launch = f"stitch::launch_recurrent<stitch::RnnMode::{_RNN_MODE[r.mode]}, {ctype(r.gx.dtype)}, {fn}_tag>(p, stream)"
    return cxx.include("recurrent.cuh") + pre, body + cxx.call(t.name, launch)


KIND = TaskKind("recurrent", RecurrentSpec, "recurrent_template", cost, interpret, render,
                lowers=((RecurrentProto, lower),), claims=(ClaimRule("fuse", 110, claim),),
                writes=frozenset({"out", "hn", "cn"}))

__all__ = ["RecurrentSpec", "RecurrentProto", "KIND"]
