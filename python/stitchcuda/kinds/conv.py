"""Convolutions through cuDNN (the runtime's ``st_conv``): 1- to 3-d, grouped, dilated, transposed.

Claim: every free convolution, in graph order, before the reductions and GEMMs (so that a
reduction's prologue hook does not take its activation first), with the activation right after it
(ReLU, GELU, sigmoid, tanh, or SiLU written as ``x * sigmoid(x)``) for cuDNN's fused epilogue.

Layout: a 2-d or 3-d convolution under a policy with tensor cores (tf32, bf16, fp16) runs
channels-last (NHWC / NDHWC): cuDNN's tensor-core engines are channels-last kernels, and for
channels-first data its heuristics offer SIMT engines or pay a conversion inside the call (on an
H100 at tf32, 2.5x to 8x slower: BENCHMARKS.md, "Convolution engines"). The data is converted
where a channels-last region starts (a copy of the input, the weights once at create) and where it
ends (the layout a consumer needs, usually fused into the elementwise pass after it); in between,
elementwise groups, batch-norm statistics, pooling and joins keep the layout (see *place*, which
asks the producer of a channels-last convolution's input to write it so). Under fp32 the
channels-first SIMT engines are the fast ones and the layout stays. So does it for a convolution
that is a program of its own, widening (:func:`widening_alone`: its input the program's, its result
returned and read by nothing, and at least ``WIDENING`` times the input's bytes): channels-last, its
result would be written twice (the convolution's, then the copy back), while cuDNN's channels-first
engines convert only the input, inside the call (into a workspace the runtime now allows), and write
the result once. Under fp32 storage only: under bf16 or fp16 the result is cast to the caller's type
by a pass in any case, which changes the layout in the same write. Not a transposed one: cuDNN's
channels-first engines for it convert the result inside the call too (43 % of PyTorch's time for a
64 -> 64 one). On an H200 at tf32, whole programs (BENCHMARKS.md, "Layout by measurement"):
16x16x1024^2 -> 128 channels (32x the input's bytes) 6.40 ms channels-first against 10.04, a 3-d
3 -> 64 channels (19.5x) 1.42 against 1.74; an 11x11 stride-4 stem (1.9x) 2.51 against 1.70, a
transposed 64 -> 64 (1.0x) 2.17 against 2.12. A ``strategy`` constraint (``channels_first`` /
``channels_last``) overrides the choice. A 1x1 convolution without bias or
activation is not one here where its layout is channels-first anyway (under fp32; under tensor cores
where no other convolution reaches it): it is rewritten to a batched GEMM on its own layout
(``pointwise_conv_as_gemm``, plan/rewrite.py).

Precision repair: a convolution the loop's repair raised to fp32 inside a TF32 program asks for
the split-TF32 convolution (``st_conv_split_tf32``: one TF32 convolution over the split operands,
three times the input channels, on tensor cores; on an H200 its error is 7-13x fp32's and 10-40x
below TF32's; the runtime times it against the fp32 convolution per shape and keeps it only where
it is 10 % faster), channels-last like the TF32 convolutions around it. It ran channels-first on
cuDNN's SIMT engines, with layout copies around it. A raised 1x1 one (:func:`pointwise_gemm`) is
timed against the fp32 GEMM it is on that layout too: cuDNN's fp32 engines for channels-last data
convert the layouts inside the call (mobilenet_v1 on an H200: 1.321 -> 1.115 ms with the GEMM).

Precision where it costs nothing: under a policy that rounds to TF32, a convolution whose sums are
shorter than one tensor-core K tile (``SHORT_SUM``: in_channels / groups x the filter's taps) computes
at fp32, as a raised one does, where its filter has several taps or its output is small
(:func:`short_sums`). Tensor cores save nothing there: such a convolution is bound by its
bytes, and cuDNN's own heuristics run it on fp32 SIMT engines for channels-first data (PyTorch at
tf32 on an H100: efficientnet_b0's RGB stem, K = 27, and its squeeze-excitation expansions, K = 6, 8,
10; `benchmarks/tf32_rounding.py`). A stem's rounding is also the one a deep net amplifies most (the
plan interpreter's TF32 model of efficientnet_b0 and mobilenet_v1: the stem alone the most sensitive
task). MobileNet's stem, channels-last on an H200: fp32 0.124 ms, TF32 0.197 ms.

Lowering: the dense operands st_conv takes, all in one layout and one storage type (the policy's)
(strategy ``cudnn_conv``: the runtime's cuDNN plan, cached by shape, on the runtime's per-stream
workspace): an operand in another layout or dtype is copied (cast) first — a weight once, at create
— and an output whose placement target is not dense in that layout (a slot of a concatenation, a
tensor kept in float32 under a 16-bit policy) is written to a fresh buffer and copied back.
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
from ..precision import get as get_policy
from .base import FLOAT_DTYPES, ClaimRule, Proto, TaskKind, int_list, view_bytes

A = ops.A

#: Sums shorter than this (in_channels / groups x the filter's taps) compute at fp32 under TF32
#: (module docstring): one tensor-core K tile, below which the tensor cores save nothing.
SHORT_SUM = 32
#: ... where the filter has several taps, or the output is at most this many elements (launch-bound).
SMALL_OUTPUT = 1 << 16
#: A convolution alone in its program stays channels-first where its result is at least this many times
#: its input's bytes (:func:`widening_alone`; measured: 19.5x and 32x ran faster so, 1.0x and 1.9x slower).
WIDENING = 4


@dataclass(frozen=True)
class ConvSpec:
    """``out = activation(conv(x, w) + bias)`` through st_conv (cuDNN): PyTorch's convolution
    over ``len(in_size)`` spatial dims, or its transposed form. x is [batch, in_channels,
    *in_size], w [out_channels, in_channels / groups, *kernel] ([in_channels, out_channels /
    groups, *kernel] when ``transposed``), out [batch, out_channels, *out_size]: all dense
    channels-first, in the storage type of ``policy`` (bias too: one value per output channel).
    ``activation``: ``none``, ``relu``, ``relu6``, ``gelu`` (erf), ``gelu_tanh``, ``silu``, ``sigmoid``,
    ``tanh``. The workspace is the runtime's (per stream), the plan cached by shape.
    ``split_tf32``: an fp32 convolution of a TF32 program (the loop's precision repair raised it)
    through st_conv_split_tf32: one TF32 convolution over split operands, or the fp32 one where the
    runtime timed that faster."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "conv")

    kind: str
    policy: str
    x: View
    w: View
    out: View
    batch: int
    in_channels: int
    out_channels: int
    groups: int
    in_size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    output_padding: tuple[int, ...]
    transposed: bool = False
    bias: View | None = None
    activation: str = "none"
    channels_last: bool = False
    split_tf32: bool = False

    @property
    def out_size(self) -> tuple[int, ...]:
        return tuple(self.out.shape[2:])


@dataclass(frozen=True)
class ConvArgsProto(Proto):
    """What a convolution reads and writes: ``out`` from input ``x``, filters ``w`` and ``bias`` (or
    None), with ``stride``, ``padding`` and ``dilation`` per spatial dim."""

    x: str = ""
    w: str = ""
    bias: str | None = None
    out: str = ""
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()


@dataclass(frozen=True)
class ConvProto(ConvArgsProto):
    """``out = activation(conv(x, w) + bias)``: PyTorch's convolution (``transposed``: its
    transposed form) over the last ``len(stride)`` dims, with cuDNN's fused activation
    (``none``, ``relu``, ``relu6``, ``gelu``, ``gelu_tanh``, ``silu``, ``sigmoid``, ``tanh``) taking the
    elementwise node(s) after it."""

    output_padding: tuple[int, ...] = ()
    transposed: bool = False
    groups: int = 1
    activation: str = "none"
    policy: str = ""
    channels_last: bool = False


# ---------------------------------------------------------------------- claim


#: Elementwise ops cuDNN's convolution epilogue computes (st_activation), by ATen overload.
_CONV_ACT = {A + "relu.default": "relu", A + "sigmoid.default": "sigmoid", A + "tanh.default": "tanh",
             A + "silu.default": "silu"}


def claim(cx) -> None:
    """Claim every free convolution, in graph order, with the activation after it."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "conv" and cx.free(n):
            _conv(cx, n)


def _conv(cx, n: Node) -> None:
    ix = cx.ix
    a = ix.args(n, ops.args(n.op))
    x, w = a["input"][1], a["weight"][1]
    bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
    nsp = len(ix.shape(w)) - 2
    if not 1 <= nsp <= 3:
        raise cx.fail(n, f"a convolution over {nsp} spatial dims (cuDNN: 1 to 3)")
    if len(ix.shape(x)) != nsp + 2:
        raise cx.fail(n, f"a {nsp}-d convolution of a {len(ix.shape(x))}-d input (batch and channels expected)")
    for t in (x, w) + ((bias,) if bias else ()):
        if ix.spec(t).dtype not in FLOAT_DTYPES:
            raise cx.fail(n, f"a convolution over {ix.spec(t).dtype}")
    out = n.outputs[0].name
    nodes = [n.name]
    act, last = _conv_activation(cx, n, out)
    if act != "none":
        nodes += [m for m in last]
        out = ix.nodes[last[-1]].outputs[0].name
    transposed = bool(n.attr("transposed"))
    policy = cx.policy_of(nodes)
    groups = int(n.attr("groups") or 1)
    if not transposed and get_policy(policy).tf32 and short_sums(ix.shape(x)[1] // groups, ix.shape(w)[2:],
                                                                  math.prod(n.outputs[0].shape)):
        policy = "fp32"
    choice = cx.constraints.option(n.name, "auto")
    tensor_cores = get_policy(policy).tensor_cores or split_tf32(policy, cx.policy)
    # ("narrow": the narrow kernel's, where its kind could not take the node after all: as auto)
    # (fp32 storage only: under a 16-bit policy the result is cast to the caller's type by a pass anyway,
    # which changes its layout in the same write)
    alone = not transposed and get_policy(policy).storage == "float32" and widening_alone(ix, x, out)
    channels_last = choice == "channels_last" or (choice in ("auto", "narrow") and nsp >= 2 and tensor_cores and
                                                  not alone)
    cx.claim(ConvProto(cx.name(nodes), tuple(nodes), (out,), tuple(t for t in (x, w, bias) if t), x=x, w=w,
                       bias=bias, out=out, stride=int_list(n.attr("stride"), nsp, 1),
                       padding=int_list(n.attr("padding"), nsp, 0), dilation=int_list(n.attr("dilation"), nsp, 1),
                       output_padding=int_list(n.attr("output_padding"), nsp, 0) if transposed else (0,) * nsp,
                       transposed=transposed, groups=groups, activation=act,
                       policy=policy, channels_last=channels_last))


def leaves_program(ix, out: str) -> bool:
    """Whether ``out`` (a convolution's result, after its epilogue) is returned and read by no node: it
    is written in the caller's layout, wherever it was computed (:func:`widening_alone`, and the narrow
    kernel's default, kinds/narrow_conv.py)."""
    return out in ix.graph_outputs and not ix.users.get(out)


def widening_alone(ix, x: str, out: str) -> bool:
    """Whether a convolution is a program of its own that widens its data (the module docstring): its
    input ``x`` the program's, its result ``out`` :func:`leaves_program`, and at least ``WIDENING``
    times the input's bytes."""
    return x in ix.inputs and leaves_program(ix, out) and ix.spec(out).nbytes >= WIDENING * ix.spec(x).nbytes


def short_sums(cin: int, taps: Sequence[int], out_elements: int) -> bool:
    """Whether a convolution computes at fp32 under TF32 (module docstring): sums shorter than
    ``SHORT_SUM`` over a filter of several taps (a stem over RGB), or over an output of at most
    ``SMALL_OUTPUT`` elements (a squeeze-excitation expansion); a 1x1 one over a large map stays on
    TF32, where cuDNN's channels-last fp32 engines are the slower (BENCHMARKS.md, "The split-TF32
    convolution": 0.260 ms against 0.122 at K = 32)."""
    return cin * math.prod(taps) < SHORT_SUM and (math.prod(taps) > 1 or out_elements <= SMALL_OUTPUT)


def _conv_activation(cx, n: Node, out: str) -> tuple[str, list[str]]:
    """The activation cuDNN can fuse after convolution ``n`` and the nodes that compute it:
    the one user of ``out`` when it is an activation of float32 data, or ``x * sigmoid(x)``."""
    ix = cx.ix
    if n.name in cx.unfuse or ix.spec(out).dtype != "float32" or out in ix.graph_outputs:
        return "none", []

    def ok(u: Node | None) -> bool:
        return u is not None and cx.free(u) and u.name not in cx.unfuse and len(u.outputs) == 1 and \
            u.outputs[0].dtype == "float32" and u.outputs[0].shape == ix.shape(out)

    u = ix.only_user(out)
    if ok(u) and u.inputs == (out,):
        if u.op in _CONV_ACT:
            return _CONV_ACT[u.op], [u.name]
        lo, hi = u.attr("min_val"), u.attr("max_val")
        if u.op == A + "hardtanh.default" and (lo, hi) == (0.0, 6.0):  # ReLU6 (MobileNets): a clipped ReLU
            return "relu6", [u.name]
        if u.op == A + "gelu.default":
            return ("gelu" if (u.attr("approximate") or "none") == "none" else "gelu_tanh"), [u.name]
    users = ix.users.get(out, [])
    if len(users) == 2:  # x * sigmoid(x), in either order
        sig = next((m for m in users if m.op == A + "sigmoid.default"), None)
        mul = next((m for m in users if m.op == A + "mul.Tensor"), None)
        if sig is not None and mul is not None and ok(sig) and ok(mul) and sig.inputs == (out,) and \
                sorted(mul.inputs) == sorted((out, sig.outputs[0].name)) and \
                ix.only_user(sig.outputs[0].name) is mul:
            return "silu", [sig.name, mul.name]
    return "none", []


# ---------------------------------------------------------------------- recurrent layers


# ---------------------------------------------------------------------- lower


def split_tf32(policy: str, program_policy: str) -> bool:
    """Whether a convolution at ``policy`` in a program at ``program_policy`` is the split-TF32
    one: raised to fp32 by the precision repair inside a TF32 program."""
    return policy == "fp32" and get_policy(program_policy).tf32


def pointwise_gemm(spec: ConvSpec) -> bool:
    """Whether the runtime may run this raised convolution as the fp32 GEMM it is on its layout
    (st_conv_split_tf32 times that one too): channels-last, 1x1, stride 1, no padding, one group."""
    return spec.split_tf32 and spec.channels_last and not spec.transposed and spec.groups == 1 and \
        all(v == 1 for v in spec.kernel + spec.stride + spec.dilation) and not any(spec.padding)


def layout_order(pr: ConvProto, ndim: int) -> tuple[int, ...] | None:
    """The dim order a convolution's operands are dense in: channels-last, or None (contiguous)."""
    return L.channels_last_order(ndim) if pr.channels_last else None


def lower(lw, pr: ConvProto, pre: list) -> None:
    policy = pr.policy or lw.f.policy
    st = get_policy(policy).storage
    order = layout_order(pr, len(pr.stride) + 2)

    def dense(v: View) -> bool:
        return v.dtype == st and L.is_dense_in(v, order)

    def operand(t: str, why: str) -> View:
        v = lw.read(t, pre, pr.phase)
        if dense(v):
            return v
        # A weight (or what is made of weights at create) is laid out once, when the program is created.
        phase = "create" if lw.buffers[v.buffer].kind in ("weight", "const") else pr.phase
        return lw.views[lw.copy_contiguous(t, v, pre, phase, why=why, dtype=st, order=order, shared=True)]

    layout = "channels-last" if order else "channels-first"
    vx = operand(pr.x, f"cuDNN reads the convolution's input dense, {layout}")
    vw = operand(pr.w, f"cuDNN reads the convolution's weight dense, {layout}")
    vb = None
    if pr.bias:
        vb = lw.read(pr.bias, pre, pr.phase)
        if not (vb.dtype == st and vb.is_contiguous()):
            phase = "create" if lw.buffers[vb.buffer].kind in ("weight", "const") else pr.phase
            vb = lw.views[lw.copy_contiguous(pr.bias, vb, pre, phase, why="cuDNN reads the bias as one contiguous "
                                             "vector", dtype=st)]
        if vb.ndim != 1:
            vb = L.reshape(vb, (vb.numel,))
    vo = lw.out_view(pr, pr.out, dense, order=order)
    post = None
    if not dense(vo):
        written = lw.fresh_rows(f"{pr.out}_conv", st, vo.shape, pr.phase, order)
        post = (written, vo)
        vo = written
    nsp = len(pr.stride)
    xs, ws = vx.shape, vw.shape
    out_channels = ws[1] * pr.groups if pr.transposed else ws[0]
    spec = ConvSpec("conv", policy, vx, vw, vo, batch=xs[0], in_channels=xs[1], out_channels=out_channels,
                    groups=pr.groups, in_size=tuple(xs[2:]), kernel=tuple(ws[2:]), stride=tuple(pr.stride),
                    padding=tuple(pr.padding), dilation=tuple(pr.dilation), output_padding=tuple(pr.output_padding),
                    transposed=pr.transposed, bias=vb, activation=pr.activation, channels_last=pr.channels_last,
                    split_tf32=split_tf32(policy, lw.f.policy) and st == "float32")
    assert len(spec.in_size) == nsp and vo.shape[:2] == (xs[0], out_channels), (vo.shape, xs, ws)
    lw.add(pr, pr.name, spec, [vx, vw, vb], [vo], touched=list(pr.ins) + [pr.out],
           note=("the fp32 GEMM it is on this layout, the fp32 convolution or one TF32 convolution over split "
                 "operands, whichever the runtime times faster (the split one by 10 %)" if pointwise_gemm(spec) else
                 "one TF32 convolution over split operands, or fp32 where faster") if spec.split_tf32 else "")
    if post is not None:
        lw.append(lw.copy_task(f"{pr.name}_out", list(pr.nodes), post[0], post[1], pr.phase,
                               note="writes the convolution's result back in the reference's layout"))


# ---------------------------------------------------------------------- cost, interpret, render


def conv_flops(batch: int, in_channels: int, out_channels: int, groups: int, kernel, positions) -> int:
    """Multiply-adds x 2 of a convolution: every output channel of every position (the input's
    positions for a transposed one, which scatters each input element) reads in_channels /
    groups x kernel values."""
    return 2 * batch * out_channels * (in_channels // max(groups, 1)) * math.prod(kernel) * math.prod(positions)


def cost(spec: ConvSpec, ceil) -> tuple[float, float, float]:
    flops = conv_flops(spec.batch, spec.in_channels, spec.out_channels, spec.groups, spec.kernel,
                       spec.in_size if spec.transposed else spec.out_size)
    flops += math.prod(spec.out.shape) * (int(spec.bias is not None) + int(spec.activation != "none"))
    # The split one reads x and w, writes them three times as wide and convolves those; a raised 1x1
    # one may run as the fp32 GEMM instead (:func:`pointwise_gemm`), which reads each once: the floor
    # is the fewer bytes.
    wide = 7 if spec.split_tf32 and not pointwise_gemm(spec) else 1
    nbytes = wide * (view_bytes(spec.x) + view_bytes(spec.w)) + view_bytes(spec.bias) + view_bytes(spec.out)
    return float(flops), nbytes, ceil.gemm_peak("tf32") / 3 if spec.split_tf32 else ceil.gemm_peak(spec.policy)


def interpret(mem, c: ConvSpec) -> None:
    """PyTorch's convolution in float64 (stitchrt.h: st_conv)."""
    import torch

    F = torch.nn.functional
    act = {"none": lambda x: x, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "silu": F.silu,
           "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"), "relu6": lambda x: F.hardtanh(x, 0, 6)}
    sp = len(c.in_size)
    order = L.channels_last_order(sp + 2) if c.channels_last else None
    assert all(L.is_dense_in(v, order) for v in (c.x, c.w, c.out)), "st_conv takes dense operands, one layout"
    assert c.x.dtype == c.w.dtype == c.out.dtype, "st_conv: one storage type"
    x, w = mem.read(c.x), mem.read(c.w)
    b = mem.read(c.bias) if c.bias is not None else None
    if c.transposed:
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[sp - 1]
        y = fn(x, w, b, stride=c.stride, padding=c.padding, output_padding=c.output_padding, groups=c.groups,
               dilation=c.dilation)
    else:
        fn = (F.conv1d, F.conv2d, F.conv3d)[sp - 1]
        y = fn(x, w, b, stride=c.stride, padding=c.padding, dilation=c.dilation, groups=c.groups)
    assert tuple(y.shape) == c.out.shape, (tuple(y.shape), c.out.shape)
    mem.write(c.out, act[c.activation](y))


_ACTIVATION = {"none": "ST_ACT_NONE", "relu": "ST_ACT_RELU", "gelu": "ST_ACT_GELU_ERF", "gelu_tanh": "ST_ACT_GELU_TANH",
               "silu": "ST_ACT_SILU", "sigmoid": "ST_ACT_SIGMOID", "tanh": "ST_ACT_TANH", "relu6": "ST_ACT_RELU6"}


def render(t, c: ConvSpec, n, fn: str) -> tuple[list[str], list[str]]:
    """st_conv: cuDNN's plan for this shape (built and timed on the first run, cached by the
    runtime's context), the activation fused where an engine takes it."""
    sp = len(c.in_size)

    def arr(field: str, vals: Sequence[int]) -> str:
        return " ".join(f"a.{field}[{j}] = {v};" for j, v in enumerate(vals))

    lines = ["  st_conv_args a{};",
                 f"  a.policy = {get_policy(c.policy).c_enum}; a.spatial_dims = {sp}; a.transposed = {int(c.transposed)}; "
             f"a.channels_last = {int(c.channels_last)};",
             f"  a.batch = {c.batch}; a.in_channels = {c.in_channels}; a.out_channels = {c.out_channels}; "
             f"a.groups = {c.groups};",
             "  " + arr("in_size", c.in_size), "  " + arr("kernel_size", c.kernel), "  " + arr("stride", c.stride),
             "  " + arr("padding", c.padding), "  " + arr("dilation", c.dilation),
             "  " + arr("output_padding", c.output_padding),
             f"  a.x = {n('x')}; a.x_dtype = {st_enum(c.x.dtype)};",
             f"  a.w = {n('w')}; a.w_dtype = {st_enum(c.w.dtype)};"]
    if c.bias is not None:
        lines.append(f"  a.bias = {n('bias')}; a.bias_dtype = {st_enum(c.bias.dtype)};")
    else:
        lines.append(f"  a.bias = nullptr; a.bias_dtype = {st_enum(c.out.dtype)};")
    lines += [f"  a.y = {n('out')}; a.y_dtype = {st_enum(c.out.dtype)};",
              f"  a.activation = {_ACTIVATION[c.activation]};",
              f"  return {'st_conv_split_tf32' if c.split_tf32 else 'st_conv'}(&a, stream);"]
    return [], lines


def layouts(pr: ConvProto) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """A channels-last convolution asks for its input channels-last (its producer writes it so)."""
    order = layout_order(pr, len(pr.stride) + 2)
    return ((pr.x, order),) if order and pr.phase == "run" else ()


KIND = TaskKind("conv", ConvSpec, "cudnn_conv", cost, interpret, render, lowers=((ConvProto, lower),),
                claims=(ClaimRule("fuse", 100, claim),), scratch=frozenset(), layouts=layouts,
                out_order=lambda pr, order_of: layout_order(pr, len(pr.stride) + 2))

__all__ = ["ConvSpec", "ConvArgsProto", "ConvProto", "conv_flops", "layout_order", "pointwise_gemm", "short_sums",
           "split_tf32", "KIND"]
