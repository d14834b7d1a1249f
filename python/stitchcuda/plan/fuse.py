"""Pass 3, *fuse*: every node left after *match* joins a task.

Takes the :class:`~.claims.Claims` *match* filled; adds to it and hands on a frozen
:class:`~.protos.Fused`. Row reductions take the unary elementwise ops before them as a prologue
hook and after them as an epilogue hook (a reduction over dims that are not trailing becomes an
axis reduction, or rows after a permuting copy); each GEMM (``linear``, ``matmul``, ``addmm``,
``bmm``) takes the chain after it: a leading scalar into ``alpha``, a per-column add as the
cuBLASLt bias, a same-shape add as ``beta·C`` (or a residual op), relu (and, off fp32, the tanh
GELU) into cuBLASLt's epilogue, the rest as the runtime's fused epilogue chain (which ops may
join: :func:`stitchcuda.ops.epilogue_of`); ``cat`` becomes a copy task (or none, when its parts
are written in place); the remaining elementwise ops are grouped into kernels (one output each,
at most eight inputs, recomputing cheap broadcast values). A node the constraints ``unfuse``
starts a task of its own.
"""

from __future__ import annotations

import math
from typing import Any

from .. import layout as L
from .. import ops
from ..ir import Node
from .claims import Claims
from .protos import AxisProto, CatProto, ChainStep, EwProto, GemmProto, Operand, RowProto
from .specs import EpOp, EwInstr

A = ops.A
#: cuBLASLt / runtime limit on the fused epilogue chain.
MAX_CHAIN = 8
#: elementwise.cuh's kEwMaxInputs: the most distinct tensors one elementwise kernel reads (two
#: batch norms' affines before an add — a residual block's tail — read six).
MAX_EW_INPUTS = 8
#: A reduction of a whole tensor at least this large to one value runs on the axis template,
#: which splits it over many blocks (the row template gives one row one block).
WHOLE_AXIS = 1 << 16
_FLOAT_DTYPES = ("float32", "float16", "bfloat16")


class Fuser:
    def __init__(self, cl: Claims):
        self.cl = cl
        self.ix = cl.ix

    def run(self) -> None:
        from . import fuse_tail

        ix, cl = self.ix, self.cl
        fuse_tail.claim_conv(self)
        fuse_tail.claim_recurrent(self)
        for n in list(ix.g.nodes):
            if ops.kind(n.op) == "row" and cl.free(n):
                self.reduce(n)
        for n in list(ix.g.nodes):
            if ops.kind(n.op) == "gemm" and cl.free(n):
                self.gemm(n)
        for n in list(ix.g.nodes):
            if n.op == ops.CAT and cl.free(n):
                rank = len(n.outputs[0].shape)
                dim = L.norm_dim(int(n.attr("dim") or 0), rank)
                # PyTorch's cat skips 1-d empty tensors (its legacy behaviour) whatever the rank of the others.
                parts = tuple(x for x in n.inputs if rank == 1 or ix.shape(x) != (0,))
                cl.claim(CatProto(n.name, (n.name,), (n.outputs[0].name,), tuple(n.inputs), dim=dim, parts=parts))
        fuse_tail.claim(self)
        self.group_elementwise()

    def hooks(self, n: Node, x: str, out: str) -> tuple[list[str], str, list[str], str]:
        """The unary elementwise nodes right before ``n`` on its input ``x`` (its prologue hook,
        in order) and right after its output ``out`` (its epilogue hook): (prologue node names,
        the tensor the prologue reads, epilogue node names, the tensor the epilogue writes)."""
        ix, cl = self.ix, self.cl
        pro: list[Node] = []
        t = x
        if n.name not in cl.unfuse:
            while True:
                p = ix.producer.get(t)
                if p is None or not cl.free(p) or not self.hookable(p) or ix.only_user(t) is None:
                    break
                pro.append(p)
                t = p.inputs[0]
        pro.reverse()
        x = t if pro else x
        epi: list[str] = []
        t = out
        while True:
            u = ix.only_user(t)
            if u is None or not cl.free(u) or not self.hookable(u):
                break
            epi.append(u.name)
            t = u.outputs[0].name
        return [p.name for p in pro], x, epi, t

    def hookable(self, node: Node) -> bool:
        """An elementwise node with exactly one tensor operand and a float result."""
        if ops.kind(node.op) != "elementwise" or node.op in (A + "where.self", A + "scalar_tensor.default",
                                                             A + "full.default"):
            return False
        if node.op.startswith("stitch.") or len(node.inputs) != 1 or node.name in self.cl.unfuse:
            return False
        out = node.outputs[0]
        if out.dtype != "float32" or self.ix.spec(node.inputs[0]).dtype != "float32":
            return False
        return self.ix.shape(node.inputs[0]) == out.shape

    # ------------------------------------------------------------------ reductions

    def reduce(self, n: Node, hooks: bool = True) -> None:
        """Claim row reduction ``n`` (``hooks``: with the unary ops around it as hooks)."""
        ix, cl = self.ix, self.cl
        x = n.inputs[0]
        xs = ix.shape(x)
        out = n.outputs[0].name
        op = n.op
        weight = bias = None
        eps, correction = 0.0, 1.0
        op_pro: tuple[EwInstr, ...] = ()
        op_epi: tuple[EwInstr, ...] = ()
        if op in (A + "max.dim", A + "min.dim"):
            # The values of max / min along a dim (their indices are the arg template's).
            writes_row = False
            rop = op.split(".")[1]
            dims = [L.norm_dim(int(n.attr("dim")), len(xs))] if xs else []
        elif op == A + "linalg_vector_norm.default":
            writes_row = False
            dims = n.attr("dim")
            dims = list(range(len(xs))) if dims is None or dims == () else \
                sorted({L.norm_dim(int(d), len(xs)) for d in dims})
            rop, op_pro, op_epi = _vector_norm(float(n.attr("ord", 2.0)))
            if n.attr("dtype") is not None:
                raise cl.fail(n, "vector norm with a dtype argument")
        elif op in (A + "_softmax.default", A + "_log_softmax.default"):
            if n.attr("half_to_float"):
                raise cl.fail(n, "half_to_float softmax")
            rop = "softmax" if "_softmax" in op and "log" not in op else "log_softmax"
            dims = [L.norm_dim(int(n.attr("dim")), len(xs))] if xs else []
            writes_row = True
        elif op == A + "native_layer_norm.default":
            a = ix.args(n, ops.args(op))
            k = len(n.attr("normalized_shape"))
            for extra in n.outputs[1:]:
                if ix.users.get(extra.name) or extra.name in ix.graph_outputs:
                    raise cl.fail(n, "layer norm's mean / rstd outputs are used; only the normalised output is supported")
            out = n.outputs[0].name
            rop, eps = "layer_norm", float(n.attr("eps"))
            weight = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
            bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
            dims = list(range(len(xs) - k, len(xs)))
            writes_row = True
        else:
            writes_row = False
            base = op.split(".")[1]
            dims = n.attr("dim")
            if op in (A + "sum.default", A + "mean.default") or dims is None or dims == ():
                dims = list(range(len(xs)))
            dims = [dims] if isinstance(dims, int) else dims
            dims = sorted({L.norm_dim(int(d), len(xs)) for d in dims}) if xs else []
            rop = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "logsumexp": "logsumexp",
                   "var": "var", "max": "max", "min": "min", "any": "max"}[base]
            if base == "any":  # any: the largest of x != 0
                op_pro = (EwInstr("to_bool", ("a0",)),)
            if base == "var":
                corr = n.attr("correction")
                correction = 1.0 if corr is None else float(corr)
                if op == A + "var.dim":
                    correction = 1.0 if n.attr("unbiased", True) else 0.0
            # (a dtype argument is the result's dtype, which the output's tensor carries: the
            # reduction runs in fp32 and is stored in it; float64 is refused for every tensor)
        if ix.spec(x).dtype not in _FLOAT_DTYPES and (writes_row or rop not in ("sum", "mean", "max", "min")):
            raise cl.fail(n, f"reduction over {ix.spec(x).dtype}")
        if math.prod(xs[d] for d in dims) == 0 and math.prod(xs[d] for d in range(len(xs)) if d not in dims) > 0:
            # (the row and axis templates take no empty row; the result is a constant PyTorch defines)
            raise cl.fail(n, "a reduction over an empty extent")
        pro, x, epi, last = self.hooks(n, x, out) if hooks else ([], x, [], out)
        nodes = pro + [n.name] + epi
        ins = [x] + [t for t in (weight, bias) if t]
        common: dict[str, Any] = dict(op=rop, x=x, out=last, pro=tuple(pro), epi=tuple(epi))
        if op_pro or op_epi:
            common.update(op_pro=op_pro, op_epi=op_epi)
        name = cl.name(nodes)
        proto_nodes, outs, tins = tuple(nodes), (last,), tuple(ins)
        nd = len(xs)
        trailing = dims == list(range(nd - len(dims), nd))
        strategy = cl.constraints.option(n.name, "auto")
        row = dict(weight=weight, bias=bias, eps=eps, correction=correction, writes_row=writes_row, strategy=strategy)
        if not dims:
            # A reduction over no dims (or of a 0-d tensor) is a copy through the hooks.
            cl.claim(RowProto(name, proto_nodes, outs, tins, k=0, **common, **row))
            return
        whole = not writes_row and rop in ("sum", "mean", "max", "min") and math.prod(xs[:nd - len(dims)]) == 1
        if trailing and whole and math.prod(xs) >= WHOLE_AXIS:
            # The whole tensor to one value: the axis template splits it over many blocks.
            cl.claim(AxisProto(name, proto_nodes, outs, tins, d0=0, d1=nd, **common))
            return
        if trailing:
            cl.claim(RowProto(name, proto_nodes, outs, tins, k=len(dims), **common, **row))
            return
        contiguous_run = dims == list(range(dims[0], dims[-1] + 1))
        if not writes_row and rop in ("sum", "mean", "max", "min") and contiguous_run:
            cl.claim(AxisProto(name, proto_nodes, outs, tins, d0=dims[0], d1=dims[-1] + 1, **common))
            return
        # Otherwise move the reduced dims last with a copy, reduce rows, and (for ops that write
        # a row) move them back.
        perm = tuple([d for d in range(nd) if d not in dims] + dims)
        cl.claim(RowProto(name, proto_nodes, outs, tins, k=len(dims), perm=perm, **common, **row))

    # ------------------------------------------------------------------ GEMMs and their chains

    def operands(self, n: Node) -> tuple[Operand, Operand, str | None, float]:
        ix, cl = self.ix, self.cl
        if n.op == A + "linear.default":
            a = ix.args(n, ops.args(n.op))
            bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
            return Operand(a["input"][1]), Operand(a["weight"][1], True), bias, 1.0
        if n.op == A + "addmm.default":
            a = ix.args(n, ops.args(n.op))
            if float(n.attr("beta", 1)) != 1.0:
                raise cl.fail(n, "addmm with beta != 1")
            bias = a["self"][1]
            if len(ix.shape(bias)) not in (1, 2) or ix.shape(bias)[-1] != ix.shape(n.outputs[0].name)[-1] or \
                    math.prod(ix.shape(bias)) != ix.shape(bias)[-1]:
                raise cl.fail(n, "addmm whose added matrix is not a per-column bias")
            return Operand(a["mat1"][1]), Operand(a["mat2"][1]), bias, float(n.attr("alpha", 1))
        return Operand(n.inputs[0]), Operand(n.inputs[1]), None, 1.0

    def gemm(self, n: Node) -> None:
        ix, cl = self.ix, self.cl
        a, b, bias, alpha = self.operands(n)
        out = n.outputs[0].name
        if ix.spec(out).dtype != "float32":
            raise cl.fail(n, f"GEMM on {ix.spec(out).dtype} tensors (policies store float32 as fp32/tf32/bf16/fp16)")
        os_ = ix.shape(out)
        ncols = os_[-1] if os_ else 1
        nodes = [n.name]
        steps: list[ChainStep] = []
        has_bias = bias is not None
        residual = False
        n_chain = 0
        t = out
        while True:
            u = ix.only_user(t)
            if u is None or not cl.free(u) or u.name in cl.unfuse:
                break
            if u.op in ops.TRANSPARENT:
                nodes.append(u.name)
                t = u.outputs[0].name
                continue
            if ops.kind(u.op) != "elementwise" or ix.shape(u.outputs[0].name) != ix.shape(t):
                break
            step = self.chain_step(u, t, ncols, has_bias, residual)
            if step is None:
                break
            if step.kind == "op":
                if n_chain >= MAX_CHAIN:
                    break
                n_chain += 1
            elif step.kind == "scale":
                n_chain += 1  # may fold into alpha; counted conservatively
            elif step.kind == "bias":
                has_bias = True
            elif step.kind == "residual":
                residual = True
                n_chain += 1
            if n_chain > MAX_CHAIN:
                break
            steps.append(step)
            nodes.append(u.name)
            t = u.outputs[0].name
        ins = [x for x in (a.tensor, b.tensor, bias) if x]
        for s in steps:
            if s.kind in ("bias", "residual"):
                ins.append(s.tensor)
        cl.claim(GemmProto(cl.name(nodes), tuple(nodes), (t,), tuple(ins), a=a, b=b, bias=bias, alpha=alpha,
                           steps=tuple(steps), out=t, policy=cl.policy_of(nodes)))

    def chain_step(self, u: Node, cur: str, ncols: int, has_bias: bool, residual: bool) -> ChainStep | None:
        """How consumer ``u`` of the GEMM's running result ``cur`` joins its epilogue, or None."""
        ix = self.ix
        op = u.op.removeprefix(A)
        if u.outputs[0].dtype != "float32":
            return None
        if len(u.inputs) == 1 and u.inputs[0] == cur:
            s = _scalar(u, "other")
            alpha = _scalar(u, "alpha")
            alpha = 1.0 if alpha is None else alpha
            if op == "mul.Tensor" and s is not None:
                return ChainStep("scale", s)
            if op == "div.Tensor" and s is not None:
                return ChainStep("div", s)
            if op == "add.Tensor" and s is not None:
                return ChainStep("op", op=EpOp("ADD_SCALAR", alpha * s))
            if op == "sub.Tensor" and s is not None:
                return ChainStep("op", op=EpOp("ADD_SCALAR", -alpha * s))
            e = ops.epilogue_of(u, lambda i: ix.spec(u.inputs[i]).dtype, ix.args)
            return ChainStep("op", op=e) if e is not None else None
        if op in ("add.Tensor", "sub.Tensor") and len(u.inputs) == 2 and u.inputs[0] != u.inputs[1]:
            alpha = float(u.attr("alpha", 1) or 1)
            first = u.inputs[0] == cur
            other = u.inputs[1] if first else u.inputs[0]
            if ix.spec(other).dtype != "float32":
                return None
            if op == "sub.Tensor" and not first:
                return None
            if not first and alpha != 1.0:
                return None
            coef = (-alpha if op == "sub.Tensor" else alpha) if first else 1.0
            os_ = ix.shape(other)
            if math.prod(os_) == ncols and os_ and os_[-1] == ncols and coef == 1.0 and not has_bias:
                return ChainStep("bias", tensor=other)
            if os_ == ix.shape(cur) and not residual:
                return ChainStep("residual", coef, tensor=other)
        return None

    # ------------------------------------------------------------------ elementwise groups

    def group_elementwise(self) -> None:
        ix, cl = self.ix, self.cl
        ew = [n for n in ix.nodes.values() if ops.kind(n.op) == "elementwise" and cl.free(n)]
        for n in sorted(ew, key=lambda x: -ix.pos[x.name]):
            if not cl.free(n):
                continue
            nodes = cl.pull_ew_group(n, set(), limit=MAX_EW_INPUTS)
            out = n.outputs[0].name
            leaves = cl.leaves(set(nodes))
            phase = "create" if out in ix.const and leaves and all(self._at_create(t) for t in leaves) else "run"
            if not leaves:
                phase = "create" if out not in ix.graph_outputs else "run"
            covers = ix.expand(nodes)
            idx = cl.claim(EwProto(cl.name(nodes), tuple(covers), (out,), tuple(leaves), phase, members=tuple(nodes),
                                   root=out, out_shape=ix.shape(out)))
            for x in nodes:
                cl.claimed[x] = idx


    def _at_create(self, t: str) -> bool:
        """Whether ``t`` exists when the program is created: a weight (through layout ops), or
        the result of a task claimed to run at create. A tensor computed from weights by a task
        that runs on every call (a GEMM, a gather) is not, so its readers run on every call too."""
        ix, cl = self.ix, self.cl
        while True:
            if t in ix.weights:
                return True
            p = ix.producer.get(t)
            if p is None:
                return False
            if ops.kind(p.op) == "view" and p.inputs:
                t = p.inputs[0]
                continue
            return not cl.free(p) and cl.protos[cl.claimed[p.name]].phase == "create"


def _vector_norm(p: float) -> tuple[str, tuple[EwInstr, ...], tuple[EwInstr, ...]]:
    """A vector p-norm as (reduction, transform of each element before it, of the result after)."""
    ab = EwInstr("abs", ("a0",))
    if p == 2.0:
        return "sum", (EwInstr("square", ("a0",)),), (EwInstr("sqrt", ("a0",)),)
    if p == 1.0:
        return "sum", (ab,), ()
    if p == math.inf:
        return "max", (ab,), ()
    if p == -math.inf:
        return "min", (ab,), ()
    if p == 0.0:
        return "sum", (EwInstr("ne", ("a0", "c0"), (0.0,)),), ()
    return "sum", (ab, EwInstr("pow", ("t0", "c0"), (p,))), (EwInstr("pow", ("a0", "c0"), (1.0 / p,)),)


def _scalar(node: Node, key: str) -> float | None:
    from .graph import scalar_attr

    return scalar_attr(node, key)


def fuse(cl: Claims) -> None:
    """Claim every remaining node into ``cl`` (see the module docstring)."""
    Fuser(cl).run()


__all__ = ["fuse", "Fuser", "MAX_CHAIN"]
