"""Pass 1–2, *check* and *match*: multi-node patterns become one task each.

Takes a :class:`~.graph.GraphIndex`, the policy, the ceilings and the constraints; gives a
:class:`~.protos.Fused` holding the protos of the patterns it recognised (the graph index is
rewritten where a pattern becomes one synthetic node, then frozen by :mod:`.fuse`).

*check*: every node's operator is one the registry maps (:func:`stitchcuda.ops.supported`),
every tensor has a dtype the runtime stores; otherwise :class:`~.specs.PlanError` names each.

*match*: attention (``Q·Kᵀ``, scale, a mask by ``where``, softmax, ``·V`` — and
``scaled_dot_product_attention``) to the fused attention template when the head dim is one it is
instantiated for (the mask prepared once, at create time, when it comes from weights), TF32
tensor cores under tf32, mma.sync under bf16 / fp16, and under fp32 the exact SIMT kernel unless
the cost model finds cuBLAS SGEMM + softmax cheaper (or a ``strategy`` constraint says which) —
else GEMM (scale as ``alpha``) + the mask as an elementwise pass + softmax + GEMM; RMS norm
written out (``x * rsqrt(mean(x²) + eps) * w``) and logsumexp written out to one row reduction
each; GPT-2's tanh GELU written out to one ``gelu``; batch norm (training: batch statistics;
eval: running statistics) to a statistics task plus an elementwise normalise; group norm and
instance norm likewise, from per-(sample, group) statistics over rows.
"""

from __future__ import annotations

import math

from .. import layout as L
from .. import ops
from ..device import Ceilings
from ..ir import Node
from .claims import Claims
from .cost import ATTENTION_HEAD_DIMS, attention_time
from .protos import AttnProto, BnStatsProto, EwProto, GemmProto, GroupStatsProto, Operand, RowProto
from .specs import EwInstr, PlanError
from .graph import GraphIndex, scalar_attr

A = ops.A
_UNSTORABLE = ("float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2")


def check(ix: GraphIndex) -> None:
    """Raise :class:`PlanError` naming every node the planner cannot map."""
    from .. import manifest as mf

    bad = []
    supported = ops.supported()
    for n in ix.g.nodes:
        if n.op not in supported:
            bad.append((n.op, n.name, n.source, "no template or generator maps it yet"))
            continue
        for o in n.outputs:
            if o.dtype in _UNSTORABLE:
                bad.append((n.op, n.name, n.source, f"{o.dtype} tensors are not supported by the runtime"))
    for s in ix.g.inputs + ix.g.weights:
        if s.dtype not in mf.DTYPE_SIZES:
            bad.append((f"{s.dtype} tensor", s.name, s.name, f"{s.dtype} cannot cross the program ABI"))
    if bad:
        raise PlanError(ix.name, bad)


class Matcher:
    def __init__(self, cl: Claims, ceil: Ceilings):
        self.cl = cl
        self.ix = cl.ix
        self.ceil = ceil
        self.storage = _storage(cl.policy)

    def run(self) -> None:
        ix, cl = self.ix, self.cl
        for n in list(ix.g.nodes):
            if n.op == A + "_softmax.default" and cl.free(n):
                self.attention(n)
        for n in list(ix.g.nodes):
            if n.op == ops.SDPA and cl.free(n):
                self.sdpa(n)
        for n in list(ix.g.nodes):
            if n.op in (A + "rsqrt.default", A + "sqrt.default") and cl.free(n):
                self.rms(n)
        for n in list(ix.g.nodes):
            if n.op == A + "amax.default" and cl.free(n):
                self.logsumexp(n)
        for n in list(ix.g.nodes):
            if ops.kind(n.op) == "batch_norm" and cl.free(n):
                self.batch_norm(n)
            elif ops.kind(n.op) == "group_norm" and cl.free(n):
                self.group_norm(n)
        for n in list(ix.g.nodes):
            if n.op == A + "tanh.default" and n.name in ix.nodes and cl.free(n):
                self.gelu_tanh(n)

    # ------------------------------------------------------------------ attention

    def _neg_inf_const(self, t: str) -> bool:
        p = self.ix.producer.get(t)
        if p is None:
            return False
        v = scalar_attr(p, "s") if p.op == A + "scalar_tensor.default" else \
            scalar_attr(p, "fill_value") if p.op == A + "full.default" else None
        return v is not None and v == -math.inf

    def attention(self, sm: Node) -> None:
        ix, cl = self.ix, self.cl
        x = sm.inputs[0]
        xs = ix.shape(x)
        if len(xs) < 2 or L.norm_dim(int(sm.attr("dim")), len(xs)) != len(xs) - 1 or sm.attr("half_to_float"):
            return
        covered = [sm.name]
        scale, mask, t = 1.0, None, x
        mm1 = None
        while True:
            p = ix.producer.get(t)
            if p is None or not cl.free(p) or ix.only_user(t) is None:
                return
            if p.op == A + "where.self" and mask is None:
                a = ix.args(p, ops.args(p.op))
                if not all(v and v[0] == "t" for v in a.values()):
                    return
                cond, yes, no = a["condition"][1], a["self"][1], a["other"][1]
                if self._neg_inf_const(yes):  # where(cond, -inf, x): cond masks
                    mask, t, const = (cond, False), no, yes
                elif self._neg_inf_const(no):  # where(cond, x, -inf): cond attends
                    mask, t, const = (cond, True), yes, no
                else:
                    return
                covered.append(p.name)
                cp = ix.producer[const]
                if all(u.name == p.name for u in ix.users[const]) and const not in ix.graph_outputs:
                    covered.append(cp.name)
                continue
            if p.op in (A + "mul.Tensor", A + "div.Tensor") and len(p.inputs) == 1:
                s = scalar_attr(p, "other")
                if s is None or s <= 0:
                    return
                scale = scale * s if p.op.startswith(A + "mul") else scale / s
                covered.append(p.name)
                t = p.inputs[0]
                continue
            if p.op in ops.TRANSPARENT:
                covered.append(p.name)
                t = p.inputs[0]
                continue
            if p.op in (A + "matmul.default", A + "bmm.default"):
                mm1 = p
                covered.append(p.name)
                break
            return
        t = sm.outputs[0].name
        while True:
            u = ix.only_user(t)
            if u is None or not cl.free(u):
                return
            if u.op in ops.TRANSPARENT:
                covered.append(u.name)
                t = u.outputs[0].name
                continue
            if u.op in (A + "matmul.default", A + "bmm.default") and u.inputs[0] == t and u.inputs[1] != t:
                mm2 = u
                covered.append(u.name)
                break
            return
        q, kt = mm1.inputs[0], mm1.inputs[1]
        v = mm2.inputs[1]
        qs, kts, vs = ix.shape(q), ix.shape(kt), ix.shape(v)
        if not (len(qs) == len(kts) == len(vs) >= 3 and len(qs) <= 4):
            return
        if qs[:-2] != kts[:-2] or qs[:-2] != vs[:-2] or kts[-2] != qs[-1] or vs[-2] != kts[-1]:
            return
        d, dv = qs[-1], vs[-1]
        if any(ix.spec(z).dtype != "float32" for z in (q, kt, v)):
            return
        if mask is not None:
            cond = mask[0]
            try:
                L.broadcast_shapes(ix.shape(cond), xs)
            except ValueError:
                return
            if L.broadcast_shapes(ix.shape(cond), xs) != xs:
                return
        choice = self.cl.constraints.option(sm.name, "auto")
        fits = d == dv and d in ATTENTION_HEAD_DIMS
        if fits and choice != "unfused" and not cl.absorbs_unfused(covered, anchor=mm1.name) and (
                choice == "fused" or not self._unfused_attention_cheaper(
                    mm1.name, math.prod(qs[:-2]), qs[-2], kts[-1], d, causal=False, masked=mask is not None,
                    policy=cl.policy_of(covered))):
            ins = [q, kt, v]
            mk, kind = None, "none"
            if mask is not None:
                mk, kind = self._mask_prep(sm.name, mask[0], mask[1], "bool", covered), "bool"
                ins.append(mk)
            cl.claim(AttnProto(f"attention_{mm1.name}", tuple(covered), (mm2.outputs[0].name,), tuple(ins), q=q, k=kt,
                               v=v, k_transposed=True, scale=scale, out=mm2.outputs[0].name, mask=mk, mask_kind=kind,
                               policy=cl.policy_of(covered)))
            return
        # No fused template for this head dim (or the unfused plan is cheaper, or asked for): the
        # generic passes plan it as a GEMM (the scale folded into alpha), the mask as an
        # elementwise pass in place, softmax in place, a GEMM.
        if not fits:
            cl.notes.append(f"attention at {mm1.name}: head dim {d} has no fused template "
                            f"({', '.join(map(str, ATTENTION_HEAD_DIMS))}); planned as GEMM + mask + softmax + GEMM")

    def _unfused_attention_cheaper(self, where: str, bh: int, lq: int, lk: int, d: int, *, causal: bool,
                                   masked: bool, policy: str) -> bool:
        """Under fp32 only (tf32 and 16-bit policies always fuse: tensor-core kernels): whether
        cuBLAS SGEMM + [mask] + softmax + SGEMM through the score matrix beats the exact SIMT
        kernel by the cost model (:func:`~.cost.attention_time`). A constant mask's sparsity is
        unknown here: the fused kernel is costed dense although it skips the tiles the mask hides."""
        if policy != "fp32" or causal:
            return False
        fused = attention_time("fp32", self.ceil, bh, lq, lk, d, causal=causal, masked=masked)
        unfused = attention_time("fp32", self.ceil, bh, lq, lk, d, causal=causal, masked=masked, fused=False)
        if unfused < fused:
            self.cl.notes.append(f"attention at {where}: the exact fp32 kernel ({fused * 1e6:.0f} us by the cost "
                                 f"model) is slower than SGEMM + softmax + SGEMM ({unfused * 1e6:.0f} us); planned unfused")
            return True
        return False

    def _mask_prep(self, anchor: str, cond: str, attend_if_true: bool, kind: str, covered: list[str]) -> str:
        """A task computing the fused attention's mask from ``cond`` (where(cond, -inf, x) masks
        where cond holds: ``attend_if_true`` False): ``bool`` -> nonzero = attend; ``additive`` ->
        0 or -inf in the storage dtype. Runs at create when cond depends on weights only."""
        ix, cl = self.ix, self.cl
        shape = ix.shape(cond)
        out = ix.add_tensor(f"{anchor}_mask", shape, "bool" if kind == "bool" else self.storage)
        root = ix.producer.get(cond)
        nodes: list[str] = []
        if root is not None and ops.kind(root.op) == "elementwise" and cl.free(root) and \
                all(u.name in covered for u in ix.users[cond]) and cond not in ix.graph_outputs:
            nodes = cl.pull_ew_group(root, set(covered), limit=4)
        leaf_cond = cond if not nodes else None
        final = EwInstr("not", ("x",)) if (kind == "bool" and not attend_if_true) else \
            EwInstr("to_bool", ("x",)) if kind == "bool" else \
            EwInstr("where", ("x", "c0", "c1"), (0.0, -math.inf) if attend_if_true else (-math.inf, 0.0))
        ins = (cond,) if leaf_cond else ()
        phase = "create" if cond in ix.const else "run"
        cl.claim(EwProto(f"mask_{anchor}", tuple(nodes), (out,), ins, phase, members=tuple(nodes), root=cond,
                         leaf=leaf_cond, final=final, out_shape=shape))
        return out

    def sdpa(self, n: Node) -> None:
        ix, cl = self.ix, self.cl
        a = ix.args(n, ops.args(ops.SDPA))
        q, k, v = a["query"][1], a["key"][1], a["value"][1]
        mask = a["attn_mask"][1] if a["attn_mask"] and a["attn_mask"][0] == "t" else None
        qs, ks, vs = ix.shape(q), ix.shape(k), ix.shape(v)
        out = n.outputs[0].name
        if len(qs) not in (3, 4) or len(ks) != len(qs) or len(vs) != len(qs):
            raise cl.fail(n, "attention needs 3-D or 4-D query, key and value")
        d = qs[-1]
        scale = n.attr("scale")
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        causal = bool(n.attr("is_causal"))
        gqa = bool(n.attr("enable_gqa"))
        hq = qs[-3] if len(qs) == 4 else 1
        hk = ks[-3] if len(ks) == 4 else 1
        if float(n.attr("dropout_p") or 0.0) != 0.0:
            raise cl.fail(n, "attention dropout is not supported")
        if any(ix.spec(z).dtype != "float32" for z in (q, k, v)):
            raise cl.fail(n, "attention on non-float32 tensors")
        policy = cl.policy_of([n.name])
        choice = cl.constraints.option(n.name, "auto")
        fusable = d == vs[-1] and d in ATTENTION_HEAD_DIMS and (hq == hk or (gqa and hq % hk == 0))
        decomposable = not (causal or gqa or hq != hk)
        if fusable and decomposable and (choice == "unfused" or (choice == "auto" and self._unfused_attention_cheaper(
                n.name, math.prod(qs[:-2]), qs[-2], ks[-2], d, causal=False, masked=mask is not None, policy=policy))):
            fusable = False
        if fusable:
            ins = [q, k, v]
            kind = "none"
            if mask is not None:
                md = ix.spec(mask).dtype
                if md == "bool":
                    kind = "bool"
                elif md == "float32":
                    kind = "add_same" if self.storage == "float32" else "add_f32"
                else:
                    raise cl.fail(n, f"attention mask of dtype {md}")
                ins.append(mask)
            cl.claim(AttnProto(f"attention_{n.name}", (n.name,), (out,), tuple(ins), q=q, k=k, v=v, scale=scale,
                               out=out, causal=causal, heads_per_kv=hq // hk, mask=mask, mask_kind=kind, policy=policy))
            return
        if not decomposable:
            why = f"head dim {d} has no fused attention template" if d not in ATTENTION_HEAD_DIMS else \
                f"the value's dim {vs[-1]} is not the head dim {d} (the fused template takes one)" \
                if d != vs[-1] else f"{hq} query heads do not group over {hk} key heads"
            raise cl.fail(n, f"{why}, and the decomposed path does not handle is_causal or grouped-query attention "
                             "yet")
        lq, lk = qs[-2], ks[-2]
        batch = qs[:-2]
        scores = ix.add_tensor(f"{n.name}_scores", batch + (lq, lk), "float32")
        probs = ix.add_tensor(f"{n.name}_probs", batch + (lq, lk), "float32")
        cl.claim(GemmProto(f"{n.name}_scores", (n.name,), (scores,), (q, k), a=Operand(q), b=Operand(k, True),
                           alpha=scale, out=scores, policy=policy))
        if mask is not None:
            # The mask as an elementwise pass over the scores (in place); it fuses like any other.
            md = ix.spec(mask).dtype
            if md not in ("bool", "float32"):
                raise cl.fail(n, f"attention mask of dtype {md}")
            masked = ix.add_tensor(f"{n.name}_masked", batch + (lq, lk), "float32")
            op = "stitch.mask_bool" if md == "bool" else "stitch.mask_add"
            syn = Node(f"{n.name}_mask", op, (scores, mask), (ix.spec(masked),), (), n.source)
            ix.insert_node(syn, [n.name], ix.pos[n.name] + 0.25, takes_from=n.name, take_inputs=[mask])
            scores = masked
        cl.protos.append(RowProto(f"{n.name}_softmax", (n.name,), (probs,), (scores,), op="softmax", x=scores,
                                  out=probs, k=1, writes_row=True))
        cl.protos.append(GemmProto(f"{n.name}_pv", (n.name,), (out,), (probs, v), a=Operand(probs), b=Operand(v),
                                   out=out, policy=policy))
        if not (d == vs[-1] and d in ATTENTION_HEAD_DIMS):
            cl.notes.append(f"{n.name}: head dim {d} has no fused attention template "
                            f"({', '.join(map(str, ATTENTION_HEAD_DIMS))}); planned as GEMM + softmax + GEMM")

    # ------------------------------------------------------------------ norms, logsumexp, GELU

    def rms(self, r: Node) -> None:
        """x * rsqrt(mean(x^2, -1, keepdim) + eps) [* w]  (also x / sqrt(...))."""
        ix, cl = self.ix, self.cl
        add = ix.producer.get(r.inputs[0])
        if add is None or add.op != A + "add.Tensor" or len(add.inputs) != 1 or not cl.free(add):
            return
        eps = scalar_attr(add, "other")
        if eps is None or ix.only_user(add.outputs[0].name) is None:
            return
        mean = ix.producer.get(add.inputs[0])
        if mean is None or mean.op != A + "mean.dim" or not mean.attr("keepdim") or not cl.free(mean):
            return
        if ix.only_user(mean.outputs[0].name) is None:
            return
        sq = ix.producer.get(mean.inputs[0])
        if sq is None or not cl.free(sq) or ix.only_user(sq.outputs[0].name) is None:
            return
        if sq.op == A + "pow.Tensor_Scalar" and scalar_attr(sq, "exponent") == 2.0:
            x = sq.inputs[0]
        elif sq.op == A + "mul.Tensor" and len(sq.inputs) == 2 and sq.inputs[0] == sq.inputs[1]:
            x = sq.inputs[0]
        else:
            return
        xs = ix.shape(x)
        dims = mean.attr("dim")
        if not xs or dims is None or len(dims) != 1 or L.norm_dim(dims[0], len(xs)) != len(xs) - 1:
            return
        u = ix.only_user(r.outputs[0].name)
        if u is None or not cl.free(u):
            return
        want = A + "mul.Tensor" if r.op == A + "rsqrt.default" else A + "div.Tensor"
        if u.op != want or len(u.inputs) != 2 or x not in u.inputs or r.outputs[0].name not in u.inputs:
            return
        if u.op == A + "div.Tensor" and u.inputs[0] != x:
            return
        if ix.shape(u.outputs[0].name) != xs:
            return
        nodes = [sq.name, mean.name, add.name, r.name, u.name]
        out = u.outputs[0].name
        weight = None
        w = ix.only_user(out)
        if w is not None and cl.free(w) and w.op == A + "mul.Tensor" and len(w.inputs) == 2 and w.name not in cl.unfuse:
            other = w.inputs[1] if w.inputs[0] == out else w.inputs[0]
            if other != out and ix.shape(other) in ((xs[-1],), (1,) * (len(xs) - 1) + (xs[-1],)) and \
                    ix.shape(w.outputs[0].name) == xs and ix.spec(other).dtype == "float32":
                weight = other
                nodes.append(w.name)
                out = w.outputs[0].name
        if cl.absorbs_unfused(nodes, anchor=sq.name):
            return
        ins = (x,) + ((weight,) if weight else ())
        cl.claim(RowProto(f"rms_norm_{r.name}", tuple(nodes), (out,), ins, op="rms_norm", x=x, out=out, k=1,
                          weight=weight, eps=eps, writes_row=True, strategy=cl.constraints.option(r.name, "auto")))

    def logsumexp(self, mx: Node) -> None:
        """m + log(sum(exp(x - m), -1, keepdim)) with m = amax(x, -1, keepdim)."""
        ix, cl = self.ix, self.cl
        x = mx.inputs[0]
        xs = ix.shape(x)
        dims = mx.attr("dim")
        if not xs or not mx.attr("keepdim") or not dims or len(dims) != 1 or \
                L.norm_dim(dims[0], len(xs)) != len(xs) - 1:
            return
        m = mx.outputs[0].name
        us = ix.users[m]
        if len(us) != 2 or m in ix.graph_outputs:
            return
        sub = next((u for u in us if u.op == A + "sub.Tensor" and u.inputs == (x, m)), None)
        add = next((u for u in us if u.op == A + "add.Tensor" and m in u.inputs and len(u.inputs) == 2), None)
        if sub is None or add is None or (add.attr("alpha") not in (None, 1)) or (sub.attr("alpha") not in (None, 1)):
            return
        chain = []
        t = sub.outputs[0].name
        for op in (A + "exp.default", A + "sum.dim_IntList", A + "log.default"):
            u = ix.only_user(t)
            if u is None or u.op != op or not cl.free(u):
                return
            chain.append(u)
            t = u.outputs[0].name
        sm = chain[1]
        sd = sm.attr("dim")
        if not sm.attr("keepdim") or not sd or len(sd) != 1 or L.norm_dim(sd[0], len(xs)) != len(xs) - 1:
            return
        if t not in add.inputs or ix.only_user(t) is None:
            return
        nodes = [mx.name, sub.name] + [c.name for c in chain] + [add.name]
        if not all(cl.free(ix.nodes[nm]) for nm in nodes) or cl.absorbs_unfused(nodes, anchor=mx.name):
            return
        out = add.outputs[0].name
        cl.claim(RowProto(f"logsumexp_{mx.name}", tuple(nodes), (out,), (x,), op="logsumexp", x=x, out=out, k=1))

    def gelu_tanh(self, th: Node) -> None:
        """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), the GELU of GPT-2 / minGPT,
        becomes one ``gelu(approximate='tanh')`` so that a GEMM epilogue can take it."""
        ix, cl = self.ix, self.cl

        def prod(t: str) -> Node | None:
            n = ix.producer.get(t)
            return n if n is not None and n.name in ix.nodes and cl.free(n) else None

        def scal(n: Node | None, op: str, value: float) -> bool:
            return n is not None and n.op == A + op and len(n.inputs) == 1 and \
                scalar_attr(n, "other") is not None and abs(scalar_attr(n, "other") - value) < 1e-6 and \
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
            if p3 is None or p3.op != A + "pow.Tensor_Scalar" or scalar_attr(p3, "exponent") != 3.0 or p3.inputs[0] != x:
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
        if any(g.name in cl.unfuse for g in group):
            return
        syn = Node(f"{m4.name}_gelu", A + "gelu.default", (x,), (m4.outputs[0],), (("approximate", "tanh"),), m4.source)
        ix.replace_nodes(group, syn)

    # ------------------------------------------------------------------ batch norm

    def batch_norm(self, n: Node) -> None:
        ix, cl = self.ix, self.cl
        a = ix.args(n, ops.args(n.op))
        x = a["input"][1]
        xs = ix.shape(x)
        if len(xs) < 2:
            raise cl.fail(n, "batch norm needs at least 2 dims")
        no_stats = n.op == A + "_native_batch_norm_legit.no_stats"
        training = no_stats or (n.op in (A + "_native_batch_norm_legit_functional.default",
                                         A + "_native_batch_norm_legit.default") and bool(n.attr("training")))
        c = xs[1]
        eps = float(n.attr("eps"))
        for extra in n.outputs[1:]:
            if ix.users.get(extra.name) or extra.name in ix.graph_outputs:
                raise cl.fail(n, "batch norm's saved statistics are used; only the normalised output is supported")
        w = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
        b = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
        if no_stats and xs[0] == 1:
            # Batch statistics of one sample (instance norm, as F.instance_norm calls it): each
            # channel's elements are one row, the group statistics' layout.
            self._group_stats(n, x, w, b, 1, c, 1, eps)
            return
        rm = a["running_mean"][1] if a.get("running_mean") else None
        rv = a["running_var"][1] if a.get("running_var") else None
        bshape = (c,) + (1,) * (len(xs) - 2)
        scale = ix.add_tensor(f"{n.name}_scale", bshape, "float32")
        shift = ix.add_tensor(f"{n.name}_shift", bshape, "float32")
        cl.keep_f32.update((scale, shift))
        ins = tuple(t for t in ((x if training else None), w, b, None if training else rm, None if training else rv)
                    if t)
        phase = "run" if training or any(t not in ix.const for t in ins) else "create"
        cl.claim(BnStatsProto(f"{n.name}_stats", (n.name,), (scale, shift), ins, phase,
                              mode="batch" if training else "running", x=x, weight=w, bias=b, rm=rm, rv=rv, eps=eps,
                              scale=scale, shift=shift))
        # The normalisation itself is elementwise and fuses with what follows; the synthetic
        # node that does it covers the batch-norm node too. In training the statistics task
        # reads x as well: the batch-norm node stays among x's users, so no elementwise group
        # swallows the producer of x (x must be materialised for the statistics).
        syn = Node(f"{n.name}_affine", "stitch.affine_channel", (x, scale, shift), (n.outputs[0],), (), n.source)
        ix.insert_node(syn, [n.name], ix.pos[n.name] + 0.5, takes_from=n.name, take_inputs=[] if training else [x])


    def group_norm(self, n: Node) -> None:
        """native_group_norm(x, w, b, N, C, HxW, G, eps): per-(sample, group) statistics, then the
        per-(sample, channel) affine as an elementwise node that fuses with what follows."""
        ix, cl = self.ix, self.cl
        a = ix.args(n, ops.args(n.op))
        x = a["input"][1]
        xs = ix.shape(x)
        for extra in n.outputs[1:]:
            if ix.users.get(extra.name) or extra.name in ix.graph_outputs:
                raise cl.fail(n, "group norm's mean / rstd outputs are used; only the normalised output is supported")
        groups = int(n.attr("group"))
        if len(xs) < 2 or xs[1] % groups:
            raise cl.fail(n, f"group norm of {list(xs)} in {groups} groups")
        w = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
        b = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
        self._group_stats(n, x, w, b, xs[0], groups, xs[1] // groups, float(n.attr("eps")))

    def _group_stats(self, n: Node, x: str, w: str | None, b: str | None, samples: int, groups: int, cpg: int,
                     eps: float) -> None:
        ix, cl = self.ix, self.cl
        xs = ix.shape(x)
        if ix.spec(x).dtype not in ("float32", "float16", "bfloat16"):
            raise cl.fail(n, f"normalisation of {ix.spec(x).dtype}")
        bshape = (samples, groups * cpg) + (1,) * (len(xs) - 2)
        scale = ix.add_tensor(f"{n.name}_scale", bshape, "float32")
        shift = ix.add_tensor(f"{n.name}_shift", bshape, "float32")
        cl.keep_f32.update((scale, shift))
        ins = tuple(t for t in (x, w, b) if t)
        phase = "create" if all(t in ix.const for t in ins) else "run"
        cl.claim(GroupStatsProto(f"{n.name}_stats", (n.name,), (scale, shift), ins, phase, x=x, weight=w, bias=b,
                                 eps=eps, samples=samples, groups=groups, cpg=cpg, scale=scale, shift=shift))
        # The statistics task reads x too: the norm node stays among x's users (see batch_norm).
        syn = Node(f"{n.name}_affine", "stitch.affine_channel", (x, scale, shift), (n.outputs[0],), (), n.source)
        ix.insert_node(syn, [n.name], ix.pos[n.name] + 0.5, takes_from=n.name, take_inputs=[])


def _storage(policy: str) -> str:
    from ..precision import get

    return get(policy).storage


def match(ix: GraphIndex, cl: Claims, ceil: Ceilings) -> None:
    """Check the graph, then claim the patterns (see the module docstring) into ``cl``."""
    check(ix)
    Matcher(cl, ceil).run()


__all__ = ["check", "match", "Matcher"]
