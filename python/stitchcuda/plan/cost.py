"""The cost model: FLOPs, fewest bytes and roofline time of tasks and of reference nodes.

Takes task specs or graph nodes and the device's :class:`~stitchcuda.device.Ceilings`; gives
numbers. A task is costed by its kind (:mod:`stitchcuda.kinds`: each kind's ``cost``); a
reference node here, by its op's kind and the op registry's FLOPs per element. *schedule* stamps
every task with FLOPs, bytes, estimated time and bound; the plan lists every reference node's
cost so the Verifier's profile can place the program against the reference.
"""

from __future__ import annotations

import math
from typing import Any

from .. import kinds
from .. import ops
from ..device import Ceilings
from ..ir import Node
from ..kinds.conv import conv_flops
from ..recurrent import recurrence
from .graph import GraphIndex
from .specs import NodeCost

A = ops.A


def spec_cost(spec: Any, ceil: Ceilings) -> tuple[float, float, float]:
    """(FLOPs, fewest bytes, peak FLOP/s) of one task, by its kind."""
    return kinds.of_spec(spec).cost(spec, ceil)


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


__all__ = ["spec_cost", "node_flops_bytes", "node_cost"]
