"""Fused attention through attention.cuh: ``softmax(q kᵀ · scale + mask) v`` in one kernel.

Claim (*match*): the written-out pattern (``Q·Kᵀ``, a positive scale, a mask by ``where``,
softmax, ``·V``) and ``scaled_dot_product_attention`` become one task when the head dim is one the
template is instantiated for (:data:`ATTENTION_HEAD_DIMS`): TF32 tensor cores under tf32,
mma.sync under bf16 / fp16, and under fp32 the exact SIMT kernel unless the cost model finds cuBLAS
SGEMM + softmax cheaper (or a ``strategy`` constraint says which: ``split_tf32`` runs an fp32
attention's products in split TF32, three TF32 products each on tensor cores, about fp32's
accuracy — the arithmetic of PyTorch's memory-efficient fp32 attention; a variant the loop
measures). Otherwise the generic kinds plan it: GEMM (the scale as ``alpha``) + the mask
as an elementwise pass + softmax + GEMM. A mask that
comes from weights is prepared once, at create, and summarised per 64 x 32 cell so that the
kernel skips the key tiles it hides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .. import layout as L
from .. import ops
from ..device import Ceilings
from ..dtypes import SIZES as _SIZES
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from ..ops import EwInstr
from ..precision import get as get_policy
from . import cxx
from .base import ClaimRule, Proto, TaskKind, view_bytes
from .elementwise import EwProto
from .gemm import GemmProto, Operand
from .row import RowProto

A = ops.A


#: Head dims the fused attention template is instantiated for (attention.cuh: AttnHeadDim).
ATTENTION_HEAD_DIMS = (16, 32, 48, 64, 80, 96, 112, 128)
#: Query rows x keys per byte of the mask summary (kAttnMaskBlockQ, kAttnMaskBlockK).
ATTENTION_MASK_CELL = (64, 32)
#: Throughput of the fused attention kernels as a fraction of the policy's dense peak, on H100
#: (benchmarks/templates.md): exact fp32 SIMT 26-31 of 67 TFLOP/s; mma.sync bf16 / fp16 170-225
#: of 790. TF32 (mma.sync m16n8k8) is taken at the 16-bit kernel's fraction, and split TF32 (three
#: TF32 mma per product) at a third of that. Measured since on an H200 (B4 H16 L2048, BENCHMARKS.md):
#: TF32 44-63 TFLOP/s of 495 (0.09-0.13), split TF32 29-40 (about two thirds of TF32's speed, not a
#: third). The table is unchanged until plans made with measured fractions are verified and timed.
ATTENTION_EFFICIENCY = {"fp32": 0.42, "tf32": 0.25, "bf16": 0.25, "fp16": 0.25}
#: cuBLAS GEMM as a fraction of the dense peak (SGEMM on H100: about 50 of 67 TFLOP/s): what the
#: unfused attention's two matrix products run at, in :func:`attention_time`.
GEMM_EFFICIENCY = 0.75


@dataclass(frozen=True)
class AttentionSpec:
    """attention.cuh: o = softmax(q kᵀ * scale + mask) v over [B, H, L, D] views (last
    stride 1). ``mask_kind``: none, bool (nonzero = attend), add_same, add_f32; the mask view
    is broadcast to [B, H, Lq, Lk] (zero strides). ``tf32``: fp32 storage on TF32 tensor cores
    (launch_attention's allow_tf32); ``split_tf32``: fp32 storage, products in split TF32
    (launch_attention_split_tf32: three TF32 mma each, about fp32's accuracy). ``mask_blocks``:
    the mask's summary (an
    :class:`AttentionMaskBlocksSpec` task's output, uint8 [B, H, ⌈Lq/64⌉, ⌈Lk/32⌉] with zero
    strides where the mask broadcasts)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "attention")

    kind: str
    q: View
    k: View
    v: View
    o: View
    batch: int
    heads: int
    lq: int
    lk: int
    head_dim: int
    heads_per_kv: int = 1
    scale: float = 1.0
    causal: bool = False
    causal_offset: int = 0
    mask_kind: str = "none"
    mask: View | None = None
    tf32: bool = False
    mask_blocks: View | None = None
    split_tf32: bool = False

    @property
    def exact_fp32(self) -> bool:
        """fp32 storage on the exact SIMT kernel: the attention ``split_tf32`` is a variant of."""
        return self.q.dtype == "float32" and not self.tf32 and not self.split_tf32


@dataclass(frozen=True)
class AttentionMaskBlocksSpec:
    """attention.cuh's launch_attention_mask_blocks: per cell of 64 query rows x 32 keys of
    ``mask`` (a [B, H, Lq, Lk] view of kind ``mask_kind``, read as ``dtype`` for add_same), one
    byte into ``blocks`` ([B, H, ⌈Lq/64⌉, ⌈Lk/32⌉], zero strides where the mask broadcasts): bit 0
    some element attends, bit 1 some element is masked. Runs at create, on a constant mask."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "attention_mask_blocks")

    kind: str
    mask: View
    mask_kind: str
    dtype: str
    batch: int
    heads: int
    lq: int
    lk: int
    blocks: View


@dataclass(frozen=True)
class AttnProto(Proto):
    """Fused attention: ``k_transposed`` when the pattern multiplies by kᵀ (given as ``k``)."""

    q: str = ""
    k: str = ""
    v: str = ""
    k_transposed: bool = False
    scale: float = 1.0
    out: str = ""
    causal: bool = False
    heads_per_kv: int = 1
    mask: str | None = None
    mask_kind: str = "none"
    policy: str = ""
    split_tf32: bool = False  # the strategy asked for it: split-TF32 products where the policy is fp32


# ---------------------------------------------------------------------- claim


def claim_pattern(cx) -> None:
    """The written-out pattern, found from its softmax."""
    for n in list(cx.ix.g.nodes):
        if n.op == A + "_softmax.default" and cx.free(n):
            _pattern(cx, n)


def claim_sdpa(cx) -> None:
    for n in list(cx.ix.g.nodes):
        if n.op == ops.SDPA and cx.free(n):
            _sdpa(cx, n)


def _neg_inf_const(cx, t: str) -> bool:
    p = cx.ix.producer.get(t)
    if p is None:
        return False
    v = p.scalar("s") if p.op == A + "scalar_tensor.default" else \
        p.scalar("fill_value") if p.op == A + "full.default" else None
    return v is not None and v == -math.inf


def _pattern(cx, sm: Node) -> None:
    ix = cx.ix
    x = sm.inputs[0]
    xs = ix.shape(x)
    if len(xs) < 2 or L.norm_dim(int(sm.attr("dim")), len(xs)) != len(xs) - 1 or sm.attr("half_to_float"):
        return
    covered = [sm.name]
    scale, mask, t = 1.0, None, x
    mm1 = None
    while True:
        p = ix.producer.get(t)
        if p is None or not cx.free(p) or ix.only_user(t) is None:
            return
        if p.op == A + "where.self" and mask is None:
            a = ix.args(p, ops.args(p.op))
            if not all(v and v[0] == "t" for v in a.values()):
                return
            cond, yes, no = a["condition"][1], a["self"][1], a["other"][1]
            if _neg_inf_const(cx, yes):  # where(cond, -inf, x): cond masks
                mask, t, const = (cond, False), no, yes
            elif _neg_inf_const(cx, no):  # where(cond, x, -inf): cond attends
                mask, t, const = (cond, True), yes, no
            else:
                return
            covered.append(p.name)
            cp = ix.producer[const]
            if all(u.name == p.name for u in ix.users[const]) and const not in ix.graph_outputs:
                covered.append(cp.name)
            continue
        if p.op in (A + "mul.Tensor", A + "div.Tensor") and len(p.inputs) == 1:
            s = p.scalar("other")
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
        if u is None or not cx.free(u):
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
    choice = cx.constraints.option(sm.name, "auto")
    fits = d == dv and d in ATTENTION_HEAD_DIMS
    if fits and choice != "unfused" and not cx.absorbs_unfused(covered, anchor=mm1.name) and (
            choice in ("fused", "split_tf32") or not _unfused_attention_cheaper(cx, 
                mm1.name, math.prod(qs[:-2]), qs[-2], kts[-1], d, causal=False, masked=mask is not None,
                policy=cx.policy_of(covered))):
        ins = [q, kt, v]
        mk, kind = None, "none"
        if mask is not None:
            mk, kind = _mask_prep(cx, sm.name, mask[0], mask[1], "bool", covered), "bool"
            ins.append(mk)
        cx.claim(AttnProto(f"attention_{mm1.name}", tuple(covered), (mm2.outputs[0].name,), tuple(ins), q=q, k=kt,
                           v=v, k_transposed=True, scale=scale, out=mm2.outputs[0].name, mask=mk, mask_kind=kind,
                           policy=cx.policy_of(covered), split_tf32=choice == "split_tf32"))
        return
    # No fused template for this head dim (or the unfused plan is cheaper, or asked for): the
    # generic passes plan it as a GEMM (the scale folded into alpha), the mask as an
    # elementwise pass in place, softmax in place, a GEMM.
    if not fits:
        cx.notes.append(f"attention at {mm1.name}: head dim {d} has no fused template "
                        f"({', '.join(map(str, ATTENTION_HEAD_DIMS))}); planned as GEMM + mask + softmax + GEMM")


def split_tf32_changes(params, policy: str) -> bool:
    """Whether the strategy ``split_tf32`` changes the plan of an attention node whose task has
    ``params`` (planned at ``policy``): an exact fp32 attention, or one planned unfused (which only
    fp32 does by cost) — never a TF32 or 16-bit one, already on tensor cores."""
    if isinstance(params, AttentionSpec):
        return params.exact_fp32
    return (getattr(params, "policy", None) or policy) == "fp32"


def _unfused_attention_cheaper(cx, where: str, bh: int, lq: int, lk: int, d: int, *, causal: bool,
                               masked: bool, policy: str) -> bool:
    """Under fp32 only (tf32 and 16-bit policies always fuse: tensor-core kernels): whether
    cuBLAS SGEMM + [mask] + softmax + SGEMM through the score matrix beats the exact SIMT
    kernel by the cost model (:func:`~.cost.attention_time`). A constant mask's sparsity is
    unknown here: the fused kernel is costed dense although it skips the tiles the mask hides."""
    if policy != "fp32" or causal:
        return False
    fused = attention_time("fp32", cx.ceil, bh, lq, lk, d, causal=causal, masked=masked)
    unfused = attention_time("fp32", cx.ceil, bh, lq, lk, d, causal=causal, masked=masked, fused=False)
    if unfused < fused:
        cx.notes.append(f"attention at {where}: the exact fp32 kernel ({fused * 1e6:.0f} us by the cost "
                             f"model) is slower than SGEMM + softmax + SGEMM ({unfused * 1e6:.0f} us); planned unfused")
        return True
    return False


def _mask_prep(cx, anchor: str, cond: str, attend_if_true: bool, kind: str, covered: list[str]) -> str:
    """A task computing the fused attention's mask from ``cond`` (where(cond, -inf, x) masks
    where cond holds: ``attend_if_true`` False): ``bool`` -> nonzero = attend; ``additive`` ->
    0 or -inf in the storage dtype. Runs at create when cond depends on weights only."""
    ix = cx.ix
    shape = ix.shape(cond)
    out = ix.add_tensor(f"{anchor}_mask", shape, "bool" if kind == "bool" else cx.storage)
    root = ix.producer.get(cond)
    nodes: list[str] = []
    if root is not None and ops.kind(root.op) == "elementwise" and cx.free(root) and \
            all(u.name in covered for u in ix.users[cond]) and cond not in ix.graph_outputs:
        nodes = cx.pull_ew_group(root, set(covered), limit=4)
    leaf_cond = cond if not nodes else None
    final = EwInstr("not", ("x",)) if (kind == "bool" and not attend_if_true) else \
        EwInstr("to_bool", ("x",)) if kind == "bool" else \
        EwInstr("where", ("x", "c0", "c1"), (0.0, -math.inf) if attend_if_true else (-math.inf, 0.0))
    ins = (cond,) if leaf_cond else ()
    phase = "create" if cond in ix.const else "run"
    cx.claim(EwProto(f"mask_{anchor}", tuple(nodes), (out,), ins, phase, members=tuple(nodes), root=cond,
                     leaf=leaf_cond, final=final, out_shape=shape))
    return out


def _sdpa(cx, n: Node) -> None:
    ix = cx.ix
    a = ix.args(n, ops.args(ops.SDPA))
    q, k, v = a["query"][1], a["key"][1], a["value"][1]
    mask = a["attn_mask"][1] if a["attn_mask"] and a["attn_mask"][0] == "t" else None
    qs, ks, vs = ix.shape(q), ix.shape(k), ix.shape(v)
    out = n.outputs[0].name
    if len(qs) not in (3, 4) or len(ks) != len(qs) or len(vs) != len(qs):
        raise cx.fail(n, "attention needs 3-D or 4-D query, key and value")
    d = qs[-1]
    scale = n.attr("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    causal = bool(n.attr("is_causal"))
    gqa = bool(n.attr("enable_gqa"))
    hq = qs[-3] if len(qs) == 4 else 1
    hk = ks[-3] if len(ks) == 4 else 1
    if float(n.attr("dropout_p") or 0.0) != 0.0:
        raise cx.fail(n, "attention dropout is not supported")
    if any(ix.spec(z).dtype != "float32" for z in (q, k, v)):
        raise cx.fail(n, "attention on non-float32 tensors")
    policy = cx.policy_of([n.name])
    choice = cx.constraints.option(n.name, "auto")
    fusable = d == vs[-1] and d in ATTENTION_HEAD_DIMS and (hq == hk or (gqa and hq % hk == 0))
    decomposable = not (causal or gqa or hq != hk)
    if fusable and decomposable and (choice == "unfused" or (choice == "auto" and _unfused_attention_cheaper(cx, 
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
                kind = "add_same" if cx.storage == "float32" else "add_f32"
            else:
                raise cx.fail(n, f"attention mask of dtype {md}")
            ins.append(mask)
        cx.claim(AttnProto(f"attention_{n.name}", (n.name,), (out,), tuple(ins), q=q, k=k, v=v, scale=scale,
                           out=out, causal=causal, heads_per_kv=hq // hk, mask=mask, mask_kind=kind, policy=policy,
                           split_tf32=choice == "split_tf32"))
        return
    if not decomposable:
        why = f"head dim {d} has no fused attention template" if d not in ATTENTION_HEAD_DIMS else \
            f"the value's dim {vs[-1]} is not the head dim {d} (the fused template takes one)" \
            if d != vs[-1] else f"{hq} query heads do not group over {hk} key heads"
        raise cx.fail(n, f"{why}, and the decomposed path does not handle is_causal or grouped-query attention "
                         "yet")
    lq, lk = qs[-2], ks[-2]
    batch = qs[:-2]
    scores = ix.add_tensor(f"{n.name}_scores", batch + (lq, lk), "float32")
    probs = ix.add_tensor(f"{n.name}_probs", batch + (lq, lk), "float32")
    cx.claim(GemmProto(f"{n.name}_scores", (n.name,), (scores,), (q, k), a=Operand(q), b=Operand(k, True),
                       alpha=scale, out=scores, policy=policy))
    if mask is not None:
        # The mask as an elementwise pass over the scores (in place); it fuses like any other.
        md = ix.spec(mask).dtype
        if md not in ("bool", "float32"):
            raise cx.fail(n, f"attention mask of dtype {md}")
        masked = ix.add_tensor(f"{n.name}_masked", batch + (lq, lk), "float32")
        op = "stitch.mask_bool" if md == "bool" else "stitch.mask_add"
        syn = Node(f"{n.name}_mask", op, (scores, mask), (ix.spec(masked),), (), n.source)
        ix.insert_node(syn, [n.name], ix.pos[n.name] + 0.25, takes_from=n.name, take_inputs=[mask])
        scores = masked
    # (safe: a fully masked row gives zeros, as PyTorch's attention has it, not softmax's NaN)
    cx.protos.append(RowProto(f"{n.name}_softmax", (n.name,), (probs,), (scores,), op="safe_softmax", x=scores,
                              out=probs, k=1, writes_row=True))
    cx.protos.append(GemmProto(f"{n.name}_pv", (n.name,), (out,), (probs, v), a=Operand(probs), b=Operand(v),
                               out=out, policy=policy))
    if not (d == vs[-1] and d in ATTENTION_HEAD_DIMS):
        cx.notes.append(f"{n.name}: head dim {d} has no fused attention template "
                        f"({', '.join(map(str, ATTENTION_HEAD_DIMS))}); planned as GEMM + softmax + GEMM")


# ---------------------------------------------------------------------- lower


def lower(lw, pr: AttnProto, pre: list) -> None:
    st = lw.storage
    vq = lw.read(pr.q, pre, pr.phase)
    vk = lw.read(pr.k, pre, pr.phase)
    if pr.k_transposed:  # the pattern multiplied by kᵀ: read k through a transpose
        vk = L.transpose(vk, -1, -2)
    vv = lw.read(pr.v, pre, pr.phase)
    names = (pr.q, pr.k, pr.v)

    def four(v: View) -> View:
        return L.unsqueeze(v, 0) if v.ndim == 3 else v

    def fix(v: View, name: str) -> View:
        v4 = four(v)
        if v4.dtype != st or v4.strides[-1] != 1:
            c = lw.copy_contiguous(name, v, pre, pr.phase, why="attention reads rows with unit stride", dtype=st)
            v4 = four(lw.views[c])
        return v4

    q4, k4, v4 = fix(vq, names[0]), fix(vk, names[1]), fix(vv, names[2])
    out_t = pr.out

    def accept(tv: View) -> bool:
        return tv.dtype == st and four(tv).strides[-1] == 1

    vo = lw.out_view(pr, out_t, accept)
    o4 = four(vo)
    B, H, lq, d = q4.shape
    lk = k4.shape[2]
    mask_v, mask_kind = None, pr.mask_kind
    if pr.mask:
        mv = lw.read(pr.mask, pre, pr.phase)
        try:
            mv4 = L.broadcast_to(mv, (B, H, lq, lk))
        except ValueError:
            raise lw.fail(lw.ix.node(pr.nodes[0]), "attention mask does not broadcast to the scores")
        if mask_kind == "bool" and mv4.dtype not in ("bool", "uint8", "int8"):
            raise lw.fail(lw.ix.node(pr.nodes[0]), "boolean attention mask of another dtype")
        if mask_kind in ("add_same", "add_f32"):
            want = st if mask_kind == "add_same" else "float32"
            if mv4.dtype != want:  # a constant mask is cast once, at create
                phase = "create" if lw.buffers[mv.buffer].kind in ("weight", "const") else pr.phase
                c = lw.copy_contiguous(pr.mask, mv, pre, phase, why="additive mask dtype", dtype=want)
                mv4 = L.broadcast_to(lw.views[c], (B, H, lq, lk))
        mask_v = mv4
    blocks_v = None
    if mask_v is not None and lw.buffers[mask_v.buffer].kind in ("weight", "const"):
        blocks_v = _mask_blocks(lw, pr, mask_v, mask_kind, B, H, lq, lk, pre)
    tf32 = get_policy(pr.policy or lw.f.policy).tf32 and st == "float32"
    split = pr.split_tf32 and not tf32 and st == "float32"  # under TF32 the TF32 kernel is both faster and asked for
    spec = AttentionSpec("attention", q4, k4, v4, o4, B, H, lq, lk, d, int(pr.heads_per_kv),
                         float(pr.scale), bool(pr.causal), 0, mask_kind, mask_v,
                         tf32, blocks_v, split)
    lw.add(pr, pr.name, spec, [q4, k4, v4, mask_v, blocks_v], [o4],
              touched=list(pr.ins) + [out_t] + list(names))


def _mask_blocks(lw, pr: AttnProto, mv4: View, kind: str, B: int, H: int, lq: int, lk: int, pre: list) -> View:
    """A create-time task summarising a constant mask per 64 x 32 cell (which key tiles the
    kernel may skip, which it must mask); the summary's view, broadcast like the mask."""
    cq, ck = ATTENTION_MASK_CELL
    nb = B if B > 1 and mv4.strides[0] != 0 else 1
    nh = H if H > 1 and mv4.strides[1] != 0 else 1
    shape = (nb, nh, -(-lq // cq), -(-lk // ck))
    name = lw.alloc.add_tensor(f"{cxx.ident(pr.name)}_mask_blocks", shape, "uint8")
    v = lw.alloc.fresh(name, "uint8", shape, "create")
    lw.views[name] = v
    vb = L.broadcast_to(v, (B, H) + shape[2:])
    spec = AttentionMaskBlocksSpec("attention_mask_blocks", mv4, kind, lw.storage, B, H, lq, lk, vb)
    pre.append(lw.task(f"mask_blocks_{cxx.ident(pr.name)}", (), (mv4.buffer,), (v.buffer,), spec,
                      phase="create", note="which key tiles the constant mask hides (skipped) or cuts (masked)"))
    return vb


# ---------------------------------------------------------------------- cost


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
    esize = float(_SIZES[get_policy(policy).storage])
    mm = 2.0 * bh * lq * lk * d  # one of the two matrix products
    io = esize * bh * 2 * (lq + lk) * d  # q and o; k and v
    if fused:
        kernel = attention_kernel_policy(get_policy(policy).storage, policy == "tf32")
        work = 2 * mm * (causal_fraction(lq, lk) if causal else 1.0)
        return work / (ceil.gemm_peak(kernel) * ATTENTION_EFFICIENCY[kernel]) + io / ceil.bandwidth + ceil.launch_s
    passes = 4 + (2 if masked else 0)
    scores = esize * bh * lq * lk
    return (2 * mm / (ceil.gemm_peak(policy) * GEMM_EFFICIENCY) + (passes * scores + io) / ceil.bandwidth
            + (3 + masked) * ceil.launch_s)


def cost(spec: AttentionSpec, ceil) -> tuple[float, float, float]:
    flops = 4.0 * spec.batch * spec.heads * spec.lq * spec.lk * spec.head_dim
    if spec.causal:
        flops *= causal_fraction(spec.lq, spec.lk, spec.causal_offset)
    kernel = attention_kernel_policy(spec.q.dtype, spec.tf32 or spec.split_tf32)
    peak = ceil.gemm_peak(kernel) * ATTENTION_EFFICIENCY[kernel] / (3 if spec.split_tf32 else 1)
    nbytes = sum(view_bytes(v) for v in (spec.q, spec.k, spec.v, spec.o, spec.mask, spec.mask_blocks))
    return flops, nbytes, peak


def cost_mask_blocks(spec: AttentionMaskBlocksSpec, ceil) -> tuple[float, float, float]:
    n = (spec.batch if spec.blocks.strides[0] else 1) * (spec.heads if spec.blocks.strides[1] else 1) * \
        spec.lq * spec.lk
    return float(n), view_bytes(spec.mask) + view_bytes(spec.blocks), ceil.fp32


# ---------------------------------------------------------------------- interpret


def _mask_cells(m, kind: str):
    """attention.cuh's mask summary of a [b, h, lq, lk] mask (float64 values): per 64 x 32 cell,
    bit 0 some element attends, bit 1 some element is masked, bit 2 some element differs from the
    causal mask (key j attends query i iff j <= i)."""
    import torch

    lq, lk = m.shape[-2:]
    below = torch.ones(lq, lk, dtype=torch.bool, device=m.device).tril()
    if kind == "bool":
        vis, masked, not_causal = m != 0, m == 0, (m != 0) != below
    else:
        vis, masked = m != -math.inf, m != 0
        not_causal = torch.where(below, m != 0, m != -math.inf)
    cq, ck = ATTENTION_MASK_CELL
    nq, nk = -(-lq // cq), -(-lk // ck)

    def cells(x):
        x = torch.nn.functional.pad(x.to(torch.uint8), (0, nk * ck - lk, 0, nq * cq - lq))
        return x.reshape(*x.shape[:2], nq, cq, nk, ck).amax(dim=(3, 5))

    return cells(vis) | (cells(masked) << 1) | (cells(not_causal) << 2)


def interpret_mask_blocks(mem, s: AttentionMaskBlocksSpec) -> None:
    # One summary per batch / head the mask does not broadcast over (zero strides in blocks).
    nb = s.batch if s.blocks.strides[0] else 1
    nh = s.heads if s.blocks.strides[1] else 1
    m = mem.read(s.mask)[:nb, :nh]
    shape = (nb, nh) + s.blocks.shape[2:]
    mem.write(s.blocks, _mask_cells(m, s.mask_kind).double(), shape, s.blocks.strides)


def interpret(mem, a: AttentionSpec) -> None:
    import torch

    q, k, v = mem.read(a.q), mem.read(a.k), mem.read(a.v)
    if a.heads_per_kv > 1:
        k = k.repeat_interleave(a.heads_per_kv, 1)
        v = v.repeat_interleave(a.heads_per_kv, 1)
    s = q @ k.transpose(-1, -2) * a.scale  # float64: TF32 (a.tf32, a.split_tf32) rounding is the kernel's business
    if a.causal:
        i = torch.arange(a.lq, device=s.device)[:, None]
        j = torch.arange(a.lk, device=s.device)[None, :]
        s = s.masked_fill(j > i + a.causal_offset, -math.inf)
    if a.mask is not None:
        m = mem.read(a.mask)
        use = torch.ones_like(s, dtype=torch.bool)
        if a.mask_blocks is not None:
            # As the kernels read the summary: keys of cells without bit 0 are skipped, the mask
            # is read only in cells with bits 1 and 2, and cells with bit 1 alone are masked as
            # the causal mask is (a wrong summary shows up in the result).
            cq, ck = ATTENTION_MASK_CELL
            cells = mem.read(a.mask_blocks).to(torch.int64)
            cells = cells.repeat_interleave(cq, 2).repeat_interleave(ck, 3)[..., : a.lq, : a.lk]
            s = s.masked_fill((cells & 1) == 0, -math.inf)
            i = torch.arange(a.lq, device=s.device)[:, None]
            j = torch.arange(a.lk, device=s.device)[None, :]
            s = s.masked_fill(((cells & 6) == 2) & (j > i), -math.inf)
            use = (cells & 6) == 6
        if a.mask_kind == "bool":
            s = s.masked_fill(use & (m == 0), -math.inf)
        else:
            s = s + torch.where(use, m, torch.zeros((), dtype=torch.float64, device=s.device))
    p = torch.softmax(s, -1)
    p = torch.nan_to_num(p, nan=0.0)  # a row with no visible key gives 0 (attention.cuh)
    mem.write(a.o, p @ v)


# ---------------------------------------------------------------------- render


_MASK = {"none": "None", "bool": "Bool", "add_same": "AddSame", "add_f32": "AddF32"}


def render(t, a: AttentionSpec, n, fn: str) -> tuple[list[str], list[str]]:
    ct = ctype(a.q.dtype)
    lines = [f"  stitch::AttnParams<{ct}> a{{}};",
             f"  a.q = {n('q')};",
             f"  a.k = {n('k')};",
             f"  a.v = {n('v')};",
             f"  a.o = {n('o')};"]
    for nm, v in (("q", a.q), ("k", a.k), ("v", a.v), ("o", a.o)):
        lines.append("  " + " ".join(f"a.{nm}_stride[{i}] = {s};" for i, s in enumerate(v.strides)))
    lines += [f"  a.B = {a.batch}; a.H = {a.heads}; a.Lq = {a.lq}; a.Lk = {a.lk}; a.heads_per_kv = {a.heads_per_kv};",
              f"  a.scale = {cxx.flit(a.scale)};",
              f"  a.causal = {'true' if a.causal else 'false'}; a.causal_offset = {a.causal_offset};",
              f"  a.mask_kind = stitch::AttnMask::{_MASK[a.mask_kind]};"]
    if a.mask is not None:
        lines.append(f"  a.mask = {n('mask')};")
        lines.append("  " + " ".join(f"a.mask_stride[{i}] = {s};" for i, s in enumerate(a.mask.strides)))
    if a.mask_blocks is not None:
        lines.append(f"  a.mask_blocks = {n('mask_blocks')};  // skip the key tiles the mask hides")
        lines.append("  " + " ".join(f"a.mask_blocks_stride[{i}] = {s};" for i, s in enumerate(a.mask_blocks.strides)))
    if a.split_tf32:
        call = f"stitch::launch_attention_split_tf32<{a.head_dim}>(a, stream)"
    else:
        call = f"stitch::launch_attention<{ct}, {a.head_dim}>(a, stream{', /*allow_tf32=*/true' if a.tf32 else ''})"
    lines += [f"  return cuda_check({call}, \"{t.name}\");"]
    return [], lines


def render_mask_blocks(t, a: AttentionMaskBlocksSpec, n, fn: str) -> tuple[list[str], list[str]]:
    ct = ctype(a.dtype)
    return [], [f"  stitch::AttnParams<{ct}> a{{}};",
                f"  a.B = {a.batch}; a.H = {a.heads}; a.Lq = {a.lq}; a.Lk = {a.lk};",
                f"  a.mask_kind = stitch::AttnMask::{_MASK[a.mask_kind]};",
                f"  a.mask = {n('mask')};",
                "  " + " ".join(f"a.mask_stride[{i}] = {s};" for i, s in enumerate(a.mask.strides)),
                "  " + " ".join(f"a.mask_blocks_stride[{i}] = {s};" for i, s in enumerate(a.blocks.strides)),
                f"  return cuda_check(stitch::launch_attention_mask_blocks<{ct}>(a, {n('blocks')}, stream),",
                f'                    "{t.name}");']


ATTENTION = TaskKind("attention", AttentionSpec, "attention_template", cost, interpret, render,
                     lowers=((AttnProto, lower),),
                     claims=(ClaimRule("match", 10, claim_pattern), ClaimRule("match", 11, claim_sdpa)),
                     headers=("stitch/attention.cuh",), writes=frozenset({"o"}), scratch=frozenset())
MASK_BLOCKS = TaskKind("attention_mask_blocks", AttentionMaskBlocksSpec, "attention_template", cost_mask_blocks,
                       interpret_mask_blocks, render_mask_blocks, headers=("stitch/attention.cuh",),
                       writes=frozenset({"blocks"}), scratch=frozenset())

__all__ = ["AttentionSpec", "AttentionMaskBlocksSpec", "AttnProto", "ATTENTION_HEAD_DIMS", "ATTENTION_MASK_CELL",
           "ATTENTION_EFFICIENCY", "GEMM_EFFICIENCY", "attention_time", "causal_fraction", "ATTENTION", "MASK_BLOCKS"]
