"""Pooling through pool.cuh: max / average, adaptive or not, over 1 to 3 spatial dims, in either
layout.

Claim: every free pooling node, taking the unary elementwise ops before and after it as prologue /
epilogue hooks (as row reductions do). The indices of max pooling are refused. Lowering: a
channels-last input (a channels-last convolution's result) is pooled as it lies, channels varying
fastest between threads, into a channels-last result (``channels_last``: x and out as
[batch, channels, d, h, w] views); otherwise x and out are [planes, d, h, w] views (the leading
dims collapsed into planes, else copied first).
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

from .. import layout as L
from .. import ops
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .base import (FLOAT_DTYPES, ClaimRule, Proto, TaskKind, copy_back, hooked_touched, int_list, readable, view_bytes,
                   writable)

A = ops.A


HEADER = "pool.cuh"


@dataclass(frozen=True)
class PoolSpec:
    """pool.cuh: max / average pooling over up to three spatial dims. ``x`` is [planes, d, h, w]
    and ``out`` [planes, od, oh, ow] (views; a missing spatial dim has size 1). Per spatial dim:
    ``kernel``, ``stride``, ``padding``, ``dilation``; ``adaptive``: window i of an output of n
    over an input of m is [floor(i m / n), ceil((i + 1) m / n)). ``mode`` ``max`` (padding never
    wins; NaN propagates) or ``avg`` (``count_include_pad``: divide by the window clipped to the
    padded input, else by its valid elements; ``divisor`` > 0 overrides both). Hooks as RowSpec.
    ``channels_last``: x and out are [batch, channels, d, h, w] instead (any strides; the kernel
    walks channels fastest, for channels-last data)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "pool")

    kind: str
    mode: str
    x: View
    out: View
    kernel: tuple[int, int, int]
    stride: tuple[int, int, int]
    padding: tuple[int, int, int]
    dilation: tuple[int, int, int]
    adaptive: bool = False
    count_include_pad: bool = True
    divisor: int = 0
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()
    channels_last: bool = False


@dataclass(frozen=True)
class PoolProto(Proto):
    """Pooling over the last ``len(kernel)`` dims of x (``adaptive``: kernel holds the output
    size), with unary prologue / epilogue hooks (node names)."""

    op: str = "max"
    x: str = ""
    out: str = ""
    kernel: tuple[int, ...] = ()
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    adaptive: bool = False
    count_include_pad: bool = True
    divisor: int = 0
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    """Claim every free pool node, in graph order."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "pool" and cx.free(n):
            _pool(cx, n)


def _pool(cx, n: Node) -> None:
    ix = cx.ix
    x = n.inputs[0]
    xs = ix.shape(x)
    name = n.op.removeprefix(A).split(".")[0]
    for extra in n.outputs[1:]:
        if cx.used(extra.name):
            raise cx.fail(n, "the indices of max pooling are used; only its values are supported")
    if ix.spec(x).dtype not in FLOAT_DTYPES:
        raise cx.fail(n, f"pooling over {ix.spec(x).dtype}")
    adaptive = "adaptive" in name
    mode = "max" if "max" in name else "avg"
    nsp = int(name[name.index("pool") + 4])
    if len(xs) < nsp + 1:
        raise cx.fail(n, f"{nsp}-d pooling of a {len(xs)}-d tensor")
    count_include_pad, divisor = True, 0
    if adaptive:
        kernel = int_list(n.attr("output_size"), nsp, 1)
        stride, padding, dilation = (1,) * nsp, (0,) * nsp, (1,) * nsp
    else:
        kernel = int_list(n.attr("kernel_size"), nsp, 1)
        stride = int_list(n.attr("stride"), nsp, 0)
        stride = kernel if not any(stride) else stride
        padding = int_list(n.attr("padding"), nsp, 0)
        dilation = int_list(n.attr("dilation"), nsp, 1)
        if mode == "avg":
            count_include_pad = bool(n.attr("count_include_pad", True))
            divisor = int(n.attr("divisor_override") or 0)
    out = n.outputs[0].name
    pro, x, epi, out = cx.hooks(n, x, out)
    nodes = pro + [n.name] + epi
    cx.claim(PoolProto(cx.name(nodes), tuple(nodes), (out,), (x,), op=mode, x=x, out=out, kernel=kernel,
                       stride=stride, padding=padding, dilation=dilation, adaptive=adaptive,
                       count_include_pad=count_include_pad, divisor=divisor, pro=tuple(pro), epi=tuple(epi)))


# ---------------------------------------------------------------------- lower


def lower(lw, pr: PoolProto, pre: list) -> None:
    nsp = len(pr.kernel)
    pro, epi = lw.hook(pr.pro), lw.hook(pr.epi)
    vx = lw.read(pr.x, pre, pr.phase)
    lead = vx.ndim - nsp

    def three(xs: Sequence[int], fill: int) -> tuple[int, int, int]:
        return tuple([fill] * (3 - nsp) + list(xs))

    window = (three(pr.kernel, 1), three(pr.stride, 1), three(pr.padding, 0), three(pr.dilation, 1))
    touched = hooked_touched(lw, pr)
    target = lw.target.get(pr.out)
    if lead == 2 and not L.is_channels_last(vx) and vx.dtype in FLOAT_DTYPES and \
            (target is None or L.is_channels_last(target)):
        # A channels-last copy of x made for a convolution that reads it too (an inception
        # block's pool branch beside its convolutions): pool that one, and write channels-last
        # (unless the result is wanted channels-first: a copy back would cost what was saved).
        vx = lw.shared_copy(pr.x, vx, vx.dtype, L.channels_last_order(vx.ndim), pr.phase) or vx
    if lead == 2 and L.is_channels_last(vx) and vx.dtype in FLOAT_DTYPES:
        order = L.channels_last_order(vx.ndim)  # (another layout's target: a tiled copy converts)
        vo = lw.out_view(pr, pr.out, lambda tv: L.is_dense_in(tv, order), order=order)

        def as5(v: View) -> View:  # [batch, channels, d, h, w]: missing spatial dims of size 1
            pad = 3 - nsp
            return View(v.buffer, v.offset, v.shape[:2] + (1,) * pad + v.shape[2:],
                        v.strides[:2] + (0,) * pad + v.strides[2:], v.dtype)

        spec = PoolSpec("pool", pr.op, as5(vx), as5(vo), *window, pr.adaptive, pr.count_include_pad, pr.divisor,
                        pro, epi, channels_last=True)
        lw.add(pr, pr.name, spec, [spec.x], [spec.out], touched=touched)
        return
    cuts = [lead] + list(range(lead + 1, vx.ndim))
    vx = readable(lw, pr.x, vx, pre, pr.phase, cuts, "pooling reads planes that collapse")
    vo, post = writable(lw, pr, pr.out, cuts)

    def as4(v: View) -> View:
        g = L.collapse(v.shape[:lead], v.strides[:lead])
        planes, sp = (g[0], g[1]) if g[0] > 1 else (g[0], 0)
        pad = 3 - nsp
        return View(v.buffer, v.offset, (planes,) + (1,) * pad + v.shape[lead:], (sp,) + (0,) * pad + v.strides[lead:],
                    v.dtype)

    spec = PoolSpec("pool", pr.op, as4(vx), as4(vo), *window, pr.adaptive, pr.count_include_pad, pr.divisor, pro, epi)
    lw.add(pr, pr.name, spec, [spec.x], [spec.out], touched=touched)
    copy_back(lw, pr, post)


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: PoolSpec, ceil) -> tuple[float, float, float]:
    sp = 2 if spec.channels_last else 1  # the first spatial dim of the views
    window = math.prod(spec.kernel) if not spec.adaptive else max(1, math.ceil(
        math.prod(spec.x.shape[sp:]) / max(1, math.prod(spec.out.shape[sp:]))))
    n = math.prod(spec.out.shape)
    return float(n * (window + len(spec.prologue) * window + len(spec.epilogue))), \
        float(view_bytes(spec.x) + view_bytes(spec.out)), ceil.fp32


def interpret(mem, p: PoolSpec) -> None:
    sp = 2 if p.channels_last else 1
    assert all(n >= 1 for n in p.x.shape[sp:]), "pool.cuh: launch_pool refuses an input extent < 1"
    assert p.adaptive or all(min(k, s, d) >= 1 for k, s, d in zip(p.kernel, p.stride, p.dilation)), \
        "pool.cuh: launch_pool refuses a kernel, stride or dilation < 1"
    x = mem.hook(p.prologue, mem.read(p.x))  # [planes, d, h, w], or [batch, channels, d, h, w]
    if p.channels_last:
        out = _pool_planes(mem, p, x.reshape((-1,) + tuple(x.shape[2:])), p.out.shape[2:])
        out = out.reshape(p.out.shape)
    else:
        out = _pool_planes(mem, p, x, p.out.shape[1:])
    mem.write(p.out, mem.hook(p.epilogue, out))


def _pool_planes(mem, p: PoolSpec, x, osh: Sequence[int]):
    """Pooled values of x [planes, d, h, w] (float64) into [planes, *osh]."""
    import torch

    ish = x.shape[1:]
    out = torch.empty((x.shape[0],) + tuple(osh), dtype=torch.float64, device=mem.device)
    for idx in itertools.product(*[range(d) for d in osh]):
        sl, count, padded = [], 1, 1
        for j, i in enumerate(idx):
            if p.adaptive:
                lo, hi = (i * ish[j]) // osh[j], -(-((i + 1) * ish[j]) // osh[j])
                sl.append(slice(lo, hi))
                count *= hi - lo
                padded *= hi - lo
                continue
            k, st, pad, dil = p.kernel[j], p.stride[j], p.padding[j], p.dilation[j]
            start = i * st - pad
            taps = [start + t * dil for t in range(k)]
            valid = [t for t in taps if 0 <= t < ish[j]]
            sl.append(valid)
            count *= len(valid)
            padded *= min(start + (k - 1) * dil + 1, ish[j] + pad) - start  # avg: window clipped to padding
        win = x
        for j, s_ in enumerate(sl):
            win = win[(slice(None),) * (j + 1) + (s_ if isinstance(s_, slice) else torch.tensor(s_, dtype=torch.long),)]
        win = win.reshape(x.shape[0], -1)
        if p.mode == "max":
            v = win.amax(1) if win.shape[1] else torch.full((x.shape[0],), -math.inf, dtype=torch.float64)
            v = torch.where(torch.isnan(win).any(1), torch.full_like(v, math.nan), v)
        else:
            div = p.divisor or (padded if p.count_include_pad and not p.adaptive else count)
            v = win.sum(1) / div
        out[(slice(None),) + tuple(idx)] = v
    return out


def render(t, p: PoolSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre, hk = cxx.hooks(fn, p.prologue, p.epilogue) if (p.prologue or p.epilogue) else ([], "")
    mode = {"max": "Max", "avg": "Avg"}[p.mode]
    sp = 2 if p.channels_last else 1
    params, launch = ("PoolClParams", "launch_pool_channels_last") if p.channels_last else ("PoolParams", "launch_pool")
    head = f"p.batch = {p.x.shape[0]}; p.channels = {p.x.shape[1]};" if p.channels_last else f"p.planes = {p.x.shape[0]};"
    body = [f"  stitch::{params}<{ctype(p.x.dtype)}, {ctype(p.out.dtype)}> p{{}};",
            f"  p.in = {n('x')}; {head}",
            "  " + " ".join(f"p.in_size[{j}] = {d};" for j, d in enumerate(p.x.shape[sp:])),
            "  " + " ".join(f"p.in_stride[{j}] = {s_};" for j, s_ in enumerate(p.x.strides)),
            f"  p.out = {n('out')};",
            "  " + " ".join(f"p.out_size[{j}] = {d};" for j, d in enumerate(p.out.shape[sp:])),
            "  " + " ".join(f"p.out_stride[{j}] = {s_};" for j, s_ in enumerate(p.out.strides))]
    for field, vals in (("kernel", p.kernel), ("stride", p.stride), ("pad", p.padding), ("dilation", p.dilation)):
        body.append("  " + " ".join(f"p.{field}[{j}] = {v};" for j, v in enumerate(vals)))
    body.append(f"  p.adaptive = {cxx.cbool(p.adaptive)}; p.count_include_pad = {cxx.cbool(p.count_include_pad)}; "
                f"p.divisor = {p.divisor};")
    fixed = "" if p.channels_last else "".join(f", {v}" for v in fixed_window(p))
    return cxx.include(HEADER) + pre, body + cxx.call(t.name, f"stitch::{launch}<stitch::PoolMode::{mode}{fixed}>(p, stream{hk})")


#: The largest window side and stride compiled into the tiled pooling kernel.
FIXED_MAX_KERNEL, FIXED_MAX_STRIDE = 8, 4


def fixed_window(p: PoolSpec) -> tuple[int, ...]:
    """(rows, columns, row stride, column stride) of a 1-d / 2-d window of dilation 1 small enough
    to compile into launch_pool's tiled kernel (its tap loops unrolled), else ()."""
    if p.adaptive or p.kernel[0] != 1 or any(d != 1 for d in p.dilation) or \
            max(p.kernel[1:]) > FIXED_MAX_KERNEL or max(p.stride[1:]) > FIXED_MAX_STRIDE:
        return ()
    return (p.kernel[1], p.kernel[2], p.stride[1], p.stride[2])


def out_order(pr: PoolProto, order_of) -> tuple[int, ...] | None:
    """A pooling of channels-last data is channels-last (see :func:`lower`)."""
    order = order_of(pr.x)
    return order if order is not None and order == L.channels_last_order(len(order)) else None


KIND = TaskKind("pool", PoolSpec, "reduction_template", cost, interpret, render, lowers=((PoolProto, lower),),
                claims=(ClaimRule("fuse", 160, claim),), scratch=frozenset(), out_order=out_order)

__all__ = ["PoolSpec", "PoolProto", "KIND"]
