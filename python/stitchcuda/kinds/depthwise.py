"""Depthwise 2-d convolutions through a kernel of our own (depthwise.cuh), in either layout.

A depthwise convolution (``groups`` = input channels = output channels) does k·k multiply-adds
per element it reads: it is memory-bound, and cuDNN serves it poorly — on an H100 at tf32 a
16x64x512x512 3x3 one took 12.8 ms channels-first and 19.4 ms channels-last through the runtime's
best engines, against 2.5 ms and 0.9 ms for PyTorch's own depthwise kernels (BENCHMARKS.md,
"Convolution engines"). This kind runs it directly, one thread per output element, at the memory
floor's scale.

Claim (*fuse*, before the other convolutions): a 2-d, non-transposed convolution with
``groups == in_channels == out_channels`` over float data, with the unary elementwise ops right
after it as an epilogue hook (applied to the biased result), as reductions and pooling take theirs,
and a zero padding right before it (``F.pad``, TensorFlow's asymmetric "same" padding as Hugging
Face's MobileNets and EfficientNets write it) folded into its own: the padded copy was a gather
that wrote a tensor as large as the input, channels-first, from channels-last data.

Lowering: the layout follows the input's (channels-last data from a channels-last region stays
so, a channels-first input is read as it lies: no conversion either way); the weights are read
as one dense block in the input's storage type (converted once, at create, when they are not),
the bias likewise: [channels, kh, kw] channels-first, tap-major ([kh, kw, channels]) channels-last,
where consecutive threads take consecutive channels and a filter tap is then one coalesced load
(channel-major, a warp's load of one tap spanned 32 filters: nine times the sectors).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .base import (FLOAT_DTYPES, ClaimRule, Proto, TaskKind, conv2d_reference, dense_block, hooked_touched, int_list,
                   view_bytes)

A = ops.A
HEADER = "depthwise.cuh"


@dataclass(frozen=True)
class DepthwiseSpec:
    """depthwise.cuh: ``out = epilogue(bias + depthwise_conv(prologue(x), w))`` over x [N, C, H, W]
    and out [N, C, OH, OW] (any strides), w [C, kh, kw] dense channel-major (strides kh·kw, kw, 1)
    or tap-major (1, kw·C, C), bias [C] (or None); ``stride``, ``padding``, ``dilation`` per
    spatial dim. ``padding`` is the zeros before the first row and column; after the last there
    are as many as out's extent reads (the padding may be asymmetric: a folded ``F.pad``). Hooks
    as RowSpec."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "depthwise")

    kind: str
    x: View
    w: View
    out: View
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    bias: View | None = None
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class DepthwiseProto(Proto):
    x: str = ""
    w: str = ""
    bias: str | None = None
    out: str = ""
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()


# ---------------------------------------------------------------------- claim


def depthwise(ix, n: Node) -> bool:
    """Whether convolution node ``n`` is one this kind computes."""
    if ops.kind(n.op) != "conv" or n.attr("transposed"):
        return False
    xs, ws = ix.shape(n.inputs[0]), ix.shape(n.inputs[1])
    groups = int(n.attr("groups") or 1)
    return len(xs) == 4 and len(ws) == 4 and groups > 1 and xs[1] == groups and ws[0] == groups and ws[1] == 1 and \
        all(ix.spec(t).dtype in FLOAT_DTYPES for t in n.inputs)


def claim(cx) -> None:
    """Claim every free depthwise convolution, in graph order, with its hooks."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if cx.free(n) and depthwise(ix, n):
            a = ix.args(n, ops.args(n.op))
            x, w = a["input"][1], a["weight"][1]
            bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
            padding = int_list(n.attr("padding"), 2, 0)
            pad, x, (top, left) = _zero_pad(cx, x)
            padding = (padding[0] + top, padding[1] + left)
            _, _, epi, out = cx.hooks(n, x, n.outputs[0].name)  # its epilogue hook (no prologue: padding)
            nodes = pad + [n.name] + epi
            cx.claim(DepthwiseProto(cx.name(nodes), tuple(nodes), (out,), tuple(t for t in (x, w, bias) if t), x=x,
                                    w=w, bias=bias, out=out, stride=int_list(n.attr("stride"), 2, 1),
                                    padding=padding, dilation=int_list(n.attr("dilation"), 2, 1), epi=tuple(epi)))


def _zero_pad(cx, x: str) -> tuple[list[str], str, tuple[int, int]]:
    """``([the pad node], its input, (top, left))`` when ``x`` is a free zero ``constant_pad_nd`` of
    the two spatial dims, non-negative, read by nothing else; else ``([], x, (0, 0))``. The zeros
    after the last row and column need nothing: every tap outside the input reads as zero."""
    ix = cx.ix
    pn = ix.producer.get(x)
    if pn is None or pn.op != A + "constant_pad_nd.default" or not cx.free(pn) or ix.only_user(x) is None:
        return [], x, (0, 0)
    pad = [int(v) for v in pn.attr("pad")]
    if float(pn.attr("value") or 0.0) != 0.0 or len(pad) > 4 or any(v < 0 for v in pad):
        return [], x, (0, 0)
    pad += [0] * (4 - len(pad))  # (left, right, top, bottom)
    return [pn.name], pn.inputs[0], (pad[2], pad[0])


# ---------------------------------------------------------------------- lower


def lower(lw, pr: DepthwiseProto, pre: list) -> None:
    vx = lw.read(pr.x, pre, pr.phase)
    if vx.dtype not in FLOAT_DTYPES or any(s < 0 for s in vx.strides):
        vx = lw.views[lw.copy_contiguous(pr.x, vx, pre, pr.phase, why="the depthwise kernel reads a float tensor",
                                         dtype=vx.dtype if vx.dtype in FLOAT_DTYPES else "float32")]
    st = vx.dtype

    def dense(t: str, shape: tuple[int, ...], why: str) -> View:
        return dense_block(lw, t, shape, st, pre, pr.phase, why)

    c = vx.shape[1]
    ws = lw.shape(pr.w)
    order = L.channels_last_order(4) if L.is_channels_last(vx) else None
    if order is None or c == 1:
        vw = dense(pr.w, (c, ws[2], ws[3]), "the depthwise kernel reads its filters as one dense block")
    else:  # tap-major (module docstring), made once at create
        v = lw.read(pr.w, pre, pr.phase)
        phase = "create" if lw.buffers[v.buffer].kind in ("weight", "const") else pr.phase
        taps = lw.views[lw.copy_contiguous(pr.w, v, pre, phase, dtype=st, order=(1, 2, 3, 0),
                                           why="channels-last, the depthwise kernel reads a filter tap of "
                                               "consecutive channels at once")]
        vw = View(taps.buffer, taps.offset, (c, ws[2], ws[3]), (1, ws[3] * c, c), st)
    vb = dense(pr.bias, (c,), "the depthwise kernel reads its bias as one dense vector") if pr.bias else None
    vo = lw.out_view(pr, pr.out, lambda tv: all(s >= 0 for s in tv.strides) and
                     (order is None or L.is_dense_in(tv, order)), order=order)
    spec = DepthwiseSpec("depthwise", vx, vw, vo, tuple(pr.stride), tuple(pr.padding), tuple(pr.dilation), vb,
                         lw.hook(pr.pro), lw.hook(pr.epi))
    lw.add(pr, pr.name, spec, [vx, vw, vb], [vo], touched=hooked_touched(lw, pr))


def out_order(pr: DepthwiseProto, order_of) -> tuple[int, ...] | None:
    """Channels-last data stays channels-last (see :func:`lower`)."""
    order = order_of(pr.x)
    return order if order == L.channels_last_order(4) else None


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: DepthwiseSpec, ceil) -> tuple[float, float, float]:
    taps = spec.w.shape[1] * spec.w.shape[2]
    n = math.prod(spec.out.shape)
    flops = n * (2 * taps + len(spec.epilogue) + int(spec.bias is not None)) + len(spec.prologue) * math.prod(spec.x.shape)
    return float(flops), float(view_bytes(spec.x) + view_bytes(spec.w) + view_bytes(spec.bias) +
                               view_bytes(spec.out)), ceil.fp32


def interpret(mem, s: DepthwiseSpec) -> None:
    x = mem.hook(s.prologue, mem.read(s.x))
    w = mem.read(s.w).unsqueeze(1)
    b = mem.read(s.bias) if s.bias is not None else None
    y = conv2d_reference(x, w, b, s.out.shape, s.stride, s.padding, s.dilation, groups=x.shape[1])
    mem.write(s.out, mem.hook(s.epilogue, y))


def render(t, s: DepthwiseSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    act = ""
    if s.prologue:
        raise cxx.CodeError(f"task {t.name}: the depthwise kernel takes no prologue hook yet")
    if s.epilogue:
        pre = cxx.hook(f"{fn}_epi", s.epilogue)
        act = f", {fn}_epi{{}}"
    x, o = s.x, s.out
    body = [f"  stitch::DepthwiseParams<{ctype(x.dtype)}, {ctype(o.dtype)}> p{{}};",
            f"  p.x = {n('x')}; p.w = {n('w')}; p.bias = {n.opt('bias')}; p.out = {n('out')};",
            f"  p.batch = {x.shape[0]}; p.channels = {x.shape[1]}; p.h = {x.shape[2]}; p.w_in = {x.shape[3]}; "
            f"p.oh = {o.shape[2]}; p.ow = {o.shape[3]};",
            "  " + " ".join(f"p.x_stride[{j}] = {v};" for j, v in enumerate(x.strides)),
            "  " + " ".join(f"p.out_stride[{j}] = {v};" for j, v in enumerate(o.strides)),
            f"  p.kh = {s.w.shape[1]}; p.kw = {s.w.shape[2]}; p.stride_h = {s.stride[0]}; p.stride_w = {s.stride[1]}; "
            f"p.pad_h = {s.padding[0]}; p.pad_w = {s.padding[1]}; p.dil_h = {s.dilation[0]}; p.dil_w = {s.dilation[1]};"]
    if s.w.strides[0] == 1 and s.w.shape[0] > 1:
        body.append(f"  p.w_tap_stride = {s.w.strides[2]};  // tap-major filters")
    # the kernels this call can take, known now (depthwise.cuh: launch_depthwise's FAST and SQ)
    fast = int(o.strides[1] == 1 and x.shape[1] > 1)
    kh, kw = s.w.shape[1], s.w.shape[2]
    sq = kh if kh == kw and kh in (3, 5, 7) else 0
    return cxx.include(HEADER) + pre, body + cxx.call(t.name, f"stitch::launch_depthwise<{fast}, {sq}>(p, stream{act})")


KIND = TaskKind("depthwise", DepthwiseSpec, "custom_kernel", cost, interpret, render,
                lowers=((DepthwiseProto, lower),), claims=(ClaimRule("fuse", 95, claim),), scratch=frozenset(),
                out_order=out_order)

__all__ = ["DepthwiseSpec", "DepthwiseProto", "depthwise", "KIND"]
