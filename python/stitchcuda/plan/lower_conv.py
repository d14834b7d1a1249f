"""Lowering a convolution proto: the dense channels-first operands st_conv takes.

Takes a :class:`~.protos.ConvProto` and the :class:`~.lower.Lowerer`; gives a task with a
:class:`~.specs.ConvSpec` (strategy ``cudnn_conv``: the runtime's cuDNN plan, cached by shape,
on the runtime's per-stream workspace). cuDNN reads x, w and bias and writes out dense and in
one storage type (the policy's): an operand that is a strided view or in another dtype is copied
(cast) first, and an output whose placement target is not dense (a slot of a concatenation, a
tensor kept in float32 under a 16-bit policy) is written to a fresh buffer and copied back.
"""

from __future__ import annotations

from .. import layout as L
from ..layout import View
from ..precision import get as get_policy
from .lower import Lowerer
from .protos import ConvProto
from .specs import ConvSpec, Task


def _dense(v: View, dtype: str) -> bool:
    return v.dtype == dtype and v.is_contiguous()


def emit_conv(lw: Lowerer, pr: ConvProto, pre: list[Task]) -> None:
    policy = pr.policy or lw.f.policy
    st = get_policy(policy).storage

    def operand(t: str, why: str) -> View:
        v = lw.read(t, pre, pr.phase)
        if _dense(v, st):
            return v
        return lw.views[lw.copy_contiguous(t, v, pre, pr.phase, why=why, dtype=st)]

    vx = operand(pr.x, "cuDNN reads the convolution's input dense, channels-first")
    vw = operand(pr.w, "cuDNN reads the convolution's weight dense")
    vb = None
    if pr.bias:
        vb = operand(pr.bias, "cuDNN reads the bias as one contiguous vector")
        if vb.ndim != 1:
            vb = L.reshape(vb, (vb.numel,))
    vo = lw.out_view(pr, pr.out, lambda tv: _dense(tv, st))
    post = None
    if not _dense(vo, st):
        written = lw.fresh_rows(f"{pr.out}_conv", st, vo.shape, pr.phase)
        post = (written, vo)
        vo = written
    nsp = len(pr.stride)
    xs, ws = vx.shape, vw.shape
    out_channels = ws[1] * pr.groups if pr.transposed else ws[0]
    spec = ConvSpec("conv", policy, vx, vw, vo, batch=xs[0], in_channels=xs[1], out_channels=out_channels,
                    groups=pr.groups, in_size=tuple(xs[2:]), kernel=tuple(ws[2:]), stride=tuple(pr.stride),
                    padding=tuple(pr.padding), dilation=tuple(pr.dilation), output_padding=tuple(pr.output_padding),
                    transposed=pr.transposed, bias=vb, activation=pr.activation)
    assert len(spec.in_size) == nsp and vo.shape[:2] == (xs[0], out_channels), (vo.shape, xs, ws)
    lw.add(pr, pr.name, "cudnn_conv", spec, [vx, vw, vb], [vo], touched=list(pr.ins) + [pr.out])
    if post is not None:
        lw.tasks.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), post[0], post[1], pr.phase,
                                     note="writes the convolution's result back in the reference's layout"))


__all__ = ["emit_conv"]
