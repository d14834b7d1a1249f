"""Dense 2-d convolutions over few input channels through a kernel of our own (narrow_conv.cuh), on
tensor cores, in either layout, with the elementwise ops after them as an epilogue hook.

A convolution whose sum is short (in_channels x the filter's taps at most ``NARROW_K``: an RGB stem,
eight channels of 3x3 taps) does few multiply-adds per byte it writes: it should be bound by its output.
cuDNN serves it poorly: on an H100 at tf32, a 128x8x128x128 -> 64 3x3 one ran 0.50 ms channels-last
on its best engine, 2.5x the bytes' floor, and 0.72 ms channels-first (BENCHMARKS.md, "Convolution
problems: the cause found with CUPTI"), and the channels-last engines need the input copied first
and the result's layout changed after. This kind reads the input as it lies, writes the result in
whatever layout its consumer wants, and runs the activations after it (a hook, as depthwise and
pooling take theirs) on the accumulators, so the convolution's result is written once.

Claim (*fuse*, after depthwise and before cuDNN's convolutions): a 2-d, non-transposed, ungrouped
convolution over float32 data with a filter of several taps, at most ``NARROW_CHANNELS`` input
channels and a sum of at most ``NARROW_K``, whose staged tile fits (narrow_conv.cuh), in a program
that stores float32 (tf32 or fp32); under the conv strategy ``narrow`` (which
:func:`stitchcuda.plan.choices` offers for those convolutions and the loop's Variants proposer
measures against cuDNN's), and by default only where the result, after the epilogue hook, leaves
the program (:func:`leaves_program`), the sum is at most ``DEFAULT_K`` and the convolution computes
under tensor cores (tf32: cuDNN's plan is channels-last there, with the copies this kernel saves;
under fp32 it is channels-first, without them, and the kernel was measured at tf32 only). On an
H100 at tf32 (BENCHMARKS.md, "A kernel of our own for convolutions over few channels") it won there
(KernelBench 2:57, conv -> ReLU -> hardswish: 0.725 ms against 0.855, 1.38x torch.compile against
1.13x; 2:69 and 2:71 1.19x and 1.21x) and lost where a norm, pool or reduction reads the result
(2:73 0.84x against 0.96x; 2:67 0.55x): the kernel itself ran 2:73's convolution at 0.69 ms
against cuDNN's 0.50. Two rewrites that copied the next tile's input in by cp.async while one
computed were slower still (2:57 at 0.97 and 1.12 ms): Nsight Compute found them issue-bound,
half the issue slots used and a quarter of the bandwidth.

Precision: one TF32 product per multiply where the policy rounds matrix work to TF32, as cuDNN's
TF32 engines; split TF32 (three products: big x big + big x small + small x big, about fp32's
accuracy; mma.cuh) where the convolution computes at fp32 (the fp32 policy, the precision repair's
raise, or a short sum under tf32: conv.py's :func:`~.conv.short_sums`, "precision where it costs
nothing"). The products are cheap here: the bytes bound the time either way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from ..precision import get as get_policy
from . import cxx
from .base import ClaimRule, TaskKind, conv2d_reference, dense_block, int_list, view_bytes
from .conv import ConvArgsProto, leaves_program, short_sums

A = ops.A
HEADER = "narrow_conv.cuh"

#: The longest sum (in_channels x kh x kw) this kind takes (narrow_conv.cuh: kNcMaxK).
NARROW_K = 160
#: The most input channels it takes: wider inputs are GEMM-shaped, where cuDNN's engines do well.
NARROW_CHANNELS = 16
#: The longest sum it takes by default (where its result leaves the program). The kernel is bound
#: by issuing its products, so its time per output grows with the sum, while what it saves (cuDNN's
#: input copy and the result's layout change) is a fixed cost per output. On an H200 at tf32
#: (BENCHMARKS.md, "The narrow kernel by default (756abb0), measured, then bounded") it ran in
#: 0.81-0.94x cuDNN's plan's time with sums of 72 (8 channels x 3 x 3), 1.45x with 144 (16 x 3 x 3).
DEFAULT_K = 96
#: Output tile and staged-input bound of narrow_conv.cuh (kNcTileH, kNcTileW, kNcMaxStage).
TILE_H, TILE_W, MAX_STAGE = 8, 16, 6144


@dataclass(frozen=True)
class NarrowConvSpec:
    """narrow_conv.cuh: ``out = epilogue(bias + conv2d(x, w))`` over x [N, C, H, W] and out [N, O,
    OH, OW] (any strides), w [O, C, kh, kw] dense, bias [O] (or None), all float32; ``stride``,
    ``padding`` (zeros before the first row and column; after the last, as many as out's extent
    reads), ``dilation`` per spatial dim. ``policy``: what the products compute at: ``tf32`` (one
    TF32 product), ``fp32`` (split TF32, about fp32's accuracy: :attr:`split`)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "narrow_conv")

    kind: str
    x: View
    w: View
    out: View
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    policy: str
    bias: View | None = None
    epilogue: tuple[EwInstr, ...] = ()

    @property
    def split(self) -> bool:
        return not get_policy(self.policy).tf32


@dataclass(frozen=True)
class NarrowConvProto(ConvArgsProto):
    """The convolution, the policy its products compute at, and its epilogue hook's nodes ``epi``."""

    policy: str = "fp32"
    epi: tuple[str, ...] = ()


# ---------------------------------------------------------------------- claim


def staged(cin: int, kernel: tuple[int, int], stride: tuple[int, int], dilation: tuple[int, int]) -> int:
    """Input values a block stages under one tile of outputs (narrow_conv.cuh)."""
    rows = (TILE_H - 1) * stride[0] + (kernel[0] - 1) * dilation[0] + 1
    cols = (TILE_W - 1) * stride[1] + (kernel[1] - 1) * dilation[1] + 1
    return cin * rows * cols


def narrow(g, n: Node) -> bool:
    """Whether convolution node ``n`` is one this kind can compute (the module docstring's claim);
    ``g``: the graph or its index (anything whose ``spec(tensor)`` has the tensor's shape and dtype)."""
    if ops.kind(n.op) != "conv" or n.attr("transposed") or int(n.attr("groups") or 1) != 1:
        return False
    xs, ws = g.spec(n.inputs[0]).shape, g.spec(n.inputs[1]).shape
    if len(xs) != 4 or len(ws) != 4 or not all(t is not None and g.spec(t).dtype == "float32" for t in n.inputs):
        return False
    cin, kernel = ws[1], (ws[2], ws[3])
    return math.prod(kernel) > 1 and cin <= NARROW_CHANNELS and cin * math.prod(kernel) <= NARROW_K and \
        staged(cin, kernel, tuple(int_list(n.attr("stride"), 2, 1)), tuple(int_list(n.attr("dilation"), 2, 1))) \
        <= MAX_STAGE


def claim(cx) -> None:
    """Claim every free narrow convolution, in graph order, with its epilogue hook: under the conv
    strategy ``narrow``, or by default (``auto``) under tensor cores where its result
    :func:`leaves_program` and its sum is at most ``DEFAULT_K``."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        option = cx.constraints.option(n.name, "auto")
        if not (cx.free(n) and narrow(ix, n)) or option not in ("auto", "narrow"):
            continue
        policy = get_policy(cx.policy_of([n.name]))
        if policy.storage != "float32":
            continue
        a = ix.args(n, ops.args(n.op))
        x, w = a["input"][1], a["weight"][1]
        bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
        ws = ix.shape(w)
        _, _, epi, out = cx.hooks(n, x, n.outputs[0].name)  # its epilogue hook (no prologue)
        if cx.absorbs_unfused(epi):
            epi, out = [], n.outputs[0].name
        if option == "auto" and not (policy.tensor_cores and leaves_program(ix, out) and
                                     ws[1] * ws[2] * ws[3] <= DEFAULT_K):
            continue
        nodes = [n.name] + epi
        at = "fp32" if not policy.tf32 or short_sums(ws[1], ws[2:], math.prod(n.outputs[0].shape)) else policy.name
        cx.claim(NarrowConvProto(cx.name(nodes), tuple(nodes), (out,), tuple(t for t in (x, w, bias) if t), x=x,
                                 w=w, bias=bias, out=out, stride=int_list(n.attr("stride"), 2, 1),
                                 padding=int_list(n.attr("padding"), 2, 0),
                                 dilation=int_list(n.attr("dilation"), 2, 1), policy=at, epi=tuple(epi)))


# ---------------------------------------------------------------------- lower


def lower(lw, pr: NarrowConvProto, pre: list) -> None:
    vx = lw.read(pr.x, pre, pr.phase)
    if vx.dtype != "float32" or any(s < 0 for s in vx.strides):
        vx = lw.views[lw.copy_contiguous(pr.x, vx, pre, pr.phase, dtype="float32",
                                         why="the narrow convolution reads float32 at non-negative strides")]

    ws = lw.shape(pr.w)
    vw = dense_block(lw, pr.w, tuple(ws), "float32", pre, pr.phase,
                     "the narrow convolution reads its filters as one dense block")
    vb = dense_block(lw, pr.bias, (ws[0],), "float32", pre, pr.phase,
                     "the narrow convolution reads its bias as one dense vector") if pr.bias else None
    order = L.channels_last_order(4) if L.is_channels_last(vx) and vx.shape[1] > 1 else None
    vo = lw.out_view(pr, pr.out, lambda tv: tv.dtype == "float32" and all(s >= 0 for s in tv.strides) and
                     (order is None or L.is_dense_in(tv, order)), order=order)
    if vo.dtype != "float32" or any(s < 0 for s in vo.strides):
        raise AssertionError(f"{pr.name}: the narrow convolution writes float32 at non-negative strides")
    spec = NarrowConvSpec("narrow_conv", vx, vw, vo, tuple(pr.stride), tuple(pr.padding), tuple(pr.dilation),
                          pr.policy, vb, lw.hook(pr.epi))
    lw.add(pr, pr.name, spec, [vx, vw, vb], [vo], touched=list(pr.ins) + [pr.out, pr.x] +
           [lw.ix.nodes[nm].outputs[0].name for nm in pr.epi],
           note="split-TF32 products, about fp32's accuracy" if spec.split else "")


def out_order(pr: NarrowConvProto, order_of) -> tuple[int, ...] | None:
    """Channels-last data stays channels-last (see :func:`lower`)."""
    order = order_of(pr.x)
    return order if order == L.channels_last_order(4) else None


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: NarrowConvSpec, ceil) -> tuple[float, float, float]:
    k = math.prod(spec.w.shape[1:])
    flops = math.prod(spec.out.shape) * (2 * k + len(spec.epilogue) + int(spec.bias is not None))
    nbytes = view_bytes(spec.x) + view_bytes(spec.w) + view_bytes(spec.bias) + view_bytes(spec.out)
    peak = ceil.gemm_peak("tf32")
    return float(flops), float(nbytes), peak / 3 if spec.split else peak


def interpret(mem, s: NarrowConvSpec) -> None:
    """PyTorch's convolution in float64 (TF32's rounding is the kernel's business, as cuDNN's)."""
    b = mem.read(s.bias) if s.bias is not None else None
    y = conv2d_reference(mem.read(s.x), mem.read(s.w), b, s.out.shape, s.stride, s.padding, s.dilation)
    mem.write(s.out, mem.hook(s.epilogue, y))


def render(t, s: NarrowConvSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre: list[str] = []
    act = ""
    if s.epilogue:
        pre = cxx.hook(f"{fn}_epi", s.epilogue)
        act = f", {fn}_epi{{}}"
    x, o = s.x, s.out
    cout = s.w.shape[0]
    nt = 1 if cout <= 16 else 2 if cout <= 32 else 4  # 8-channel tiles a warp (narrow_conv.cuh)
    body = ["  stitch::NarrowConvParams p{};",
            f"  p.x = {n('x')}; p.w = {n('w')}; p.bias = {n.opt('bias')}; p.out = {n('out')};",
            f"  p.batch = {x.shape[0]}; p.in_channels = {x.shape[1]}; p.h = {x.shape[2]}; p.w_in = {x.shape[3]}; "
            f"p.out_channels = {cout}; p.oh = {o.shape[2]}; p.ow = {o.shape[3]};",
            "  " + " ".join(f"p.x_stride[{j}] = {v};" for j, v in enumerate(x.strides)),
            "  " + " ".join(f"p.out_stride[{j}] = {v};" for j, v in enumerate(o.strides)),
            f"  p.kh = {s.w.shape[2]}; p.kw = {s.w.shape[3]}; p.stride_h = {s.stride[0]}; p.stride_w = {s.stride[1]}; "
            f"p.pad_h = {s.padding[0]}; p.pad_w = {s.padding[1]}; p.dil_h = {s.dilation[0]}; p.dil_w = {s.dilation[1]};"]
    return cxx.include(HEADER) + pre, body + cxx.call(
        t.name, f"stitch::launch_narrow_conv<{cxx.cbool(s.split)}, {nt}>(p, stream{act})")


KIND = TaskKind("narrow_conv", NarrowConvSpec, "conv_template", cost, interpret, render,
                lowers=((NarrowConvProto, lower),), claims=(ClaimRule("fuse", 97, claim),), scratch=frozenset(),
                out_order=out_order)

__all__ = ["NarrowConvSpec", "NarrowConvProto", "narrow", "NARROW_K", "NARROW_CHANNELS", "KIND"]
