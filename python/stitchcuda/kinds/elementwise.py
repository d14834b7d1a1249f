"""Elementwise groups: fused expressions of pointwise ops through elementwise.cuh.

Claim: GPT-2's tanh GELU written out becomes one ``gelu(approximate='tanh')`` node (*match*: so
that a GEMM's epilogue can take it); after every other kind has claimed its nodes, the remaining
elementwise nodes are grouped, from the last backwards, into kernels of one output each that read
at most :data:`MAX_EW_INPUTS` tensors (recomputing cheap broadcast values). A group whose inputs
exist at create (weights, and create-time results) runs once, at create.

Lowering: the members' instructions (the op registry's :func:`stitchcuda.ops.lower`) over the
group's leaves, each leaf read through its layout broadcast to the output's shape; written over
an input that dies here when the layouts allow, else at its placement target or a fresh buffer.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from . import cxx
from .base import ClaimRule, Proto, TaskKind, view_bytes

A = ops.A
#: elementwise.cuh's kEwMaxInputs: the most distinct tensors one elementwise kernel reads (two
#: batch norms' affines before an add — a residual block's tail — read six).
MAX_EW_INPUTS = 8


@dataclass(frozen=True)
class EwSpec:
    """``out = expr(inputs)`` through elementwise.cuh; ``shape`` and the strides are the
    launch layout after dropping size-1 dims and merging contiguous ones (<= 6 dims)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "elementwise")

    kind: str
    out: View
    inputs: tuple[View, ...]
    instrs: tuple[EwInstr, ...]
    shape: tuple[int, ...]
    out_strides: tuple[int, ...]
    in_strides: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class EwProto(Proto):
    """An elementwise group (``members`` evaluated in order, the last one's output ``root``),
    or — with no members — ``final`` applied to ``root`` itself (a mask preparation)."""

    members: tuple[str, ...] = ()
    root: str = ""
    leaf: str | None = None
    final: EwInstr | None = None
    out_shape: tuple[int, ...] = ()

    @property
    def reading_nodes(self) -> tuple[str, ...]:
        return self.members


# ---------------------------------------------------------------------- claim


def claim_gelu_tanh(cx) -> None:
    """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), the GELU of GPT-2 / minGPT,
    becomes one ``gelu(approximate='tanh')`` so that a GEMM epilogue can take it."""
    ix = cx.ix
    for th in list(ix.g.nodes):
        if th.op == A + "tanh.default" and th.name in ix.nodes and cx.free(th):
            _gelu_tanh(cx, th)


def _gelu_tanh(cx, th: Node) -> None:
    ix = cx.ix

    def prod(t: str) -> Node | None:
        n = ix.producer.get(t)
        return n if n is not None and n.name in ix.nodes and cx.free(n) else None

    def scal(n: Node | None, op: str, value: float) -> bool:
        return n is not None and n.op == A + op and len(n.inputs) == 1 and \
            n.scalar("other") is not None and abs(n.scalar("other") - value) < 1e-6 and \
            (n.op != A + "add.Tensor" or n.attr("alpha") in (None, 1))

    m3 = prod(th.inputs[0])
    if not scal(m3, "mul.Tensor", math.sqrt(2 / math.pi)):
        return
    a1 = prod(m3.inputs[0])
    if a1 is None or a1.op != A + "add.Tensor" or len(a1.inputs) != 2 or a1.attr("alpha") not in (None, 1):
        return
    for x, other in ((a1.inputs[0], a1.inputs[1]), (a1.inputs[1], a1.inputs[0])):
        m2 = prod(other)
        if not scal(m2, "mul.Tensor", 0.044715):
            continue
        p3 = prod(m2.inputs[0])
        if p3 is None or p3.op != A + "pow.Tensor_Scalar" or p3.scalar("exponent") != 3.0 or p3.inputs[0] != x:
            continue
        break
    else:
        return
    u = ix.only_user(th.outputs[0].name)
    if not scal(u, "add.Tensor", 1.0):
        return
    m4 = ix.only_user(u.outputs[0].name)
    if m4 is None or m4.op != A + "mul.Tensor" or len(m4.inputs) != 2 or u.outputs[0].name not in m4.inputs:
        return
    half = prod(m4.inputs[0] if m4.inputs[1] == u.outputs[0].name else m4.inputs[1])
    if not scal(half, "mul.Tensor", 0.5) or half.inputs[0] != x:
        return
    group = [half, p3, m2, a1, m3, th, u, m4]
    inner = {g.name for g in group}
    for g in group[:-1]:
        if any(us.name not in inner for us in ix.users[g.outputs[0].name]) or g.outputs[0].name in ix.graph_outputs:
            return
    if ix.shape(x) != m4.outputs[0].shape or ix.spec(x).dtype != "float32":
        return
    if any(g.name in cx.unfuse for g in group):
        return
    syn = Node(f"{m4.name}_gelu", A + "gelu.default", (x,), (m4.outputs[0],), (("approximate", "tanh"),), m4.source)
    ix.replace_nodes(group, syn)


def claim_groups(cx) -> None:
    """Every elementwise node still free joins a group (see the module docstring)."""
    ix = cx.ix
    ew = [n for n in ix.nodes.values() if ops.kind(n.op) == "elementwise" and cx.free(n)]
    for n in sorted(ew, key=lambda x: -ix.pos[x.name]):
        if not cx.free(n):
            continue
        nodes = cx.pull_ew_group(n, set(), limit=MAX_EW_INPUTS)
        out = n.outputs[0].name
        leaves = cx.leaves(set(nodes))
        phase = "create" if out in ix.const and leaves and all(_at_create(cx, t) for t in leaves) else "run"
        if not leaves:
            phase = "create" if out not in ix.graph_outputs else "run"
        covers = ix.expand(nodes)
        cx.claim(EwProto(cx.name(nodes), tuple(covers), (out,), tuple(leaves), phase, members=tuple(nodes),
                         root=out, out_shape=ix.shape(out)), nodes=list(covers) + list(nodes))


def _at_create(cx, t: str) -> bool:
    """Whether ``t`` exists when the program is created: a weight (through layout ops), the
    result of a task claimed to run at create, or of elementwise nodes over such tensors not yet
    claimed (groups are claimed from the last back, so a shared weight-only group — a folded
    batch norm's scale, read by the new weights and the new bias — is claimed after its
    readers: it will run at create). A tensor computed from weights by a task that runs on every
    call (a GEMM, a gather) is not, so its readers run on every call too."""
    ix = cx.ix
    while True:
        if t in ix.weights:
            return True
        p = ix.producer.get(t)
        if p is None:
            return False
        if ops.kind(p.op) == "view" and p.inputs:
            t = p.inputs[0]
            continue
        if cx.free(p):
            return ops.kind(p.op) == "elementwise" and t in ix.const and bool(p.inputs) and \
                all(_at_create(cx, i) for i in p.inputs)
        return cx.protos[cx.claimed[p.name]].phase == "create"


# ---------------------------------------------------------------------- lower


def lower(lw, pr: EwProto, pre: list) -> None:
    out_t = pr.outs[0]
    nodes = [lw.ix.nodes[x] for x in pr.members]
    shape = lw.shape(out_t)
    leaves: list[str] = []
    refs: dict[str, str] = {}
    instrs: list[EwInstr] = []

    def ref(t: str) -> str:
        if t in refs:
            return refs[t]
        if t not in leaves:
            leaves.append(t)
        return f"a{leaves.index(t)}"

    for nd in nodes:
        operands = {t: refs.get(t) or ref(t) for t in nd.inputs}
        new = lw.lower_ew(nd, operands, len(instrs))
        if new is None:
            raise lw.fail(nd, "no elementwise translation")
        instrs.extend(new)
        refs[nd.outputs[0].name] = f"t{len(instrs) - 1}"
    if pr.final is not None:
        src = refs.get(pr.root) or ref(pr.root)
        fin = pr.final
        instrs.append(EwInstr(fin.op, tuple(src if a == "x" else a for a in fin.args), fin.consts))
    elif not nodes:
        instrs.append(EwInstr("copy", (ref(pr.root),)))
    views = [lw.read(t, pre, pr.phase) for t in leaves]
    ins = [L.broadcast_to(v, shape) for v in views]
    # A channels-last input of the output's shape (a convolution's result) keeps the layout: the
    # group's result goes on to the next channels-last reader without a conversion.
    order = L.channels_last_order(len(shape)) if any(v.shape == shape and L.is_channels_last(v) for v in views) \
        else None
    # Written in place over an input that dies here, when no other input reads that buffer
    # through another layout (each element is read before it is written, by one thread).
    cands = []
    for t, v in zip(leaves, ins):
        if t in lw.materialized and lw.shape(t) == shape and all(
                w.buffer != v.buffer or (w.offset == v.offset and w.strides == v.strides) for w in ins):
            cands.append(t)
    # A channels-last group writes a target in another layout (a graph output, channels first)
    # itself: the template's tiled path reads one layout and writes the other, both coalesced, in
    # the one pass a group and a converting copy after it would take two for. A target with no
    # unit-stride dim (nothing for the tiles to write along) gets a fresh channels-last buffer.
    vo = lw.out_view(pr, out_t, lambda tv: len(L.coalesce(tv.shape, tv.strides)[0]) <= 6 and
                     (order is None or L.is_dense_in(tv, order) or _unit_stride(tv)), inplace=cands, order=order)
    if not ins:
        # A constant: the template needs one input to drive it; it reads (and ignores) one
        # element of the output.
        ins.append(dataclasses.replace(vo, strides=(0,) * len(shape)))
    # The launch walks its dims innermost-last: put them in the output's memory order (outermost
    # stride first), so that consecutive threads write — and, in one layout, read — consecutive
    # elements. A contiguous output keeps its order; channels-last data is walked channels fastest.
    walk = sorted(range(len(shape)), key=lambda d: -vo.strides[d] if shape[d] > 1 else 0) \
        if any(a < b for a, b in zip(vo.strides, vo.strides[1:])) else list(range(len(shape)))
    cshape, cstr = L.coalesce([shape[d] for d in walk], [vo.strides[d] for d in walk],
                              *[[v.strides[d] for d in walk] for v in ins])
    if len(cshape) > 6:
        raise lw.fail(nodes[0] if nodes else lw.ix.node(pr.nodes[0]), "elementwise layout with more than 6 dims")
    spec = EwSpec("elementwise", vo, tuple(ins), tuple(instrs), cshape, cstr[0], tuple(cstr[1:]))
    reads = ins if leaves else []
    lw.add(pr, pr.name, spec, reads, [vo], touched=list(pr.ins) + leaves + [out_t] +
           [o.name for nd in nodes for o in nd.outputs])


def _unit_stride(v: View) -> bool:
    """Whether ``v`` is contiguous along some dim of more than one element."""
    return any(st == 1 and n > 1 for n, st in zip(v.shape, v.strides))


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: EwSpec, ceil) -> tuple[float, float, float]:
    n = math.prod(spec.out.shape)
    return float(n * len(spec.instrs)), sum(view_bytes(v) for v in spec.inputs) + view_bytes(spec.out), ceil.fp32


def interpret(mem, s: EwSpec) -> None:
    leaves = [mem.read(v, s.shape, st) for v, st in zip(s.inputs, s.in_strides)]
    mem.write(s.out, mem.eval(s.instrs, leaves), s.shape, s.out_strides)


def render(t, e: EwSpec, n, fn: str) -> tuple[list[str], list[str]]:
    pre = cxx.functor(f"{fn}_fn", e.instrs, len(e.inputs))
    k = len(e.inputs)
    layout = (f"  const stitch::EwLayout<{k}> layout{{{len(e.shape)}, {cxx.ilist(e.shape)}, "
              f"{cxx.ilist(e.out_strides)}, {{{', '.join(cxx.ilist(s) for s in e.in_strides)}}}}};")
    args = ", ".join(n(f"inputs[{i}]") for i in range(k))
    launch = "launch_elementwise_once" if t.phase == "create" else "launch_elementwise"  # (one kernel: run once)
    body = [layout,
            f"  return cuda_check(stitch::{launch}({fn}_fn{{}}, {n('out')}, layout, stream,",
            f"                                               {args}),",
            f'                    "{t.name}");']
    return pre, body


def out_order(pr: EwProto, order_of) -> tuple[int, ...] | None:
    """Channels-last when a leaf of the result's shape is (see :func:`lower`)."""
    cl = L.channels_last_order(len(pr.out_shape))
    return cl if len(pr.out_shape) in (4, 5) and any(order_of(t) == cl for t in pr.ins) else None


KIND = TaskKind("elementwise", EwSpec, "elementwise_kernel", cost, interpret, render,
                lowers=((EwProto, lower),),
                claims=(ClaimRule("match", 40, claim_gelu_tanh), ClaimRule("fuse", 900, claim_groups)),
                headers=("stitch/elementwise.cuh",), scratch=frozenset(), out_order=out_order)

__all__ = ["EwSpec", "EwProto", "MAX_EW_INPUTS", "KIND"]
