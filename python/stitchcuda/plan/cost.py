"""The cost model: FLOPs, fewest bytes and roofline time of tasks and of reference nodes.

Takes task specs (:mod:`.specs`) or graph nodes and the device's :class:`~stitchcuda.device.Ceilings`;
gives numbers. *match* asks it whether fused attention beats the unfused plan; *schedule* stamps
every task with FLOPs, bytes, estimated time and bound; the plan lists every reference node's
cost so the Verifier's profile can place the program against the reference.
"""

from __future__ import annotations

import math
from typing import Any

from .. import ops
from ..device import Ceilings
from ..ir import DTYPE_SIZES, Node
from ..layout import View
from ..precision import get as _policy
from .graph import GraphIndex
from .specs import (ArgSpec, AttentionMaskBlocksSpec, AttentionSpec, AxisSpec, BnStatsSpec, ConvSpec, CopySpec,
                    EwSpec, GatherSpec, GemmSpec, GroupStatsSpec, IotaSpec, NodeCost, PoolSpec, RecurrentSpec, RowSpec,
                    ScanSpec)

A = ops.A

#: Head dims the fused attention template is instantiated for (attention.cuh: AttnHeadDim).
ATTENTION_HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128)
#: Query rows x keys per byte of the mask summary (kAttnMaskBlockQ, kAttnMaskBlockK).
ATTENTION_MASK_CELL = (64, 32)
#: Throughput of the fused attention kernels as a fraction of the policy's dense peak, on H100
#: (benchmarks/templates.md): exact fp32 SIMT 26-31 of 67 TFLOP/s; mma.sync bf16 / fp16 170-225
#: of 790. TF32 (mma.sync m16n8k8, same structure and bytes per mma as the 16-bit kernel) is
#: not measured yet and taken at the 16-bit kernel's fraction.
ATTENTION_EFFICIENCY = {"fp32": 0.42, "tf32": 0.25, "bf16": 0.25, "fp16": 0.25}
#: cuBLAS GEMM as a fraction of the dense peak (SGEMM on H100: about 50 of 67 TFLOP/s): what the
#: unfused attention's two matrix products run at, in :func:`attention_time`.
GEMM_EFFICIENCY = 0.75


def _storage(policy: str) -> str:
    return _policy(policy).storage


def _view_bytes(v: View | None) -> int:
    return 0 if v is None else v.footprint * v.itemsize


def spec_cost(spec: Any, policy: str, ceil: Ceilings) -> tuple[float, float, float]:
    """(FLOPs, fewest bytes, peak FLOP/s) of one task."""
    if isinstance(spec, GemmSpec):
        flops = 2.0 * spec.m * spec.n * spec.k * spec.batch + spec.m * spec.n * spec.batch * (len(spec.chain) + 1)
        nbytes = sum(_view_bytes(v) for v in (spec.a, spec.b, spec.c, spec.bias, spec.residual)) + _view_bytes(spec.out)
        return flops, nbytes, ceil.gemm_peak(spec.policy)
    if isinstance(spec, ConvSpec):
        flops = conv_flops(spec.batch, spec.in_channels, spec.out_channels, spec.groups, spec.kernel,
                           spec.in_size if spec.transposed else spec.out_size)
        flops += math.prod(spec.out.shape) * (int(spec.bias is not None) + int(spec.activation != "none"))
        nbytes = sum(_view_bytes(v) for v in (spec.x, spec.w, spec.bias, spec.out))
        return float(flops), nbytes, ceil.gemm_peak(spec.policy)
    if isinstance(spec, RecurrentSpec):
        # h W_hhᵀ every step (the input projections are GEMM tasks of their own) plus the cell;
        # W_hh is read once per launch (the kernel keeps it on chip), the sequences once.
        gh = spec.directions * spec.steps * 2 * spec.batch * spec.hidden * spec.gx.shape[-1]
        flops = gh + spec.directions * spec.steps * spec.batch * spec.gx.shape[-1] * 4
        nbytes = sum(_view_bytes(v) for v in (spec.gx, spec.w_hh, spec.w_hh_r, spec.b_hh, spec.b_hh_r, spec.h0,
                                              spec.c0, spec.out, spec.hn, spec.cn))
        return float(flops), nbytes, ceil.fp32
    if isinstance(spec, EwSpec):
        n = math.prod(spec.out.shape)
        return float(n * len(spec.instrs)), sum(_view_bytes(v) for v in spec.inputs) + _view_bytes(spec.out), ceil.fp32
    if isinstance(spec, RowSpec):
        per = {"softmax": 5, "log_softmax": 5, "layer_norm": 8, "rms_norm": 4, "logsumexp": 4, "var": 4}.get(spec.op, 1)
        n = spec.rows * spec.cols
        flops = n * (per + len(spec.prologue)) + len(spec.epilogue) * (n if spec.op in ("softmax", "log_softmax", "layer_norm", "rms_norm") else spec.rows)
        return float(flops), _view_bytes(spec.x) + _view_bytes(spec.out) + _view_bytes(spec.weight) + _view_bytes(spec.bias), ceil.fp32
    if isinstance(spec, AxisSpec):
        n = spec.outer * spec.red * spec.inner
        flops = n * (1 + len(spec.prologue)) + spec.outer * spec.inner * len(spec.epilogue)
        return float(flops), _view_bytes(spec.x) + _view_bytes(spec.out), ceil.fp32
    if isinstance(spec, AttentionSpec):
        flops = 4.0 * spec.batch * spec.heads * spec.lq * spec.lk * spec.head_dim
        if spec.causal:
            flops *= causal_fraction(spec.lq, spec.lk, spec.causal_offset)
        kernel = attention_kernel_policy(spec.q.dtype, spec.tf32)
        peak = ceil.gemm_peak(kernel) * ATTENTION_EFFICIENCY[kernel]
        nbytes = sum(_view_bytes(v) for v in (spec.q, spec.k, spec.v, spec.o, spec.mask, spec.mask_blocks))
        return flops, nbytes, peak
    if isinstance(spec, AttentionMaskBlocksSpec):
        n = (spec.batch if spec.blocks.strides[0] else 1) * (spec.heads if spec.blocks.strides[1] else 1) * \
            spec.lq * spec.lk
        return float(n), _view_bytes(spec.mask) + _view_bytes(spec.blocks), ceil.fp32
    if isinstance(spec, CopySpec):
        return 0.0, float(sum(_view_bytes(i.src) + _view_bytes(i.dst) for i in spec.items)), ceil.fp32
    if isinstance(spec, BnStatsSpec):
        n = spec.n * spec.c * spec.s
        stats = (spec.running_mean, spec.running_var) if spec.mode != "batch" else ()
        reads = sum(_view_bytes(v) for v in (spec.x, spec.weight, spec.bias) + stats)
        return float(4 * n), float(reads + _view_bytes(spec.scale) + _view_bytes(spec.shift)), ceil.fp32
    if isinstance(spec, GroupStatsSpec):
        reads = sum(_view_bytes(v) for v in (spec.x, spec.weight, spec.bias))
        return float(4 * spec.rows * spec.cols), float(reads + _view_bytes(spec.scale) + _view_bytes(spec.shift)), \
            ceil.fp32
    if isinstance(spec, PoolSpec):
        window = math.prod(spec.kernel) if not spec.adaptive else max(1, math.ceil(
            math.prod(spec.x.shape[1:]) / max(1, math.prod(spec.out.shape[1:]))))
        n = math.prod(spec.out.shape)
        return float(n * (window + len(spec.prologue) * window + len(spec.epilogue))), \
            float(_view_bytes(spec.x) + _view_bytes(spec.out)), ceil.fp32
    if isinstance(spec, ScanSpec):
        n = spec.outer * spec.n * spec.inner
        return float(n * (1 + len(spec.prologue) + len(spec.epilogue))), \
            float(_view_bytes(spec.x) + _view_bytes(spec.out)), ceil.fp32
    if isinstance(spec, ArgSpec):
        return float(spec.outer * spec.red * spec.inner), float(_view_bytes(spec.x) + _view_bytes(spec.out)), ceil.fp32
    if isinstance(spec, GatherSpec):
        n = math.prod(spec.out.shape)
        x_bytes = min(_view_bytes(spec.x), n * spec.x.itemsize)
        return 0.0, float(x_bytes + sum(_view_bytes(v) for v in spec.inputs) + _view_bytes(spec.out)), ceil.fp32
    if isinstance(spec, IotaSpec):
        return float(math.prod(spec.out.shape)), float(_view_bytes(spec.out)), ceil.fp32
    return 0.0, 0.0, ceil.fp32


def causal_fraction(lq: int, lk: int, offset: int = 0) -> float:
    """The fraction of the lq x lk scores visible under a causal mask (key j <= query i + offset)."""
    if lq <= 0 or lk <= 0:
        return 0.0
    vis = sum(min(lk, max(0, i + offset + 1)) for i in range(lq)) if lq <= 65536 else \
        lq * lk * min(1.0, max(0.0, (lq / 2 + offset) / lk))
    return vis / (lq * lk)


def attention_kernel_policy(storage: str, tf32: bool) -> str:
    """Which peak (and efficiency) the fused attention kernel of a storage type runs at."""
    if storage == "float32":
        return "tf32" if tf32 else "fp32"
    return "bf16" if storage == "bfloat16" else "fp16"


def attention_time(policy: str, ceil: Ceilings, bh: int, lq: int, lk: int, d: int, *, causal: bool = False,
                   masked: bool = False, fused: bool = True) -> float:
    """Cost-model seconds of attention over ``bh`` (batch x head) pairs under ``policy``.

    ``fused``: the fused kernel of the policy at :data:`ATTENTION_EFFICIENCY` of the peak, the
    causal half skipped, q / k / v / o read and written once. Unfused: two cuBLAS GEMMs at
    :data:`GEMM_EFFICIENCY` over every score (no causal skipping) and the score matrix in the
    policy's storage through memory — written by the first GEMM, read and written by the mask
    pass (``masked``) and by softmax, read by the second GEMM — plus a launch per pass.
    """
    esize = float(DTYPE_SIZES[_storage(policy)])
    mm = 2.0 * bh * lq * lk * d  # one of the two matrix products
    io = esize * bh * 2 * (lq + lk) * d  # q and o; k and v
    if fused:
        kernel = attention_kernel_policy(_storage(policy), policy == "tf32")
        work = 2 * mm * (causal_fraction(lq, lk) if causal else 1.0)
        return work / (ceil.gemm_peak(kernel) * ATTENTION_EFFICIENCY[kernel]) + io / ceil.bandwidth + ceil.launch_s
    passes = 4 + (2 if masked else 0)
    scores = esize * bh * lq * lk
    return (2 * mm / (ceil.gemm_peak(policy) * GEMM_EFFICIENCY) + (passes * scores + io) / ceil.bandwidth
            + (3 + masked) * ceil.launch_s)


def conv_flops(batch: int, in_channels: int, out_channels: int, groups: int, kernel, positions) -> int:
    """Multiply-adds x 2 of a convolution: every output channel of every position (the input's
    positions for a transposed one, which scatters each input element) reads in_channels /
    groups x kernel values."""
    return 2 * batch * out_channels * (in_channels // max(groups, 1)) * math.prod(kernel) * math.prod(positions)


def node_flops_bytes(n: Node, ix: GraphIndex) -> tuple[float, float]:
    """FLOPs and fewest bytes of one reference node (FLOPs per element from the op registry)."""
    op = n.op
    kind = ops.kind(op)
    per = ops.aten(op).flops if kind else 1
    outs = [o for o in n.outputs if ix.users.get(o.name) or o.name in ix.graph_outputs] or list(n.outputs[:1])
    out_bytes = sum(o.nbytes for o in outs)
    in_bytes = sum(ix.spec(t).nbytes for t in dict.fromkeys(n.inputs))
    if kind == "view":
        if op in (A + "clone.default", A + "contiguous.default"):
            return 0.0, float(in_bytes + out_bytes)
        return 0.0, 0.0
    if kind == "gemm":
        first = n.inputs[1] if op == A + "addmm.default" else n.inputs[0]
        bias = op == A + "addmm.default" or (op == A + "linear.default" and
                                            ix.tensor_arg(n, ops.args(op), "bias") is not None)
        ash = ix.shape(first)
        k = ash[-1] if ash else 1
        out_numel = math.prod(n.outputs[0].shape)
        return float(per * out_numel * k + (out_numel if bias else 0)), float(in_bytes + out_bytes)
    if kind == "conv":
        xs, ws, ys = ix.shape(n.inputs[0]), ix.shape(n.inputs[1]), n.outputs[0].shape
        transposed = bool(n.attr("transposed"))
        groups = int(n.attr("groups") or 1)
        cin, cout = xs[1], ys[1]
        bias = ix.tensor_arg(n, ops.args(op), "bias") is not None  # one add per output element, as a GEMM's
        return float(conv_flops(xs[0], cin, cout, groups, ws[2:], xs[2:] if transposed else ys[2:]) +
                     (math.prod(ys) if bias else 0)), float(in_bytes + out_bytes)
    if kind == "recurrent":
        from ..recurrent import recurrence

        r = recurrence(n, ix.shape)
        flops = 0
        for layer in range(r.layers):  # input projections, the recurrent products, the cells
            flops += r.directions * r.steps * r.batch * r.gates * r.hidden * (2 * r.layer_input(layer) +
                                                                               2 * r.hidden + 4)
        return float(flops), float(in_bytes + out_bytes)
    if kind == "attention":
        a = ix.args(n, ops.args(op))
        qs, ks, vs = ix.shape(a["query"][1]), ix.shape(a["key"][1]), ix.shape(a["value"][1])
        bh = math.prod(qs[:-2])
        # q kᵀ over the head dim, then p v over the value's own (per / 2 FLOPs per multiply-add)
        return per / 2 * bh * qs[-2] * ks[-2] * (qs[-1] + vs[-1]) + 5.0 * bh * qs[-2] * ks[-2], \
            float(in_bytes + out_bytes)
    if kind == "row":
        return float(per * ix.spec(n.inputs[0]).numel), float(in_bytes + out_bytes)
    if kind in ("batch_norm", "group_norm"):
        x = ix.spec(n.inputs[0])
        return float(per * x.numel), float(in_bytes + out_bytes + x.nbytes)
    if kind in ("arg", "scan"):
        return float(per * ix.spec(n.inputs[0]).numel), float(in_bytes + out_bytes)
    if kind == "pool":
        # One per tap of each output's window, as a pool task counts (an overlapping 3x3 window at
        # stride 1 reads every input nine times).
        out = n.outputs[0].shape
        nsp = int(op.split("pool")[1][0])
        ks = n.attr("kernel_size")
        if ks:
            ks = tuple(int(k) for k in ks) * (nsp if len(ks) == 1 else 1)
            window = math.prod(ks)
        else:  # adaptive: the average window
            xs = ix.shape(n.inputs[0])
            window = max(1, math.ceil(math.prod(xs[len(xs) - nsp:]) / max(1, math.prod(out[len(out) - nsp:]))))
        return float(window * math.prod(out)), float(in_bytes + out_bytes)
    if kind in ("gather", "iota"):
        out_elems = math.prod(n.outputs[0].shape)
        idx_bytes = sum(ix.spec(t).nbytes for t in dict.fromkeys(n.inputs[1:]))
        x_bytes = min(ix.spec(n.inputs[0]).nbytes, out_elems * ix.spec(n.inputs[0]).nbytes //
                      max(1, ix.spec(n.inputs[0]).numel)) if n.inputs else 0
        return float(out_elems if kind == "iota" else 0), float(x_bytes + idx_bytes + out_bytes)
    if kind == "cat":
        return 0.0, float(in_bytes + out_bytes)
    if kind == "elementwise":
        return float(per * math.prod(n.outputs[0].shape)), float(in_bytes + out_bytes)
    return 0.0, float(in_bytes + out_bytes)


def node_cost(n: Node, ix: GraphIndex, policy: str, ceil: Ceilings) -> NodeCost:
    """Cost-model numbers of one reference node: FLOPs, fewest bytes, roofline time, bound."""
    flops, nbytes = node_flops_bytes(n, ix)
    peak = ceil.gemm_peak(policy) if ops.kind(n.op) in ("gemm", "attention", "conv") else ceil.fp32
    ct = flops / peak if peak else 0.0
    mt = nbytes / ceil.bandwidth
    bound = "none" if not flops and not nbytes else ("compute" if ct > mt else "memory")
    return NodeCost(n.name, n.op, int(flops), int(nbytes), max(ct, mt), bound)


__all__ = ["ATTENTION_HEAD_DIMS", "ATTENTION_MASK_CELL", "ATTENTION_EFFICIENCY", "GEMM_EFFICIENCY", "spec_cost",
           "conv_flops", "attention_time", "causal_fraction", "node_flops_bytes", "node_cost"]
