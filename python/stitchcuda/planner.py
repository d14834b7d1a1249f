"""Plan: a captured Graph in, an ordered list of fused Tasks out — the deterministic Planner.

The stage in five passes (``_Planner.check``, ``.match``, ``.fuse``, then ``_Layouts``):

1. **check** — every node's operator is one the planner maps (:data:`PLANNER_OPS`), every
   tensor has a dtype the runtime stores; otherwise :class:`PlanError` names each node.
2. **match** — multi-node patterns become one task: attention (``Q·Kᵀ``, scale, causal mask
   by ``where``, softmax, ``·V`` — and ``scaled_dot_product_attention``) to the fused
   attention template when the head dim is a multiple of 16 up to 128 (the mask computed once,
   at create time, when it comes from weights, with a per-tile summary that lets the kernel
   skip what the mask hides: a causal mask held in a buffer costs what ``is_causal`` costs) —
   TF32 tensor cores under tf32, mma.sync under bf16 / fp16, and under fp32 the exact SIMT
   kernel unless the cost model finds cuBLAS SGEMM + softmax cheaper — else GEMM (scale as
   ``alpha``) + the mask as an elementwise pass in place + softmax in place + GEMM; RMS norm written out
   (``x * rsqrt(mean(x²) + eps) * w``) and logsumexp written out (``m + log(sum(exp(x - m)))``)
   to one row reduction each; GPT-2's tanh GELU written out to one ``gelu``; training-mode
   batch norm to a batch-statistics reduction plus an elementwise normalise.
3. **fuse** — row reductions take the unary elementwise ops before them as a prologue hook
   and after them as an epilogue hook; each GEMM (``linear``, ``matmul``, ``addmm``, ``bmm``)
   takes the chain after it: a leading scalar into ``alpha``, a per-column add as the
   cuBLASLt bias, a same-shape add as ``beta·C`` (or a residual op), relu (and, off fp32, the
   tanh GELU) into cuBLASLt's epilogue, the rest (erf-GELU always: cuBLASLt's GELU is the tanh
   form) as the runtime's fused epilogue chain; the remaining elementwise ops are grouped
   into kernels (one output each, at most four inputs, recomputing cheap broadcast values).
4. **place** — views, permutes, slices, splits, squeezes and clones are folded into strided
   layouts (:mod:`.layout`); a task writes straight into a graph output or a ``cat`` slot
   when it can write that layout; a layout no kernel can read becomes a copy task.
5. **schedule** — tasks in dependency order; tasks whose inputs are all weights run once at
   create time; intermediates get offsets in one arena by liveness (256-byte aligned); costs
   (FLOPs, bytes, roofline time against :class:`DeviceCeilings`); whether the program
   captures its run as a CUDA graph.

``plan(graph, policy)`` returns a frozen, JSON-serialisable :class:`Plan`; ``str(plan)`` is a
readable table. The planner never imports PyTorch.
"""

from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence, Union

from . import layout as L
from .device import H100, H200, Ceilings
from . import manifest as mf
from .ir import DTYPE_SIZES, Graph, Node, TensorSpec
from .layout import View

SCHEMA = "stitchcuda.plan/1"
POLICIES = ("fp32", "tf32", "bf16", "fp16")
ARENA_ALIGN = 256
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
#: cuBLASLt / runtime limit on the fused epilogue chain.
MAX_CHAIN = 8
#: A run with at least this many tasks is captured as a CUDA graph (launch-bound otherwise).
GRAPH_MIN_TASKS = 2


# ====================================================================== device ceilings


#: The one ceilings type (:mod:`stitchcuda.device`), under the name the plan has always used.
DeviceCeilings = Ceilings


# ====================================================================== task specs

EwArg = str  # "a<k>": input k, "t<k>": instruction k's result, "c<k>": the instruction's const k


@dataclass(frozen=True)
class EwInstr:
    """One fp32 operation of a generated elementwise expression (see ``EW_OPS``)."""

    op: str
    args: tuple[str, ...]
    consts: tuple[float, ...] = ()


@dataclass(frozen=True)
class EpOp:
    """One op of the runtime's fused epilogue chain: ``st_ep_kind`` name without ``ST_EP_``."""

    kind: str
    a: float = 0.0
    b: float = 0.0


@dataclass(frozen=True)
class GemmSpec:
    """``out[b] = ep(alpha * op(A[b]) @ op(B[b]) + beta * C[b] + bias)`` through st_gemm.

    Row-major conventions of stitchrt.h: A is m x k (stored k x m when trans_a), B is k x n,
    out is m x n with leading dim ldo; strides between batch items (0: broadcast).
    ``epilogue`` is cuBLASLt's (``none``, ``bias``, ``relu``, ``gelu``, ``bias_relu``,
    ``bias_gelu``), ``chain`` the runtime's epilogue ops applied after it, in place.
    """

    kind: str
    policy: str
    m: int
    n: int
    k: int
    batch: int
    a: View
    lda: int
    stride_a: int
    trans_a: bool
    b: View
    ldb: int
    stride_b: int
    trans_b: bool
    out: View
    ldo: int
    stride_out: int
    alpha: float = 1.0
    beta: float = 0.0
    c: View | None = None
    ldc: int = 0
    stride_c: int = 0
    bias: View | None = None
    epilogue: str = "none"
    chain: tuple[EpOp, ...] = ()
    residual: View | None = None
    ldr: int = 0


@dataclass(frozen=True)
class EwSpec:
    """``out = expr(inputs)`` through elementwise.cuh; ``shape`` and the strides are the
    launch layout after dropping size-1 dims and merging contiguous ones (<= 6 dims)."""

    kind: str
    out: View
    inputs: tuple[View, ...]
    instrs: tuple[EwInstr, ...]
    shape: tuple[int, ...]
    out_strides: tuple[int, ...]
    in_strides: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class RowSpec:
    """A row reduction of reduce.cuh over rows x cols (``ldi`` / ``ldo`` leading dims; for a
    per-row result ``ldo`` is the stride between results). ``prologue`` / ``epilogue`` are
    single-input expressions (input ``a0``) applied before / after the reduction."""

    kind: str
    op: str
    x: View
    ldi: int
    out: View
    ldo: int
    rows: int
    cols: int
    weight: View | None = None
    bias: View | None = None
    eps: float = 0.0
    unbiased: bool = False
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class AxisSpec:
    """reduce.cuh's middle-axis reduction: x as [outer, red, inner], out as [outer, inner];
    ``workspace`` (fp32, ``workspace_floats``) lets a long reduced axis split over blocks."""

    kind: str
    op: str
    x: View
    outer: int
    red: int
    inner: int
    in_so: int
    in_sr: int
    in_si: int
    out: View
    out_so: int
    out_si: int
    workspace: View | None = None
    workspace_floats: int = 0
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class AttentionSpec:
    """attention.cuh: o = softmax(q kᵀ * scale + mask) v over [B, H, L, D] views (last
    stride 1). ``mask_kind``: none, bool (nonzero = attend), add_same, add_f32; the mask view
    is broadcast to [B, H, Lq, Lk] (zero strides). ``tf32``: fp32 storage on TF32 tensor cores
    (launch_attention's allow_tf32). ``mask_blocks``: the mask's summary (an
    :class:`AttentionMaskBlocksSpec` task's output, uint8 [B, H, ⌈Lq/64⌉, ⌈Lk/32⌉] with zero
    strides where the mask broadcasts)."""

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


@dataclass(frozen=True)
class AttentionMaskBlocksSpec:
    """attention.cuh's launch_attention_mask_blocks: per cell of 64 query rows x 32 keys of
    ``mask`` (a [B, H, Lq, Lk] view of kind ``mask_kind``, read as ``dtype`` for add_same), one
    byte into ``blocks`` ([B, H, ⌈Lq/64⌉, ⌈Lk/32⌉], zero strides where the mask broadcasts): bit 0
    some element attends, bit 1 some element is masked. Runs at create, on a constant mask."""

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
class CopyItem:
    """dst = src (with dtype conversion) over ``shape``, strides after coalescing."""

    src: View
    dst: View
    shape: tuple[int, ...]
    src_strides: tuple[int, ...]
    dst_strides: tuple[int, ...]


@dataclass(frozen=True)
class CopySpec:
    """One or more strided copies (elementwise.cuh's launch_strided_copy)."""

    kind: str
    items: tuple[CopyItem, ...]


@dataclass(frozen=True)
class BnStatsSpec:
    """Per-channel batch statistics of x viewed as [n, c, s] (strides sn, sc, ss), turned into
    ``scale = weight * rsqrt(var + eps)`` and ``shift = bias - mean * scale`` (fp32, c each).
    ``mode`` ``batch``: biased variance over n and s (training-mode batch norm), computed by a
    generated two-pass Welford kernel with ``splits`` partial results in ``workspace``;
    ``running``: from the running statistics (eval mode)."""

    kind: str
    mode: str
    x: View | None
    n: int
    c: int
    s: int
    sn: int
    sc: int
    ss: int
    weight: View | None
    bias: View | None
    running_mean: View | None
    running_var: View | None
    eps: float
    scale: View
    shift: View
    workspace: View | None = None
    splits: int = 1


TaskSpec = Union[GemmSpec, EwSpec, RowSpec, AxisSpec, AttentionSpec, AttentionMaskBlocksSpec, CopySpec,
                 BnStatsSpec]
_SPEC_TYPES = {t.__name__: t for t in typing.get_args(TaskSpec)}
_SPEC_KINDS = {"gemm": GemmSpec, "elementwise": EwSpec, "row": RowSpec, "axis": AxisSpec,
               "attention": AttentionSpec, "attention_mask_blocks": AttentionMaskBlocksSpec, "copy": CopySpec,
               "bn_stats": BnStatsSpec}


@dataclass(frozen=True)
class Buffer:
    """Device memory a task reads or writes.

    ``kind``: ``input`` / ``output`` (the caller's, by ``index``), ``weight`` (uploaded at
    create, converted to ``dtype`` from ``source_dtype`` when they differ), ``const``
    (computed at create from weights, per instance), ``arena`` (an intermediate at byte
    ``offset`` of the stream's arena).
    """

    name: str
    kind: str
    dtype: str
    shape: tuple[int, ...]
    index: int = -1
    offset: int = 0
    source: str = ""
    source_dtype: str = ""

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


@dataclass(frozen=True)
class Task:
    """One unit of generated work: a strategy, the reference nodes it covers, the buffers it
    reads and writes, its spec (``params``) and cost-model numbers. ``phase`` ``create``:
    runs once when the program is created (its inputs are weights only)."""

    name: str
    strategy: str
    covers: tuple[str, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    params: TaskSpec
    phase: str = "run"
    flops: int = 0
    bytes: int = 0
    est_time_s: float = 0.0
    bound: str = ""
    note: str = ""


@dataclass(frozen=True)
class NodeCost:
    """Cost-model numbers of one reference node: FLOPs, fewest bytes moved, roofline time."""

    node: str
    op: str
    flops: int
    bytes: int
    time_s: float
    bound: str


@dataclass(frozen=True)
class IOSpec:
    """An input, output or weight of the program, as the manifest lists it."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    tensor: str = ""


@dataclass(frozen=True)
class Plan:
    name: str
    policy: str
    ceilings: DeviceCeilings
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    weights: tuple[IOSpec, ...]
    buffers: tuple[Buffer, ...]
    tasks: tuple[Task, ...]
    node_costs: tuple[NodeCost, ...]
    arena_bytes: int
    cuda_graph: bool
    notes: tuple[str, ...] = ()

    # -------------------------------------------------------------- queries

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"plan {self.name} has no buffer {name!r}")

    @property
    def run_tasks(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.phase == "run")

    @property
    def create_tasks(self) -> tuple[Task, ...]:
        return tuple(t for t in self.tasks if t.phase == "create")

    @property
    def est_time_s(self) -> float:
        """Roofline time of the run plus launch overhead (one launch when graph-captured)."""
        t = sum(x.est_time_s for x in self.run_tasks)
        launches = 1 if self.cuda_graph else len(self.run_tasks)
        return t + launches * self.ceilings.launch_s

    def manifest_tasks(self) -> tuple[mf.Task, ...]:
        return tuple(mf.Task(t.name, t.strategy, t.covers, int(t.flops), int(t.bytes)) for t in self.tasks)

    def reference_ops(self) -> tuple[mf.ReferenceOp, ...]:
        return tuple(mf.ReferenceOp(c.node, c.op, int(c.flops), int(c.bytes)) for c in self.node_costs)

    # -------------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        d = _encode(self)
        d["schema"] = SCHEMA
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} plan (schema={d.get('schema')!r})")
        return _decode(cls, {k: v for k, v in d.items() if k != "schema"})

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))

    # -------------------------------------------------------------- text

    def __str__(self) -> str:
        c = self.ceilings
        head = (f"plan {self.name}: policy {self.policy}, {len(self.tasks)} task(s) "
                f"({len(self.create_tasks)} at create), arena {_fmt_bytes(self.arena_bytes)}, "
                f"CUDA graph {'yes' if self.cuda_graph else 'no'}; ceilings {c.name} "
                f"{c.bandwidth / 1e12:.1f} TB/s, {c.gemm_peak(self.policy) / 1e12:.0f} TFLOP/s GEMM")
        rows = [("#", "task", "strategy", "covers", "GFLOP", "MB", "est us", "bound")]
        for i, t in enumerate(self.tasks, 1):
            covers = ", ".join(t.covers)
            if len(covers) > 48:
                covers = covers[:45] + "..."
            name = t.name + (" [create]" if t.phase == "create" else "")
            rows.append((str(i), name, t.strategy, covers, f"{t.flops / 1e9:.3f}", f"{t.bytes / 1e6:.1f}",
                         f"{t.est_time_s * 1e6:.1f}", t.bound))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        right = {0, 4, 5, 6}
        lines = [head]
        for j, r in enumerate(rows):
            lines.append("  " + "  ".join(x.rjust(w) if i in right else x.ljust(w)
                                          for i, (x, w) in enumerate(zip(r, widths))).rstrip())
            if j == 0:
                lines.append("  " + "  ".join("-" * w for w in widths))
        lines.append(f"  estimated run time {self.est_time_s * 1e6:.1f} us "
                     f"(roofline + {'one graph launch' if self.cuda_graph else 'one launch per task'})")
        for n in self.notes:
            lines.append(f"  note: {n}")
        return "\n".join(lines)


class PlanError(ValueError):
    """The graph uses what the planner cannot map; ``unsupported`` lists (op, node, where, why)."""

    def __init__(self, name: str, unsupported: Sequence[tuple[str, str, str, str]]):
        self.name = name
        self.unsupported = list(unsupported)
        lines = [f"reference {name!r} uses what stitchcuda does not support yet (there is no PyTorch fallback):"]
        seen = set()
        for op, node, where, why in self.unsupported:
            text = f"{op} at {where or node}" + (f" ({why})" if why else "")
            if text not in seen:
                seen.add(text)
                lines.append("  " + text)
        super().__init__("\n".join(lines))


# ====================================================================== operator tables

A = "aten."
VIEW_OPS = frozenset(A + s for s in (
    "view.default", "_unsafe_view.default", "reshape.default", "unsqueeze.default", "squeeze.dims",
    "squeeze.dim", "squeeze.default", "permute.default", "transpose.int", "t.default", "slice.Tensor",
    "select.int", "split_with_sizes.default", "split.Tensor", "expand.default", "clone.default",
    "alias.default", "detach.default", "lift_fresh_copy.default", "contiguous.default"))
#: Layout ops that leave a tensor's value and shape as they are.
TRANSPARENT_OPS = frozenset(A + s for s in ("clone.default", "alias.default", "detach.default",
                                            "lift_fresh_copy.default", "contiguous.default"))
GEMM_OPS = frozenset(A + s for s in ("linear.default", "matmul.default", "mm.default", "bmm.default", "addmm.default"))
ROW_OPS = frozenset(A + s for s in ("_softmax.default", "_log_softmax.default", "logsumexp.default",
                                    "native_layer_norm.default", "sum.dim_IntList", "sum.default", "mean.dim",
                                    "mean.default", "amax.default", "amin.default", "var.correction"))
BN_OPS = frozenset(A + s for s in ("_native_batch_norm_legit_functional.default",
                                   "_native_batch_norm_legit_no_training.default"))
SDPA_OP = A + "scaled_dot_product_attention.default"
CAT_OP = A + "cat.default"

# Elementwise ATen ops: op -> tensor argument names in schema order.
_EW_ARGS: dict[str, tuple[str, ...]] = {}
for _n in ("add.Tensor", "sub.Tensor", "mul.Tensor", "div.Tensor", "div.Tensor_mode", "pow.Tensor_Tensor",
           "maximum.default", "minimum.default", "eq.Tensor", "ne.Tensor", "lt.Tensor", "le.Tensor", "gt.Tensor",
           "ge.Tensor", "logical_and.default", "logical_or.default", "bitwise_and.Tensor", "bitwise_or.Tensor"):
    _EW_ARGS[A + _n] = ("self", "other")
for _n in ("neg.default", "rsqrt.default", "sqrt.default", "exp.default", "log.default", "tanh.default",
           "relu.default", "sigmoid.default", "silu.default", "abs.default", "reciprocal.default", "erf.default",
           "sin.default", "cos.default", "log1p.default", "expm1.default", "floor.default", "ceil.default",
           "round.default", "sign.default", "trunc.default", "pow.Tensor_Scalar", "leaky_relu.default",
           "gelu.default", "hardtanh.default", "clamp.default", "clamp_min.default", "clamp_max.default",
           "elu.default", "softplus.default", "hardswish.default", "hardsigmoid.default", "mish.default",
           "eq.Scalar", "ne.Scalar", "lt.Scalar", "le.Scalar", "gt.Scalar", "ge.Scalar", "bitwise_not.default",
           "logical_not.default", "_to_copy.default", "rsub.Scalar", "add.Scalar", "sub.Scalar", "mul.Scalar",
           "div.Scalar", "relu6.default"):
    _EW_ARGS[A + _n] = ("self",)
_EW_ARGS[A + "where.self"] = ("condition", "self", "other")
_EW_ARGS[A + "scalar_tensor.default"] = ()
_EW_ARGS[A + "full.default"] = ()
_EW_ARGS["stitch.affine_channel"] = ("input", "scale", "shift")
_EW_ARGS["stitch.mask_bool"] = ("scores", "mask")  # where(mask, scores, -inf)
_EW_ARGS["stitch.mask_add"] = ("scores", "mask")   # scores + mask
EW_OPS = frozenset(_EW_ARGS)

_GEMM_ARGS = {A + "linear.default": ("input", "weight", "bias"), A + "matmul.default": ("self", "other"),
              A + "mm.default": ("self", "mat2"), A + "bmm.default": ("self", "mat2"),
              A + "addmm.default": ("self", "mat1", "mat2")}
_OTHER_ARGS = {A + "native_layer_norm.default": ("input", "weight", "bias"),
               A + "_native_batch_norm_legit_functional.default": ("input", "weight", "bias", "running_mean", "running_var"),
               A + "_native_batch_norm_legit_no_training.default": ("input", "weight", "bias", "running_mean", "running_var"),
               SDPA_OP: ("query", "key", "value", "attn_mask")}

#: Every operator the planner maps to a task (the frontend's SUPPORTED_OPS is a subset).
PLANNER_OPS = frozenset(op for op in VIEW_OPS | GEMM_OPS | ROW_OPS | BN_OPS | EW_OPS | {SDPA_OP, CAT_OP}
                        if op.startswith(A))

#: Generated elementwise ops (fp32 math) -> arity; the coder renders each.
EW_OPS_ARITY = {
    "copy": 1, "neg": 1, "rsqrt": 1, "sqrt": 1, "exp": 1, "log": 1, "tanh": 1, "relu": 1, "sigmoid": 1, "silu": 1,
    "abs": 1, "reciprocal": 1, "erf": 1, "sin": 1, "cos": 1, "log1p": 1, "expm1": 1, "floor": 1, "ceil": 1,
    "round": 1, "sign": 1, "trunc": 1, "square": 1, "cube": 1, "gelu_erf": 1, "gelu_tanh": 1, "hardswish": 1,
    "hardsigmoid": 1, "mish": 1, "not": 1, "to_bool": 1, "to_half": 1, "to_bf16": 1, "relu6": 1,
    "add": 2, "sub": 2, "mul": 2, "div": 2, "pow": 2, "max": 2, "min": 2, "eq": 2, "ne": 2, "lt": 2, "le": 2,
    "gt": 2, "ge": 2, "and": 2, "or": 2, "leaky_relu": 2, "elu": 2, "softplus": 3, "clamp": 3, "where": 3,
    "const": 1, "div_trunc": 2, "div_floor": 2,
}

_FLOAT_DTYPES = ("float32", "float16", "bfloat16")
_STORAGE = {"fp32": "float32", "tf32": "float32", "bf16": "bfloat16", "fp16": "float16"}


# ====================================================================== entry point


def plan(graph: Graph, policy: str = "fp32", ceilings: DeviceCeilings | None = None, *,
         cuda_graph: bool | None = None) -> Plan:
    """Plan ``graph`` under precision ``policy`` (fp32, tf32, bf16, fp16).

    ``ceilings`` (default :data:`H100`) drive the cost model only. ``cuda_graph`` forces the
    graph-capture flag; by default a run of :data:`GRAPH_MIN_TASKS` or more tasks is captured.
    Raises :class:`PlanError` for operators or patterns the planner cannot map.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown precision policy {policy!r}; expected one of {', '.join(POLICIES)}")
    return _Planner(graph, policy, ceilings or H100, cuda_graph).run()


# ====================================================================== planning


@dataclass
class _Proto:
    """A task before layouts are known: what it computes, over which graph tensors."""

    kind: str                      # gemm, ew, row, axis, attn, bn_stats, cat, sdpa_scores, sdpa_probs
    nodes: list[str]               # covered reference nodes
    outs: list[str]                # graph (or synthetic) tensors it materialises
    ins: list[str]                 # graph tensors it reads
    info: dict[str, Any] = field(default_factory=dict)
    name: str = ""
    phase: str = "run"


def _scalar_attr(node: Node, key: str) -> float | None:
    v = node.attr(key)
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return float(v)
    return None


class _Planner:
    def __init__(self, graph: Graph, policy: str, ceilings: DeviceCeilings, cuda_graph: bool | None):
        self.g = graph
        self.policy = policy
        self.ceil = ceilings
        self.force_graph = cuda_graph
        self.storage = _STORAGE[policy]
        self.specs: dict[str, TensorSpec] = {}
        for s in graph.inputs + graph.weights:
            self.specs[s.name] = s
        self.nodes: dict[str, Node] = {}
        self.gnodes: dict[str, Node] = {n.name: n for n in graph.nodes}
        self.producer: dict[str, Node] = {}
        self.users: dict[str, list[Node]] = defaultdict(list)
        self.pos: dict[str, float] = {}
        for i, n in enumerate(graph.nodes):
            self._add_node(n, float(i))
        self.inputs = {s.name for s in graph.inputs}
        self.weights = {s.name for s in graph.weights}
        self.graph_outputs = set(graph.outputs)
        self.claimed: dict[str, int] = {}
        self.protos: list[_Proto] = []
        self.synthetic_cover: dict[str, list[str]] = {}  # synthetic node -> the reference nodes it stands for
        self.notes: list[str] = []
        self.keep_f32: set[str] = set()
        self.const: set[str] = set(self.weights)
        for n in graph.nodes:
            if all(i in self.const for i in n.inputs):
                self.const.update(o.name for o in n.outputs)

    def _add_node(self, n: Node, pos: float) -> None:
        self.nodes[n.name] = n
        self.pos[n.name] = pos
        for o in n.outputs:
            self.specs[o.name] = o
            self.producer[o.name] = n
        for i in dict.fromkeys(n.inputs):
            self.users[i].append(n)

    # ------------------------------------------------------------------ helpers

    def spec(self, t: str) -> TensorSpec:
        return self.specs[t]

    def shape(self, t: str) -> tuple[int, ...]:
        return self.specs[t].shape

    def args(self, node: Node, names: Sequence[str]) -> dict[str, tuple[str, Any] | None]:
        """Schema tensor arguments: name -> ("t", tensor) | ("s", scalar) | None (absent)."""
        out: dict[str, tuple[str, Any] | None] = {}
        pending = list(node.inputs)
        for nm in names:
            if node.has_attr(nm):
                v = node.attr(nm)
                out[nm] = None if v is None else ("s", v)
            elif pending:
                out[nm] = ("t", pending.pop(0))
            else:
                out[nm] = None
        return out

    def tensor_arg(self, node: Node, names: Sequence[str], key: str) -> str | None:
        a = self.args(node, names).get(key)
        return a[1] if a and a[0] == "t" else None

    def only_user(self, t: str) -> Node | None:
        us = self.users.get(t, [])
        if len(us) != 1 or t in self.graph_outputs:
            return None
        return us[0]

    def free(self, node: Node) -> bool:
        return node.name not in self.claimed

    def claim(self, proto: _Proto) -> int:
        idx = len(self.protos)
        self.protos.append(proto)
        for n in proto.nodes:
            if n in self.nodes:
                self.claimed[n] = idx
        return idx

    def expand(self, names: Iterable[str]) -> list[str]:
        """Node names with each synthetic node replaced by the reference nodes it stands for."""
        out: list[str] = []
        for x in names:
            for y in self.synthetic_cover.get(x, [x]):
                if y not in out:
                    out.append(y)
        return out

    def replace_nodes(self, old: Sequence[Node], new: Node) -> None:
        """Put synthetic ``new`` (one output, a reference tensor) in place of the nodes ``old``."""
        gone = {o.name for o in old}
        for o in old:
            del self.nodes[o.name]
            for t in o.inputs:
                self.users[t] = [u for u in self.users[t] if u.name not in gone]
        self.synthetic_cover[new.name] = sorted(gone, key=lambda nm: self.pos[nm])
        self.nodes[new.name] = new
        self.pos[new.name] = max(self.pos[nm] for nm in gone)
        self.producer[new.outputs[0].name] = new
        for t in dict.fromkeys(new.inputs):
            self.users[t].append(new)

    def add_synthetic(self, name: str, shape: Sequence[int], dtype: str) -> str:
        base, k = name, 1
        while name in self.specs:
            name, k = f"{base}_{k}", k + 1
        self.specs[name] = TensorSpec(name, tuple(shape), dtype)
        return name

    def where(self, node_name: str) -> str:
        n = self.nodes.get(node_name)
        return n.source if n is not None else ""

    def node(self, name: str) -> Node:
        return self.nodes.get(name) or self.gnodes[name]

    def fail(self, node: Node, why: str) -> PlanError:
        return PlanError(self.g.name, [(node.op, node.name, node.source, why)])

    def storage_of(self, dtype: str) -> str:
        return self.storage if dtype == "float32" else dtype

    def tensor_storage(self, t: str) -> str:
        """Storage dtype of a tensor: the policy's for float32, except fp32 statistics."""
        return "float32" if t in self.keep_f32 else self.storage_of(self.spec(t).dtype)

    # ------------------------------------------------------------------ pass 1: check

    def check(self) -> None:
        bad = []
        for n in self.g.nodes:
            if n.op not in PLANNER_OPS:
                bad.append((n.op, n.name, n.source, "no template or generator maps it yet"))
                continue
            for o in n.outputs:
                if o.dtype in ("float64", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2"):
                    bad.append((n.op, n.name, n.source, f"{o.dtype} tensors are not supported by the runtime"))
        for s in self.g.inputs + self.g.weights:
            if s.dtype not in mf.DTYPE_SIZES:
                bad.append((f"{s.dtype} tensor", s.name, s.name, f"{s.dtype} cannot cross the program ABI"))
        if bad:
            raise PlanError(self.g.name, bad)

    # ------------------------------------------------------------------ pass 2: match

    def match(self) -> None:
        for n in list(self.g.nodes):
            if n.op == A + "_softmax.default" and self.free(n):
                self._match_attention(n)
        for n in list(self.g.nodes):
            if n.op == SDPA_OP and self.free(n):
                self._plan_sdpa(n)
        for n in list(self.g.nodes):
            if n.op in (A + "rsqrt.default", A + "sqrt.default") and self.free(n):
                self._match_rms(n)
        for n in list(self.g.nodes):
            if n.op == A + "amax.default" and self.free(n):
                self._match_logsumexp(n)
        for n in list(self.g.nodes):
            if n.op in BN_OPS and self.free(n):
                self._plan_batch_norm(n)
        for n in list(self.g.nodes):
            if n.op == A + "tanh.default" and n.name in self.nodes and self.free(n):
                self._match_gelu_tanh(n)

    def _neg_inf_const(self, t: str) -> bool:
        p = self.producer.get(t)
        if p is None:
            return False
        v = _scalar_attr(p, "s") if p.op == A + "scalar_tensor.default" else \
            _scalar_attr(p, "fill_value") if p.op == A + "full.default" else None
        return v is not None and v == -math.inf

    def _match_attention(self, sm: Node) -> None:
        x = sm.inputs[0]
        xs = self.shape(x)
        if len(xs) < 2 or L.norm_dim(int(sm.attr("dim")), len(xs)) != len(xs) - 1 or sm.attr("half_to_float"):
            return
        covered = [sm.name]
        scale, mask, t = 1.0, None, x
        mm1 = None
        while True:
            p = self.producer.get(t)
            if p is None or not self.free(p) or self.only_user(t) is None:
                return
            if p.op == A + "where.self" and mask is None:
                a = self.args(p, _EW_ARGS[p.op])
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
                cp = self.producer[const]
                if all(u.name == p.name for u in self.users[const]) and const not in self.graph_outputs:
                    covered.append(cp.name)
                continue
            if p.op in (A + "mul.Tensor", A + "div.Tensor") and len(p.inputs) == 1:
                s = _scalar_attr(p, "other")
                if s is None or s <= 0:
                    return
                scale = scale * s if p.op.startswith(A + "mul") else scale / s
                covered.append(p.name)
                t = p.inputs[0]
                continue
            if p.op in TRANSPARENT_OPS:
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
            u = self.only_user(t)
            if u is None or not self.free(u):
                return
            if u.op in TRANSPARENT_OPS:
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
        qs, kts, vs = self.shape(q), self.shape(kt), self.shape(v)
        if not (len(qs) == len(kts) == len(vs) >= 3 and len(qs) <= 4):
            return
        if qs[:-2] != kts[:-2] or qs[:-2] != vs[:-2] or kts[-2] != qs[-1] or vs[-2] != kts[-1]:
            return
        d, dv = qs[-1], vs[-1]
        if any(self.spec(z).dtype != "float32" for z in (q, kt, v)):
            return
        if mask is not None:
            cond = mask[0]
            try:
                L.broadcast_shapes(self.shape(cond), xs)
            except ValueError:
                return
            if L.broadcast_shapes(self.shape(cond), xs) != xs:
                return
        if d == dv and d in ATTENTION_HEAD_DIMS and not self._unfused_attention_cheaper(
                mm1.name, math.prod(qs[:-2]), qs[-2], kts[-1], d, causal=False, masked=mask is not None):
            info = dict(q=q, kt=kt, v=v, scale=scale, out=mm2.outputs[0].name, causal=False)
            ins = [q, kt, v]
            if mask is not None:
                m = self._mask_prep(sm.name, mask[0], mask[1], "bool", covered)
                info["mask"], info["mask_kind"] = m, "bool"
                ins.append(m)
            self.claim(_Proto("attn", covered, [mm2.outputs[0].name], ins, info, name=f"attention_{mm1.name}"))
            return
        # No fused template for this head dim (or, under fp32, the unfused plan is cheaper): the
        # generic path plans it as a GEMM (the scale folded into alpha), the mask as an
        # elementwise pass in place, softmax in place, a GEMM.
        if not (d == dv and d in ATTENTION_HEAD_DIMS):
            self.notes.append(f"attention at {mm1.name}: head dim {d} has no fused template "
                              f"({', '.join(map(str, ATTENTION_HEAD_DIMS))}); planned as GEMM + mask + softmax + GEMM")

    def _unfused_attention_cheaper(self, where: str, bh: int, lq: int, lk: int, d: int, *, causal: bool,
                                   masked: bool) -> bool:
        """Under fp32 only (tf32 and 16-bit policies always fuse: tensor-core kernels): whether
        cuBLAS SGEMM + [mask] + softmax + SGEMM through the score matrix beats the exact SIMT
        kernel by the cost model (:func:`attention_time`). A constant mask's sparsity is unknown
        here: the fused kernel is costed dense although it skips the tiles the mask hides."""
        if self.policy != "fp32" or causal:
            return False
        fused = attention_time("fp32", self.ceil, bh, lq, lk, d, causal=causal, masked=masked)
        unfused = attention_time("fp32", self.ceil, bh, lq, lk, d, causal=causal, masked=masked, fused=False)
        if unfused < fused:
            self.notes.append(f"attention at {where}: the exact fp32 kernel ({fused * 1e6:.0f} us by the cost model) "
                              f"is slower than SGEMM + softmax + SGEMM ({unfused * 1e6:.0f} us); planned unfused")
            return True
        return False

    def _mask_prep(self, anchor: str, cond: str, attend_if_true: bool, kind: str, covered: list[str]) -> str:
        """A task computing the fused attention's mask from ``cond`` (where(cond, -inf, x) masks
        where cond holds: ``attend_if_true`` False): ``bool`` -> nonzero = attend; ``additive`` ->
        0 or -inf in the storage dtype. Runs at create when cond depends on weights only."""
        shape = self.shape(cond)
        out = self.add_synthetic(f"{anchor}_mask", shape, "bool" if kind == "bool" else self.storage)
        root = self.producer.get(cond)
        nodes: list[str] = []
        if root is not None and root.op in EW_OPS and self.free(root) and \
                all(u.name in covered for u in self.users[cond]) and cond not in self.graph_outputs:
            nodes = self._pull_ew_group(root, set(covered), limit=4)
        leaf_cond = cond if not nodes else None
        final = EwInstr("not", ("x",)) if (kind == "bool" and not attend_if_true) else \
            EwInstr("to_bool", ("x",)) if kind == "bool" else \
            EwInstr("where", ("x", "c0", "c1"), (0.0, -math.inf) if attend_if_true else (-math.inf, 0.0))
        info = dict(nodes=nodes, root=cond, leaf=leaf_cond, final=final, out_shape=shape)
        ins = [cond] if leaf_cond else []
        phase = "create" if cond in self.const else "run"
        self.claim(_Proto("ew", nodes, [out], ins, info, name=f"mask_{anchor}", phase=phase))
        return out

    def _plan_sdpa(self, n: Node) -> None:
        a = self.args(n, _OTHER_ARGS[SDPA_OP])
        q, k, v = a["query"][1], a["key"][1], a["value"][1]
        mask = a["attn_mask"][1] if a["attn_mask"] and a["attn_mask"][0] == "t" else None
        qs, ks, vs = self.shape(q), self.shape(k), self.shape(v)
        out = n.outputs[0].name
        if len(qs) not in (3, 4) or len(ks) != len(qs) or len(vs) != len(qs):
            raise self.fail(n, "attention needs 3-D or 4-D query, key and value")
        d = qs[-1]
        scale = n.attr("scale")
        scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
        causal = bool(n.attr("is_causal"))
        gqa = bool(n.attr("enable_gqa"))
        hq = qs[-3] if len(qs) == 4 else 1
        hk = ks[-3] if len(ks) == 4 else 1
        if float(n.attr("dropout_p") or 0.0) != 0.0:
            raise self.fail(n, "attention dropout is not supported")
        if any(self.spec(z).dtype != "float32" for z in (q, k, v)):
            raise self.fail(n, "attention on non-float32 tensors")
        fusable = d == vs[-1] and d in ATTENTION_HEAD_DIMS and (hq == hk or (gqa and hq % hk == 0))
        decomposable = not (causal or gqa or hq != hk)
        if fusable and decomposable and self._unfused_attention_cheaper(
                n.name, math.prod(qs[:-2]), qs[-2], ks[-2], d, causal=False, masked=mask is not None):
            fusable = False
        if fusable:
            info = dict(q=q, k=k, v=v, scale=scale, out=out, causal=causal, heads_per_kv=hq // hk)
            ins = [q, k, v]
            if mask is not None:
                md = self.spec(mask).dtype
                if md == "bool":
                    info["mask"], info["mask_kind"] = mask, "bool"
                elif md == "float32":
                    info["mask"], info["mask_kind"] = mask, "add_same" if self.storage == "float32" else "add_f32"
                else:
                    raise self.fail(n, f"attention mask of dtype {md}")
                ins.append(mask)
            self.claim(_Proto("attn", [n.name], [out], ins, info, name=f"attention_{n.name}"))
            return
        if not decomposable:
            raise self.fail(n, f"head dim {d} has no fused attention template and the decomposed path "
                               "does not handle is_causal or grouped-query attention yet")
        lq, lk = qs[-2], ks[-2]
        batch = qs[:-2]
        scores = self.add_synthetic(f"{n.name}_scores", batch + (lq, lk), "float32")
        probs = self.add_synthetic(f"{n.name}_probs", batch + (lq, lk), "float32")
        info = dict(a=q, b=("T", k), bias=None, alpha=scale, steps=[], out=scores, beta=0.0, c=None)
        self.protos.append(_Proto("gemm", [n.name], [scores], [q, k], info, name=f"{n.name}_scores"))
        self.claimed[n.name] = len(self.protos) - 1
        if mask is not None:
            # The mask as an elementwise pass over the scores (in place); it fuses like any other.
            md = self.spec(mask).dtype
            if md not in ("bool", "float32"):
                raise self.fail(n, f"attention mask of dtype {md}")
            masked = self.add_synthetic(f"{n.name}_masked", batch + (lq, lk), "float32")
            op = "stitch.mask_bool" if md == "bool" else "stitch.mask_add"
            syn = Node(f"{n.name}_mask", op, (scores, mask), (self.spec(masked),), (), n.source)
            self.synthetic_cover[syn.name] = [n.name]
            self.nodes[syn.name] = syn
            self.pos[syn.name] = self.pos[n.name] + 0.25
            self.producer[masked] = syn
            self.users[scores].append(syn)
            self.users[mask] = [u for u in self.users[mask] if u.name != n.name] + [syn]
            scores = masked
        self.protos.append(_Proto("row", [n.name], [probs], [scores],
                                  dict(op="softmax", x=scores, out=probs, k=1, pro=[], epi=[]),
                                  name=f"{n.name}_softmax"))
        self.protos.append(_Proto("gemm", [n.name], [out], [probs, v],
                                  dict(a=probs, b=v, bias=None, alpha=1.0, steps=[], out=out, beta=0.0, c=None),
                                  name=f"{n.name}_pv"))
        if not (d == vs[-1] and d in ATTENTION_HEAD_DIMS):
            self.notes.append(f"{n.name}: head dim {d} has no fused attention template "
                              f"({', '.join(map(str, ATTENTION_HEAD_DIMS))}); planned as GEMM + softmax + GEMM")

    def _match_rms(self, r: Node) -> None:
        """x * rsqrt(mean(x^2, -1, keepdim) + eps) [* w]  (also x / sqrt(...))."""
        add = self.producer.get(r.inputs[0])
        if add is None or add.op != A + "add.Tensor" or len(add.inputs) != 1 or not self.free(add):
            return
        eps = _scalar_attr(add, "other")
        if eps is None or self.only_user(add.outputs[0].name) is None:
            return
        mean = self.producer.get(add.inputs[0])
        if mean is None or mean.op != A + "mean.dim" or not mean.attr("keepdim") or not self.free(mean):
            return
        if self.only_user(mean.outputs[0].name) is None:
            return
        sq = self.producer.get(mean.inputs[0])
        if sq is None or not self.free(sq) or self.only_user(sq.outputs[0].name) is None:
            return
        if sq.op == A + "pow.Tensor_Scalar" and _scalar_attr(sq, "exponent") == 2.0:
            x = sq.inputs[0]
        elif sq.op == A + "mul.Tensor" and len(sq.inputs) == 2 and sq.inputs[0] == sq.inputs[1]:
            x = sq.inputs[0]
        else:
            return
        xs = self.shape(x)
        dims = mean.attr("dim")
        if not xs or dims is None or len(dims) != 1 or L.norm_dim(dims[0], len(xs)) != len(xs) - 1:
            return
        u = self.only_user(r.outputs[0].name)
        if u is None or not self.free(u):
            return
        want = A + "mul.Tensor" if r.op == A + "rsqrt.default" else A + "div.Tensor"
        if u.op != want or len(u.inputs) != 2 or x not in u.inputs or r.outputs[0].name not in u.inputs:
            return
        if u.op == A + "div.Tensor" and u.inputs[0] != x:
            return
        if self.shape(u.outputs[0].name) != xs:
            return
        nodes = [sq.name, mean.name, add.name, r.name, u.name]
        out = u.outputs[0].name
        weight = None
        w = self.only_user(out)
        if w is not None and self.free(w) and w.op == A + "mul.Tensor" and len(w.inputs) == 2:
            other = w.inputs[1] if w.inputs[0] == out else w.inputs[0]
            if other != out and self.shape(other) in ((xs[-1],), (1,) * (len(xs) - 1) + (xs[-1],)) and \
                    self.shape(w.outputs[0].name) == xs and self.spec(other).dtype == "float32":
                weight = other
                nodes.append(w.name)
                out = w.outputs[0].name
        ins = [x] + ([weight] if weight else [])
        self.claim(_Proto("row", nodes, [out], ins, dict(op="rms_norm", x=x, out=out, k=1, weight=weight, eps=eps,
                                                         pro=[], epi=[]), name=f"rms_norm_{r.name}"))

    def _match_logsumexp(self, mx: Node) -> None:
        """m + log(sum(exp(x - m), -1, keepdim)) with m = amax(x, -1, keepdim)."""
        x = mx.inputs[0]
        xs = self.shape(x)
        dims = mx.attr("dim")
        if not xs or not mx.attr("keepdim") or not dims or len(dims) != 1 or \
                L.norm_dim(dims[0], len(xs)) != len(xs) - 1:
            return
        m = mx.outputs[0].name
        us = self.users[m]
        if len(us) != 2 or m in self.graph_outputs:
            return
        sub = next((u for u in us if u.op == A + "sub.Tensor" and u.inputs == (x, m)), None)
        add = next((u for u in us if u.op == A + "add.Tensor" and m in u.inputs and len(u.inputs) == 2), None)
        if sub is None or add is None or (add.attr("alpha") not in (None, 1)) or (sub.attr("alpha") not in (None, 1)):
            return
        chain = []
        t = sub.outputs[0].name
        for op in (A + "exp.default", A + "sum.dim_IntList", A + "log.default"):
            u = self.only_user(t)
            if u is None or u.op != op or not self.free(u):
                return
            chain.append(u)
            t = u.outputs[0].name
        sm = chain[1]
        sd = sm.attr("dim")
        if not sm.attr("keepdim") or not sd or len(sd) != 1 or L.norm_dim(sd[0], len(xs)) != len(xs) - 1:
            return
        if t not in add.inputs or self.only_user(t) is None:
            return
        nodes = [mx.name, sub.name] + [c.name for c in chain] + [add.name]
        if not all(self.free(self.nodes[nm]) for nm in nodes):
            return
        out = add.outputs[0].name
        self.claim(_Proto("row", nodes, [out], [x], dict(op="logsumexp", x=x, out=out, k=1, pro=[], epi=[]),
                          name=f"logsumexp_{mx.name}"))

    def _match_gelu_tanh(self, th: Node) -> None:
        """0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3))), the GELU of GPT-2 / minGPT,
        becomes one ``gelu(approximate='tanh')`` so that a GEMM epilogue can take it."""

        def prod(t: str) -> Node | None:
            n = self.producer.get(t)
            return n if n is not None and n.name in self.nodes and self.free(n) else None

        def scal(n: Node | None, op: str, value: float) -> bool:
            return n is not None and n.op == A + op and len(n.inputs) == 1 and \
                _scalar_attr(n, "other") is not None and abs(_scalar_attr(n, "other") - value) < 1e-6 and \
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
            if p3 is None or p3.op != A + "pow.Tensor_Scalar" or _scalar_attr(p3, "exponent") != 3.0 or p3.inputs[0] != x:
                continue
            break
        else:
            return
        u = self.only_user(th.outputs[0].name)
        if not scal(u, "add.Tensor", 1.0):
            return
        m4 = self.only_user(u.outputs[0].name)
        if m4 is None or m4.op != A + "mul.Tensor" or len(m4.inputs) != 2 or u.outputs[0].name not in m4.inputs:
            return
        half = prod(m4.inputs[0] if m4.inputs[1] == u.outputs[0].name else m4.inputs[1])
        if not scal(half, "mul.Tensor", 0.5) or half.inputs[0] != x:
            return
        group = [half, p3, m2, a1, m3, th, u, m4]
        inner = {g.name for g in group}
        for g in group[:-1]:
            if any(us.name not in inner for us in self.users[g.outputs[0].name]) or g.outputs[0].name in self.graph_outputs:
                return
        if self.shape(x) != m4.outputs[0].shape or self.spec(x).dtype != "float32":
            return
        syn = Node(f"{m4.name}_gelu", A + "gelu.default", (x,), (m4.outputs[0],), (("approximate", "tanh"),), m4.source)
        self.replace_nodes(group, syn)

    def _plan_batch_norm(self, n: Node) -> None:
        a = self.args(n, _OTHER_ARGS[n.op])
        x = a["input"][1]
        xs = self.shape(x)
        if len(xs) < 2:
            raise self.fail(n, "batch norm needs at least 2 dims")
        training = n.op.endswith("functional.default") and bool(n.attr("training"))
        c = xs[1]
        eps = float(n.attr("eps"))
        for extra in n.outputs[1:]:
            if self.users.get(extra.name) or extra.name in self.graph_outputs:
                raise self.fail(n, "batch norm's saved statistics are used; only the normalised output is supported")
        w = a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None
        b = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
        rm, rv = a["running_mean"][1], a["running_var"][1]
        bshape = (c,) + (1,) * (len(xs) - 2)
        scale = self.add_synthetic(f"{n.name}_scale", bshape, "float32")
        shift = self.add_synthetic(f"{n.name}_shift", bshape, "float32")
        self.keep_f32.update((scale, shift))
        ins = [t for t in ((x if training else None), w, b, None if training else rm, None if training else rv) if t]
        info = dict(mode="batch" if training else "running", x=x, weight=w, bias=b, rm=rm, rv=rv, eps=eps,
                    scale=scale, shift=shift)
        phase = "run" if training or any(t not in self.const for t in ins) else "create"
        self.claim(_Proto("bn_stats", [n.name], [scale, shift], ins, info, name=f"{n.name}_stats", phase=phase))
        # The normalisation itself is elementwise and fuses with what follows; the synthetic
        # node that does it covers the batch-norm node too.
        syn = Node(f"{n.name}_affine", "stitch.affine_channel", (x, scale, shift), (n.outputs[0],), (), n.source)
        self.synthetic_cover[syn.name] = [n.name]
        self.nodes[syn.name] = syn
        self.pos[syn.name] = self.pos[n.name] + 0.5
        self.producer[n.outputs[0].name] = syn
        for i in dict.fromkeys(syn.inputs):
            self.users[i].append(syn)
        self.users[x] = [u for u in self.users[x] if u.name != n.name]

    # ------------------------------------------------------------------ pass 3: fuse

    def hookable(self, node: Node) -> bool:
        """An elementwise node with exactly one tensor operand and a float result."""
        if node.op not in EW_OPS or node.op in (A + "where.self", A + "scalar_tensor.default", A + "full.default"):
            return False
        if node.op.startswith("stitch.") or len(node.inputs) != 1:
            return False
        out = node.outputs[0]
        if out.dtype != "float32" or self.spec(node.inputs[0]).dtype != "float32":
            return False
        return self.shape(node.inputs[0]) == out.shape

    def fuse(self) -> None:
        for n in list(self.g.nodes):
            if n.op in ROW_OPS and self.free(n):
                self._plan_reduce(n)
        for n in list(self.g.nodes):
            if n.op in GEMM_OPS and self.free(n):
                self._plan_gemm(n)
        for n in list(self.g.nodes):
            if n.op == CAT_OP and self.free(n):
                dim = L.norm_dim(int(n.attr("dim") or 0), len(n.outputs[0].shape))
                self.claim(_Proto("cat", [n.name], [n.outputs[0].name], list(n.inputs),
                                  dict(dim=dim, parts=list(n.inputs)), name=n.name))
        self._group_elementwise()

    def _plan_reduce(self, n: Node) -> None:
        x = n.inputs[0]
        xs = self.shape(x)
        out = n.outputs[0].name
        op = n.op
        info: dict[str, Any] = dict(x=x, out=out, pro=[], epi=[])
        if op in (A + "_softmax.default", A + "_log_softmax.default"):
            if n.attr("half_to_float"):
                raise self.fail(n, "half_to_float softmax")
            info["op"] = "softmax" if "_softmax" in op and "log" not in op else "log_softmax"
            dims = [L.norm_dim(int(n.attr("dim")), len(xs))] if xs else []
            writes_row = True
        elif op == A + "native_layer_norm.default":
            a = self.args(n, _OTHER_ARGS[op])
            k = len(n.attr("normalized_shape"))
            for extra in n.outputs[1:]:
                if self.users.get(extra.name) or extra.name in self.graph_outputs:
                    raise self.fail(n, "layer norm's mean / rstd outputs are used; only the normalised output is supported")
            out = n.outputs[0].name
            info.update(op="layer_norm", out=out, eps=float(n.attr("eps")),
                        weight=a["weight"][1] if a["weight"] and a["weight"][0] == "t" else None,
                        bias=a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None)
            dims = list(range(len(xs) - k, len(xs)))
            writes_row = True
        else:
            writes_row = False
            base = op.split(".")[1]
            dims = n.attr("dim")
            if op in (A + "sum.default", A + "mean.default") or dims is None or dims == ():
                dims = list(range(len(xs)))
            dims = sorted({L.norm_dim(int(d), len(xs)) for d in dims}) if xs else []
            info["op"] = {"sum": "sum", "mean": "mean", "amax": "max", "amin": "min", "logsumexp": "logsumexp",
                          "var": "var"}[base]
            if base == "var":
                corr = n.attr("correction")
                corr = 1.0 if corr is None else float(corr)
                info["correction"] = corr
            if n.attr("dtype") not in (None,):
                raise self.fail(n, "reductions with a dtype argument")
        if self.spec(x).dtype not in _FLOAT_DTYPES:
            raise self.fail(n, f"reduction over {self.spec(x).dtype}")
        nodes = [n.name]
        ins = [x]
        for key in ("weight", "bias"):
            if info.get(key):
                ins.append(info[key])
        # Unary elementwise ops right before the reduction become its prologue hook.
        pro = []
        t = x
        while True:
            p = self.producer.get(t)
            if p is None or not self.free(p) or not self.hookable(p) or self.only_user(t) is None:
                break
            pro.append(p)
            t = p.inputs[0]
        pro.reverse()
        if pro:
            info["pro"] = [p.name for p in pro]
            info["x"] = x = t
            ins[0] = x
            nodes = [p.name for p in pro] + nodes
        # ... and those right after it its epilogue hook.
        t = out
        while True:
            u = self.only_user(t)
            if u is None or not self.free(u) or not self.hookable(u):
                break
            info["epi"].append(u.name)
            nodes.append(u.name)
            t = u.outputs[0].name
        info["out"] = t
        nd = len(xs)
        trailing = dims == list(range(nd - len(dims), nd))
        if not dims:
            # A reduction over no dims (or of a 0-d tensor) is a copy through the hooks.
            info["k"] = 0
            self.claim(_Proto("row", nodes, [t], ins, info, name=self._name(nodes)))
            return
        if trailing:
            info["k"] = len(dims)
            self.claim(_Proto("row", nodes, [t], ins, info, name=self._name(nodes)))
            return
        contiguous_run = dims == list(range(dims[0], dims[-1] + 1))
        if not writes_row and info["op"] in ("sum", "mean", "max", "min") and contiguous_run:
            info.update(d0=dims[0], d1=dims[-1] + 1)
            self.claim(_Proto("axis", nodes, [t], ins, info, name=self._name(nodes)))
            return
        # Otherwise move the reduced dims last with a copy, reduce rows, and (for ops that write
        # a row) move them back.
        perm = [d for d in range(nd) if d not in dims] + dims
        info.update(k=len(dims), perm=perm, writes_row=writes_row)
        self.claim(_Proto("row", nodes, [t], ins, info, name=self._name(nodes)))

    def _gemm_operands(self, n: Node) -> tuple[Any, Any, str | None, float]:
        if n.op == A + "linear.default":
            a = self.args(n, _GEMM_ARGS[n.op])
            bias = a["bias"][1] if a["bias"] and a["bias"][0] == "t" else None
            return a["input"][1], ("T", a["weight"][1]), bias, 1.0
        if n.op == A + "addmm.default":
            a = self.args(n, _GEMM_ARGS[n.op])
            if float(n.attr("beta", 1)) != 1.0:
                raise self.fail(n, "addmm with beta != 1")
            bias = a["self"][1]
            if len(self.shape(bias)) not in (1, 2) or self.shape(bias)[-1] != self.shape(n.outputs[0].name)[-1] or \
                    math.prod(self.shape(bias)) != self.shape(bias)[-1]:
                raise self.fail(n, "addmm whose added matrix is not a per-column bias")
            return a["mat1"][1], a["mat2"][1], bias, float(n.attr("alpha", 1))
        return n.inputs[0], n.inputs[1], None, 1.0

    def _plan_gemm(self, n: Node) -> None:
        a, b, bias, alpha = self._gemm_operands(n)
        out = n.outputs[0].name
        if self.spec(out).dtype != "float32":
            raise self.fail(n, f"GEMM on {self.spec(out).dtype} tensors (policies store float32 as fp32/tf32/bf16/fp16)")
        os_ = self.shape(out)
        ncols = os_[-1] if os_ else 1
        nodes = [n.name]
        steps: list[tuple] = []
        has_bias = bias is not None
        residual = False
        n_chain = 0
        t = out
        while True:
            u = self.only_user(t)
            if u is None or not self.free(u):
                break
            if u.op in TRANSPARENT_OPS:
                nodes.append(u.name)
                t = u.outputs[0].name
                continue
            if u.op not in EW_OPS or self.shape(u.outputs[0].name) != self.shape(t):
                break
            step = self._chain_step(u, t, ncols, has_bias, residual)
            if step is None:
                break
            if step[0] == "op":
                if n_chain >= MAX_CHAIN:
                    break
                n_chain += 1
            elif step[0] == "scale":
                n_chain += 1  # may fold into alpha; counted conservatively
            elif step[0] == "bias":
                has_bias = True
            elif step[0] == "residual":
                residual = True
                n_chain += 1
            if n_chain > MAX_CHAIN:
                break
            steps.append(step)
            nodes.append(u.name)
            t = u.outputs[0].name
        ins = [x for x in (a if isinstance(a, str) else a[1], b if isinstance(b, str) else b[1], bias) if x]
        for s in steps:
            if s[0] in ("bias", "residual"):
                ins.append(s[1])
        info = dict(a=a, b=b, bias=bias, alpha=alpha, steps=steps, out=t, beta=0.0, c=None)
        self.claim(_Proto("gemm", nodes, [t], ins, info, name=self._name(nodes)))

    def _chain_step(self, u: Node, cur: str, ncols: int, has_bias: bool, residual: bool) -> tuple | None:
        """How consumer ``u`` of the GEMM's running result ``cur`` joins its epilogue, or None."""
        op = u.op.removeprefix(A)
        if u.outputs[0].dtype != "float32":
            return None
        if len(u.inputs) == 1 and u.inputs[0] == cur:
            s = _scalar_attr(u, "other")
            alpha = _scalar_attr(u, "alpha")
            alpha = 1.0 if alpha is None else alpha
            if op == "mul.Tensor" and s is not None:
                return ("scale", s)
            if op == "div.Tensor" and s is not None:
                return ("div", s)
            if op == "add.Tensor" and s is not None:
                return ("op", EpOp("ADD_SCALAR", alpha * s))
            if op == "sub.Tensor" and s is not None:
                return ("op", EpOp("ADD_SCALAR", -alpha * s))
            if op == "neg.default":
                return ("op", EpOp("SCALE", -1.0))
            if op == "relu.default":
                return ("op", EpOp("RELU"))
            if op == "leaky_relu.default":
                return ("op", EpOp("LEAKY_RELU", float(u.attr("negative_slope", 0.01))))
            if op == "gelu.default":
                return ("op", EpOp("GELU_TANH" if u.attr("approximate") == "tanh" else "GELU_ERF"))
            if op == "tanh.default":
                return ("op", EpOp("TANH"))
            if op == "sigmoid.default":
                return ("op", EpOp("SIGMOID"))
            if op == "silu.default":
                return ("op", EpOp("SILU"))
            if op == "mish.default":
                return ("op", EpOp("MISH"))
            if op == "abs.default":
                return ("op", EpOp("ABS"))
            if op == "exp.default":
                return ("op", EpOp("EXP"))
            if op == "hardswish.default":
                return ("op", EpOp("HARDSWISH"))
            if op == "pow.Tensor_Scalar" and _scalar_attr(u, "exponent") == 2.0:
                return ("op", EpOp("SQUARE"))
            if op in ("hardtanh.default", "clamp.default"):
                lo = u.attr("min_val", -1.0) if op.startswith("hardtanh") else u.attr("min")
                hi = u.attr("max_val", 1.0) if op.startswith("hardtanh") else u.attr("max")
                return ("op", EpOp("CLAMP", -math.inf if lo is None else float(lo), math.inf if hi is None else float(hi)))
            if op == "elu.default" and float(u.attr("scale", 1)) == 1.0 and float(u.attr("input_scale", 1)) == 1.0:
                return ("op", EpOp("ELU", float(u.attr("alpha", 1.0))))
            if op == "softplus.default" and float(u.attr("beta", 1)) == 1.0 and float(u.attr("threshold", 20)) == 20.0:
                return ("op", EpOp("SOFTPLUS"))
            return None
        if op in ("add.Tensor", "sub.Tensor") and len(u.inputs) == 2 and u.inputs[0] != u.inputs[1]:
            alpha = float(u.attr("alpha", 1) or 1)
            first = u.inputs[0] == cur
            other = u.inputs[1] if first else u.inputs[0]
            if self.spec(other).dtype != "float32":
                return None
            if op == "sub.Tensor" and not first:
                return None
            if not first and alpha != 1.0:
                return None
            coef = (-alpha if op == "sub.Tensor" else alpha) if first else 1.0
            os_ = self.shape(other)
            if math.prod(os_) == ncols and os_ and os_[-1] == ncols and coef == 1.0 and not has_bias:
                return ("bias", other)
            if os_ == self.shape(cur) and not residual:
                return ("residual", other, coef)
        return None

    def _name(self, nodes: Sequence[str]) -> str:
        compute = [x for x in nodes if x in self.nodes and self.nodes[x].op not in VIEW_OPS] or list(nodes)
        compute = list(dict.fromkeys(self.expand(compute)))
        if len(compute) <= 3:
            return "_".join(compute)
        return f"{compute[0]}__{compute[-1]}"

    def _pull_ew_group(self, root: Node, outside_ok: set[str], limit: int) -> list[str]:
        """Elementwise nodes feeding ``root`` that no one else needs, root included, in order.
        ``outside_ok``: node names whose use of a tensor does not count as another user."""
        members = {root.name}
        order = [root]
        changed = True
        while changed:
            changed = False
            for m in list(order):
                for t in dict.fromkeys(m.inputs):
                    p = self.producer.get(t)
                    if p is None or p.name in members or p.op not in EW_OPS or not self.free(p):
                        continue
                    if t in self.graph_outputs or len(p.outputs) != 1:
                        continue
                    if not all(u.name in members or u.name in outside_ok for u in self.users[t]):
                        continue
                    trial = members | {p.name}
                    if len(self._leaves(trial)) > limit:
                        continue
                    members.add(p.name)
                    order.append(p)
                    changed = True
        return sorted(members, key=lambda nm: self.pos[nm])

    def _leaves(self, members: set[str]) -> list[str]:
        produced = {o.name for m in members for o in self.nodes[m].outputs}
        leaves = []
        for m in sorted(members, key=lambda nm: self.pos[nm]):
            for t in self.nodes[m].inputs:
                if t not in produced and t not in leaves:
                    leaves.append(t)
        return leaves

    def _group_elementwise(self) -> None:
        ew = [n for n in self.nodes.values() if n.op in EW_OPS and self.free(n)]
        for n in sorted(ew, key=lambda x: -self.pos[x.name]):
            if not self.free(n):
                continue
            nodes = self._pull_ew_group(n, set(), limit=4)
            out = n.outputs[0].name
            leaves = self._leaves(set(nodes))
            info = dict(nodes=nodes, root=out, leaf=None, final=None, out_shape=self.shape(out))
            phase = "create" if out in self.const and leaves else "run"
            if not leaves:
                phase = "create" if out not in self.graph_outputs else "run"
            covers = self.expand(nodes)
            self.claim(_Proto("ew", covers, [out], leaves, info, name=self._name(nodes), phase=phase))
            for x in nodes:
                self.claimed[x] = len(self.protos) - 1

    # ------------------------------------------------------------------ run

    def run(self) -> Plan:
        self.check()
        self.match()
        self.fuse()
        return _Layouts(self).build()


# ====================================================================== layouts and specs


class _Layouts:
    """Pass 4 and 5: views for every tensor, specs per task, arena, costs."""

    def __init__(self, p: _Planner):
        self.p = p
        self.g = p.g
        self.policy = p.policy
        self.storage = p.storage
        self.buffers: dict[str, Buffer] = {}
        self.views: dict[str, View] = {}
        self.target: dict[str, View] = {}
        self.materialized: dict[str, int] = {}  # tensor -> proto index
        self.tasks: list[Task] = []
        self.copies: dict[str, str] = {}  # view-failed tensor -> its contiguous copy
        self.touch: dict[int, set[str]] = defaultdict(set)  # task index -> tensors it touches
        self.const_count = 0
        self.target_from: dict[str, str] = {}  # tensor -> the downstream tensor its target came from
        self._chain_ends: set[str] | None = None
        self.cats_in_place: list[tuple[str, list[str]]] = []  # (cat node, parts) written in their slots

    # ------------------------------------------------------------------ buffers

    def _new_buffer(self, name: str, kind: str, dtype: str, shape: Sequence[int], **kw: Any) -> Buffer:
        b = Buffer(name, kind, dtype, tuple(shape), **kw)
        self.buffers[name] = b
        return b

    def _fresh(self, tensor: str, dtype: str, shape: Sequence[int], phase: str) -> View:
        safe = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in tensor)
        if phase == "create":
            name = f"c{self.const_count}_{safe}"
            b = self._new_buffer(name, "const", dtype, shape, index=self.const_count, source=tensor)
            self.const_count += 1
        else:
            name = f"t_{safe}"
            k = 1
            while name in self.buffers:
                name, k = f"t_{safe}_{k}", k + 1
            b = self._new_buffer(name, "arena", dtype, shape, source=tensor)
        return L.contiguous(b.name, b.shape, dtype)

    # ------------------------------------------------------------------ build

    def build(self) -> Plan:
        p, g = self.p, self.g
        inputs, outputs, weights = [], [], []
        used_names: set[str] = set()
        for i, s in enumerate(g.inputs):
            self._new_buffer(f"in{i}", "input", s.dtype, s.shape, index=i, source=s.name)
            self.views[s.name] = L.contiguous(f"in{i}", s.shape, s.dtype)
            inputs.append(IOSpec(s.name, s.dtype, s.shape, s.name))
            used_names.add(s.name)
        for i, s in enumerate(g.weights):
            dt = p.storage_of(s.dtype)
            self._new_buffer(f"w{i}", "weight", dt, s.shape, index=i, source=s.name,
                             source_dtype=s.dtype if dt != s.dtype else "")
            self.views[s.name] = L.contiguous(f"w{i}", s.shape, dt)
            weights.append(IOSpec(s.name, s.dtype, s.shape, s.name))
            used_names.add(s.name)
        for i, t in enumerate(g.outputs):
            s = g.spec(t)
            name = t if t not in used_names else f"output{i}"
            while name in used_names:
                name += "_"
            used_names.add(name)
            self._new_buffer(f"out{i}", "output", s.dtype, s.shape, index=i, source=t)
            outputs.append(IOSpec(name, s.dtype, s.shape, t))
        for idx, pr in enumerate(p.protos):
            for o in pr.outs:
                self.materialized[o] = idx
        self._place_targets()
        order = self._order()
        self._last_reads(order)
        for rank, idx in enumerate(order):
            self.rank = rank
            self._emit(idx)
        self._emit_output_copies()
        tasks = self._cover_views(self.tasks)
        tasks = self._finish(tasks)
        arena = self._arena(tasks)
        used = {b for t in tasks for b in t.inputs + t.outputs}
        buffers = tuple(self.buffers[n] for n in self.buffers
                        if self.buffers[n].kind in ("input", "output", "weight") or n in used)
        buffers = tuple(arena.get(b.name, b) for b in buffers)
        arena_bytes = max((b.offset + _align(b.nbytes) for b in buffers if b.kind == "arena"), default=0)
        run_tasks = [t for t in tasks if t.phase == "run"]
        cuda_graph = p.force_graph if p.force_graph is not None else len(run_tasks) >= GRAPH_MIN_TASKS
        node_costs = tuple(self._node_cost(n) for n in g.nodes)
        notes = list(dict.fromkeys(p.notes))
        if cuda_graph:
            notes.append("the run is captured as a CUDA graph on its second call with the same stream and "
                         "buffers, and replayed after that")
        return Plan(name=g.name, policy=self.policy, ceilings=p.ceil, inputs=tuple(inputs),
                    outputs=tuple(outputs), weights=tuple(weights), buffers=buffers, tasks=tuple(tasks),
                    node_costs=node_costs, arena_bytes=arena_bytes, cuda_graph=bool(cuda_graph),
                    notes=tuple(notes))

    # ------------------------------------------------------------------ placement targets

    def _place_targets(self) -> None:
        """Where a task could write its result so that no copy is needed: a graph output's
        buffer, a cat slot, traced back through the layout ops between them."""
        p, g = self.p, self.g
        done: set[str] = set()
        for i, t in enumerate(g.outputs):
            if t in done or t in p.inputs or t in p.weights:
                continue
            done.add(t)
            self.target[t] = L.contiguous(f"out{i}", g.spec(t).shape, g.spec(t).dtype)
        for n in reversed(g.nodes):
            if n.op == CAT_OP and n.name in p.claimed:
                out = n.outputs[0].name
                if out not in self.target:
                    if p.protos[p.claimed[n.name]].phase != "run":
                        continue
                    # The cat's own buffer, so that its parts can be written into their slots.
                    s = p.spec(out)
                    self.target[out] = self._fresh(out, p.tensor_storage(out), s.shape, "run")
                tv = self.target[out]
                dim = L.norm_dim(int(n.attr("dim") or 0), len(tv.shape))
                off = 0
                counts = defaultdict(int)
                for x in n.inputs:
                    counts[x] += 1
                for x in n.inputs:
                    size = p.shape(x)[dim] if p.shape(x) else 1
                    if counts[x] == 1 and x not in self.target and x not in p.inputs and x not in p.weights:
                        self.target[x] = L.slice_(tv, dim, off, off + size)
                        self.target_from[x] = out
                    off += size
                continue
            if n.op not in VIEW_OPS or n.op in (A + "split_with_sizes.default", A + "split.Tensor"):
                continue
            y = n.outputs[0].name
            x = n.inputs[0]
            if y not in self.target and n.op == A + "clone.default" and n.attr("memory_format") == "contiguous_format" \
                    and y in self._materialisable_chain_ends():
                # .contiguous(): let the producer write the contiguous layout directly.
                s = p.spec(y)
                self.target[y] = self._fresh(y, p.storage_of(s.dtype), s.shape, "run")
            if y not in self.target or x in self.target or x in p.inputs or x in p.weights:
                continue
            inv = self._inverse(n, self.target[y])
            if inv is not None:
                self.target[x] = inv
                self.target_from[x] = y

    def _materialisable_chain_ends(self) -> set[str]:
        """Clone outputs whose layout-op chain reaches back to a task's result (not an input or
        weight, which would need a copy anyway)."""
        if self._chain_ends is None:
            p = self.p
            ends = set()
            for n in self.g.nodes:
                if n.op == A + "clone.default":
                    x = n.inputs[0]
                    while x not in self.materialized and x not in p.inputs and x not in p.weights:
                        pn = p.producer.get(x)
                        if pn is None or pn.op not in VIEW_OPS:
                            break
                        x = pn.inputs[0]
                    if x in self.materialized and p.protos[self.materialized[x]].phase == "run":
                        ends.add(n.outputs[0].name)
            self._chain_ends = ends
        return self._chain_ends

    def _inverse(self, n: Node, vy: View) -> View | None:
        op = n.op
        xs = self.p.shape(n.inputs[0])
        if op in TRANSPARENT_OPS:
            return vy
        if op == A + "permute.default":
            return L.permute(vy, L.inverse_permutation(n.attr("dims")))
        if op == A + "transpose.int":
            return L.transpose(vy, int(n.attr("dim0")), int(n.attr("dim1")))
        if op == A + "t.default":
            return L.transpose(vy, 0, 1) if vy.ndim == 2 else vy
        if op in (A + "view.default", A + "_unsafe_view.default", A + "reshape.default"):
            return L.reshape(vy, xs)
        if op in (A + "unsqueeze.default", A + "squeeze.dims", A + "squeeze.dim", A + "squeeze.default"):
            return L.reshape(vy, xs)  # only size-1 dims differ: always expressible
        return None

    # ------------------------------------------------------------------ forward views

    def view_of(self, t: str, pre: list[Task], phase: str) -> View:
        """The layout of tensor ``t``: materialised tensors have one; a layout op's result is
        its input's layout transformed, or — when strides cannot express it — that of a
        contiguous copy of the input made by a task appended to ``pre``."""
        if t in self.views:
            return self.views[t]
        p = self.p
        n = p.producer.get(t)
        if n is None or n.op not in VIEW_OPS:
            raise AssertionError(f"tensor {t} is used before a task produced it")
        x = n.inputs[0]
        vx = self.view_of(x, pre, phase)
        v = self._forward(n, t, vx)
        if v is None:
            c = self.copies.get(x)
            if c is None:
                c = self._copy_contiguous(x, vx, pre, phase, why=f"{n.name} needs {x} contiguous")
                self.copies[x] = c
            v = self._forward(n, t, self.views[c])
            assert v is not None, f"{n.op} of a contiguous tensor must be a view"
        self.views[t] = v
        return v

    def _forward(self, n: Node, t: str, vx: View) -> View | None:
        op = n.op
        ys = self.p.shape(t)
        if op in TRANSPARENT_OPS:
            return vx
        if op in (A + "view.default", A + "_unsafe_view.default", A + "reshape.default"):
            return L.reshape(vx, ys)
        if op == A + "permute.default":
            return L.permute(vx, n.attr("dims"))
        if op == A + "transpose.int":
            return L.transpose(vx, int(n.attr("dim0")), int(n.attr("dim1")))
        if op == A + "t.default":
            return L.transpose(vx, 0, 1) if vx.ndim == 2 else vx
        if op == A + "unsqueeze.default":
            return L.unsqueeze(vx, int(n.attr("dim")))
        if op in (A + "squeeze.dims", A + "squeeze.dim", A + "squeeze.default"):
            dims = n.attr("dim")
            dims = None if dims is None else ([dims] if isinstance(dims, int) else list(dims))
            v = L.squeeze(vx, dims)
            return v if v.shape == ys else L.reshape(vx, ys)
        if op == A + "slice.Tensor":
            return L.slice_(vx, int(n.attr("dim", 0)), n.attr("start"), n.attr("end"), int(n.attr("step", 1) or 1))
        if op == A + "select.int":
            return L.select(vx, int(n.attr("dim")), int(n.attr("index")))
        if op == A + "expand.default":
            return L.expand(vx, n.attr("size"))
        if op in (A + "split_with_sizes.default", A + "split.Tensor"):
            dim = L.norm_dim(int(n.attr("dim", 0) or 0), vx.ndim)
            idx = [o.name for o in n.outputs].index(t)
            if op == A + "split.Tensor":
                size = int(n.attr("split_size"))
                start = idx * size
                end = min(start + size, vx.shape[dim])
            else:
                sizes = n.attr("split_sizes")
                start = sum(sizes[:idx])
                end = start + sizes[idx]
            return L.slice_(vx, dim, start, end)
        raise AssertionError(f"not a layout op: {op}")

    def _copy_contiguous(self, x: str, vx: View, pre: list[Task], phase: str, *, why: str,
                         dtype: str | None = None, shape_view: View | None = None) -> str:
        """Append a copy of ``vx`` (or ``shape_view``, a view to materialise as is) into a
        fresh contiguous buffer; return the new tensor's name."""
        src = shape_view or vx
        dtype = dtype or src.dtype
        name = self.p.add_synthetic(f"{x}_c", src.shape, dtype)
        dst = self._fresh(name, dtype, src.shape, phase)
        self.views[name] = dst
        verb = "cast" if dtype != src.dtype else "copy"
        pre.append(self._copy_task(f"{verb}_{_ident(x)}", [], src, dst, phase, note=why))
        return name

    def _copy_task(self, name: str, covers: list[str], src: View, dst: View, phase: str, note: str = "") -> Task:
        item = _copy_item(src, dst)
        spec = CopySpec("copy", (item,))
        return Task(name, "copy", tuple(covers), (src.buffer,), (dst.buffer,), spec, phase=phase, note=note)

    # ------------------------------------------------------------------ ordering

    def _order(self) -> list[int]:
        p = self.p
        deps: dict[int, set[int]] = {}
        for i, pr in enumerate(p.protos):
            d = set()
            for t in pr.ins:
                for r in self._roots(t):
                    j = self.materialized.get(r)
                    if j is not None and j != i:
                        d.add(j)
            if pr.kind == "ew" and pr.info.get("nodes"):
                for nm in pr.info["nodes"]:
                    for t in p.nodes[nm].inputs:
                        for r in self._roots(t):
                            j = self.materialized.get(r)
                            if j is not None and j != i:
                                d.add(j)
            deps[i] = d
        prio = {i: max((p.pos.get(n, 0.0) for n in pr.nodes), default=0.0) for i, pr in enumerate(p.protos)}
        for i, pr in enumerate(p.protos):
            if pr.kind == "ew" and not pr.nodes:
                prio[i] = min((prio[j] for j in range(len(p.protos)) if i in deps[j]), default=prio[i]) - 0.25
        done: list[int] = []
        left = set(range(len(p.protos)))
        while left:
            ready = [i for i in left if deps[i] <= set(done)]
            if not ready:
                raise AssertionError(f"cyclic task dependencies in plan {self.g.name}")
            # create-phase tasks first (they run at create), then by reference order
            i = min(ready, key=lambda k: (p.protos[k].phase != "create", prio[k], k))
            done.append(i)
            left.remove(i)
        return done

    def _last_reads(self, order: list[int]) -> None:
        """For in-place writes: the rank of the last task that reads each materialised tensor."""
        p = self.p
        self.last_read: dict[str, float] = {}
        self.inplace_used: set[str] = set()
        for rank, idx in enumerate(order):
            pr = p.protos[idx]
            reads = list(pr.ins)
            if pr.kind == "ew":
                for nm in pr.info.get("nodes", ()):
                    reads.extend(p.nodes[nm].inputs)
            for t in reads:
                for r in self._roots(t):
                    self.last_read[r] = max(self.last_read.get(r, -1), rank)
        for t in self.g.outputs:
            for r in self._roots(t):
                self.last_read[r] = math.inf

    def _roots(self, t: str) -> list[str]:
        """The materialised tensors (or inputs / weights) a tensor's layout derives from."""
        p = self.p
        seen = []
        stack = [t]
        while stack:
            x = stack.pop()
            if x in self.materialized or x in p.inputs or x in p.weights:
                seen.append(x)
                continue
            n = p.producer.get(x)
            if n is None:
                continue
            stack.extend(n.inputs)
        return seen

    def _chain(self, t: str) -> list[str]:
        """``t`` and the layout-op tensors between it and its materialised roots."""
        p = self.p
        out = [t]
        n = p.producer.get(t)
        while n is not None and n.op in VIEW_OPS and t not in self.materialized:
            t = n.inputs[0]
            out.append(t)
            n = p.producer.get(t)
        return out

    # ------------------------------------------------------------------ emit tasks per proto

    def _out_view(self, pr: _Proto, t: str, accept, inplace: Sequence[str] = ()) -> View:
        """The layout a proto writes ``t`` in: its placement target when ``accept`` takes it,
        else the buffer of an input (``inplace`` candidates) that no later task reads, else a
        fresh contiguous buffer."""
        if t in self.views:
            return self.views[t]
        tv = self.target.get(t)
        reuse = None
        if pr.phase == "run" and not (tv is not None and accept(tv)):
            want = self.p.tensor_storage(t)
            for x in inplace:
                vx = self.views.get(x)
                if vx is None or x not in self.materialized or x in self.inplace_used or \
                        self.last_read.get(x, math.inf) != self.rank:
                    continue
                b = self.buffers[vx.buffer]
                if b.kind == "arena" and vx.offset == 0 and vx.is_contiguous() and vx.numel == math.prod(b.shape) \
                        and vx.shape == self.p.spec(t).shape and vx.dtype == want:
                    reuse = vx
                    self.inplace_used.add(x)
                    break
        if reuse is not None:
            v = reuse
        elif tv is not None and pr.phase == "run" and accept(tv):
            v = tv
        else:
            v = self._fresh(t, self.p.tensor_storage(t), self.p.spec(t).shape, pr.phase)
        self.views[t] = v
        return v

    def _emit(self, idx: int) -> None:
        pr = self.p.protos[idx]
        pre: list[Task] = []
        before = len(self.tasks)
        getattr(self, f"_emit_{pr.kind}")(pr, pre)
        new = self.tasks[before:]
        del self.tasks[before:]
        pre = [t if t.covers else dataclasses.replace(t, covers=tuple(self.p.expand(pr.nodes))) for t in pre]
        self.tasks.extend(pre)
        self.tasks.extend(new)

    def _add(self, pr: _Proto, name: str, strategy: str, spec: Any, reads: Iterable[View], writes: Iterable[View],
             touched: Iterable[str] = (), covers: Sequence[str] | None = None, note: str = "") -> None:
        reads = [v for v in reads if v is not None]
        writes = [v for v in writes if v is not None]
        covers = self.p.expand(list(pr.nodes) if covers is None else list(covers))
        t = Task(name, strategy, tuple(dict.fromkeys(covers)), tuple(dict.fromkeys(v.buffer for v in reads)),
                 tuple(dict.fromkeys(v.buffer for v in writes)), spec, phase=pr.phase, note=note)
        self.tasks.append(t)
        tt = set(touched)
        for x in list(tt):
            tt.update(self._chain(x))
            y = x
            while y in self.target_from:
                y = self.target_from[y]
                tt.add(y)
        self.touch[id(t)] = tt

    def _read(self, t: str, pre: list[Task], phase: str) -> View:
        return self.view_of(t, pre, phase)

    # -- gemm

    def _emit_gemm(self, pr: _Proto, pre: list[Task]) -> None:
        p = self.p
        info = pr.info
        st = self.storage

        def operand(x: Any) -> View:
            if isinstance(x, tuple):
                v = self._read(x[1], pre, pr.phase)
                return L.transpose(v, -1, -2)
            return self._read(x, pre, pr.phase)

        va, vb = operand(info["a"]), operand(info["b"])
        out_t = info["out"]
        os_ = p.shape(out_t)
        # Logical shapes: a [..., M, K], b [..., K, N] (vectors get a unit dim), out [..., M, N].
        a_vec, b_vec = va.ndim == 1, vb.ndim == 1
        if a_vec:
            va = L.unsqueeze(va, 0)
        if b_vec:
            vb = L.unsqueeze(vb, -1)
        m, kk, n = va.shape[-2], va.shape[-1], vb.shape[-1]
        batch_shape = L.broadcast_shapes(va.shape[:-2], vb.shape[:-2])
        out_logical = batch_shape + (m, n)

        def to_logical(v: View) -> View:
            if a_vec:
                v = L.unsqueeze(v, -2)
            if b_vec:
                v = L.unsqueeze(v, -1)
            return v

        def accept(tv: View) -> bool:
            if tv.dtype != st:
                return False
            lv = to_logical(tv)
            mat = L.as_matrix(lv, allow_trans=False)
            if mat is None:
                return False
            lead = L.collapse(lv.shape[:-1], lv.strides[:-1])
            return lead is not None and (lead[0] <= 1 or lead[1] >= n)

        vo = to_logical(self._out_view(pr, out_t, accept))
        assert vo.shape == out_logical, (vo.shape, out_logical, os_)

        def need(v: View, what: str, shape: Sequence[int]) -> View:
            full = L.broadcast_to(v, shape)
            if v.dtype == st and L.as_matrix(full) is not None:
                return full
            c = self._copy_contiguous(what, v, pre, pr.phase, why=f"GEMM operand {what} needs a matrix layout",
                                      dtype=st, shape_view=full)
            return self.views[c]

        a_name = info["a"] if isinstance(info["a"], str) else info["a"][1]
        b_name = info["b"] if isinstance(info["b"], str) else info["b"][1]
        # One big 2-D GEMM when b is one matrix and a's batch rows stack with a uniform stride.
        flat = None
        if all(d == 1 for d in vb.shape[:-2]) or vb.ndim == 2:
            if va.dtype == st and (va.strides[-1] == 1 or va.shape[-1] == 1):
                ca = L.collapse(va.shape[:-1], va.strides[:-1])
                co = L.collapse(vo.shape[:-1], vo.strides[:-1])
                if ca is not None and co is not None and (ca[0] <= 1 or ca[1] >= kk) and (co[0] <= 1 or co[1] >= n):
                    flat = (ca, co)
        vb2 = need(L.reshape(vb, vb.shape[-2:]) if (flat and vb.ndim > 2) else vb, b_name,
                   vb.shape[-2:] if flat else batch_shape + (kk, n))
        if flat:
            (mm, lda), (_, ldo) = flat
            mm = mm if mm > 0 else 0
            lda = lda if mm > 1 else kk
            ldo = ldo if mm > 1 else n
            ma = L.Matrix(lda, False, 0)
            mb = L.as_matrix(vb2)
            mo = L.Matrix(ldo, False, 0)
            a_view, out_view = va, vo
            M, batch = mm, 1
        else:
            a_view = need(va, a_name, batch_shape + (m, kk))
            ma, mb = L.as_matrix(a_view), L.as_matrix(vb2)
            mo = L.as_matrix(vo, allow_trans=False)
            out_view = vo
            M, batch = m, math.prod(batch_shape)
            assert mo is not None
        assert ma is not None and mb is not None
        # Epilogue: alpha, bias, beta * C, cuBLASLt's epilogue, the runtime's chain.
        alpha = float(info["alpha"])
        bias_t = info.get("bias")
        beta = float(info.get("beta", 0.0))
        c_t = info.get("c")
        chain: list[EpOp] = []
        residual_t = None
        for step in info["steps"]:
            kind = step[0]
            if kind in ("scale", "div"):
                s = step[1] if kind == "scale" else 1.0 / step[1]
                if not chain and bias_t is None and c_t is None and residual_t is None:
                    alpha *= s
                else:
                    chain.append(EpOp("SCALE", step[1]) if kind == "scale" else EpOp("DIV_SCALAR", step[1]))
            elif kind == "bias":
                bias_t = step[1]
                if chain:
                    chain.append(EpOp("BIAS_ADD"))
            elif kind == "residual":
                if not chain and c_t is None:
                    c_t, beta = step[1], step[2]
                else:
                    residual_t = step[1]
                    chain.append(EpOp("RESIDUAL_ADD", step[2]))
            else:
                chain.append(step[1])
        epilogue = "none"
        bias_in_chain = any(e.kind == "BIAS_ADD" for e in chain)
        if bias_t is not None and not bias_in_chain:
            epilogue = "bias"
        if beta == 0.0 and chain and not bias_in_chain:
            head = chain[0].kind
            if head == "RELU" or (head == "GELU_TANH" and self.policy != "fp32"):
                epilogue = {"none": "", "bias": "bias_"}[epilogue] + ("relu" if head == "RELU" else "gelu")
                chain = chain[1:]
        bias_v = None
        if bias_t is not None:
            bv = self._read(bias_t, pre, pr.phase)
            bv = L.reshape(bv, (n,)) or bv
            if bv.dtype != st or bv.ndim != 1 or (n > 1 and bv.strides[0] != 1):
                c2 = self._copy_contiguous(bias_t, bv, pre, pr.phase, why="bias must be contiguous", dtype=st,
                                           shape_view=L.reshape(bv, (n,)) if bv.ndim != 1 else bv)
                bv = self.views[c2]
            bias_v = bv
        c_v, ldc, stride_c = None, 0, 0
        if c_t is not None:
            cv = self._read(c_t, pre, pr.phase)
            full = L.broadcast_to(cv, out_logical) if not flat else L.broadcast_to(cv, vo.shape)
            if flat:
                full = L.reshape(full, (M, n)) if L.reshape(full, (M, n)) is not None else None
            mc = L.as_matrix(full, allow_trans=False) if full is not None else None
            if cv.dtype != st or mc is None:
                src = L.broadcast_to(cv, out_logical)
                c2 = self._copy_contiguous(c_t, cv, pre, pr.phase, why="C must be a row-major matrix", dtype=st,
                                           shape_view=src)
                full = self.views[c2]
                if flat:
                    full = L.reshape(full, (M, n))
                mc = L.as_matrix(full, allow_trans=False)
            c_v, ldc, stride_c = full, mc.ld, mc.batch_stride
        res_v, ldr = None, 0
        if residual_t is not None:
            rv = L.broadcast_to(self._read(residual_t, pre, pr.phase), out_logical)
            rc = L.rows_cols(rv, 1)
            if rv.dtype != st or rc is None:
                c2 = self._copy_contiguous(residual_t, rv, pre, pr.phase, why="residual must be row-major", dtype=st,
                                           shape_view=rv)
                rv = self.views[c2]
                rc = L.rows_cols(rv, 1)
            res_v, ldr = rv, rc[2]
        if chain and batch > 1 and mo.batch_stride != M * mo.ld:
            raise AssertionError("batched epilogue needs a dense batch")
        spec = GemmSpec("gemm", self.policy, M, n, kk, batch, a_view, ma.ld, ma.batch_stride, ma.trans,
                        vb2, mb.ld, mb.batch_stride, mb.trans, out_view, mo.ld, mo.batch_stride if batch > 1 else 0,
                        alpha=alpha, beta=beta, c=c_v, ldc=ldc, stride_c=stride_c, bias=bias_v, epilogue=epilogue,
                        chain=tuple(chain), residual=res_v, ldr=ldr)
        reads = [a_view, vb2, bias_v, c_v, res_v]
        self._add(pr, pr.name, "cublaslt_gemm", spec, reads, [out_view], touched=pr.ins + [out_t])

    # -- elementwise

    def _emit_ew(self, pr: _Proto, pre: list[Task]) -> None:
        p = self.p
        info = pr.info
        out_t = pr.outs[0]
        nodes = [p.nodes[x] for x in info["nodes"]]
        shape = p.shape(out_t)
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
            ops = {t: refs.get(t) or ref(t) for t in nd.inputs}
            new = _ew_translate(nd, ops, p, len(instrs))
            if new is None:
                raise p.fail(nd, "no elementwise translation")
            instrs.extend(new)
            refs[nd.outputs[0].name] = f"t{len(instrs) - 1}"
        if info.get("final") is not None:
            src = refs.get(info["root"]) or ref(info["root"])
            fin = info["final"]
            instrs.append(EwInstr(fin.op, tuple(src if a == "x" else a for a in fin.args), fin.consts))
        elif not nodes:
            instrs.append(EwInstr("copy", (ref(info["root"]),)))
        ins = [L.broadcast_to(self._read(t, pre, pr.phase), shape) for t in leaves]
        # Written in place over an input that dies here, when no other input reads that buffer
        # through another layout (each element is read before it is written, by one thread).
        cands = []
        for t, v in zip(leaves, ins):
            if t in self.materialized and p.shape(t) == shape and all(
                    w.buffer != v.buffer or (w.offset == v.offset and w.strides == v.strides) for w in ins):
                cands.append(t)
        vo = self._out_view(pr, out_t, lambda tv: len(L.coalesce(tv.shape, tv.strides)[0]) <= 6, inplace=cands)
        if not ins:
            # A constant: the template needs one input to drive it; it reads (and ignores) one
            # element of the output.
            ins.append(dataclasses.replace(vo, strides=(0,) * len(shape)))
        cshape, cstr = L.coalesce(shape, vo.strides, *[v.strides for v in ins])
        if len(cshape) > 6:
            raise p.fail(nodes[0] if nodes else p.node(pr.nodes[0]), "elementwise layout with more than 6 dims")
        spec = EwSpec("elementwise", vo, tuple(ins), tuple(instrs), cshape, cstr[0], tuple(cstr[1:]))
        reads = ins if leaves else []
        self._add(pr, pr.name, "elementwise_kernel", spec, reads, [vo], touched=pr.ins + leaves + [out_t] +
                  [o.name for nd in nodes for o in nd.outputs])

    # -- row / axis reductions

    def _hook(self, names: Sequence[str]) -> tuple[EwInstr, ...]:
        instrs: list[EwInstr] = []
        ref = "a0"
        for nm in names:
            nd = self.p.nodes[nm]
            new = _ew_translate(nd, {nd.inputs[0]: ref}, self.p, len(instrs))
            if new is None:
                raise self.p.fail(nd, "no elementwise translation")
            instrs.extend(new)
            ref = f"t{len(instrs) - 1}"
        return tuple(instrs)

    def _emit_row(self, pr: _Proto, pre: list[Task]) -> None:
        p = self.p
        info = pr.info
        op = info["op"]
        x_t, out_t = info["x"], info["out"]
        k = info["k"]
        writes_row = op in ("softmax", "log_softmax", "layer_norm", "rms_norm")
        pro, epi = self._hook(info["pro"]), self._hook(info["epi"])
        vx = self._read(x_t, pre, pr.phase)
        perm = info.get("perm")
        if perm is not None:
            vx = L.permute(vx, perm)
        if k == 0:
            vx = L.unsqueeze(vx, vx.ndim)
            k = 1
        rc = L.rows_cols(vx, k)
        if rc is None or vx.dtype not in _FLOAT_DTYPES:
            c = self._copy_contiguous(x_t, vx, pre, pr.phase, why=f"{op} reads rows with unit stride",
                                      shape_view=vx)
            vx = self.views[c]
            rc = L.rows_cols(vx, k)
        rows, cols, ldi = rc

        if writes_row:
            def accept(tv: View) -> bool:  # a permuted reduction writes through a copy: any layout
                return (perm is not None or L.rows_cols(tv, k) is not None) and tv.dtype in _FLOAT_DTYPES
            same = perm is None and x_t in self.materialized and p.shape(x_t) == p.shape(out_t)
            vo = self._out_view(pr, out_t, accept, inplace=[x_t] if same else [])
            wo = L.permute(vo, perm) if perm is not None else vo
            post = None
            if L.rows_cols(wo, k) is None:
                tmp = p.add_synthetic(f"{out_t}_rows", wo.shape, vo.dtype)
                wo = self._fresh(tmp, vo.dtype, wo.shape, pr.phase)
                self.views[tmp] = wo
                post = (wo, vo)
            _, _, ldo = L.rows_cols(wo, k)
        else:
            def accept(tv: View) -> bool:
                return L.collapse(tv.shape, tv.strides) is not None and tv.dtype in _FLOAT_DTYPES
            vo = self._out_view(pr, out_t, accept)
            wo = vo
            post = None
            cl = L.collapse(vo.shape, vo.strides)
            if cl is None:
                tmp = p.add_synthetic(f"{out_t}_rows", vo.shape, vo.dtype)
                wo = self._fresh(tmp, vo.dtype, vo.shape, pr.phase)
                self.views[tmp] = wo
                post = (wo, vo)
                cl = L.collapse(wo.shape, wo.strides)
            ldo = cl[1] if rows > 1 else 1
        weight = bias = None
        tw = None
        for key in ("weight", "bias"):
            t = info.get(key)
            if not t:
                continue
            v = self._read(t, pre, pr.phase)
            v2 = L.reshape(v, (cols,)) if v.numel == cols else None
            if v2 is None or (cols > 1 and v2.strides[0] != 1) or (tw and v2.dtype != tw):
                c = self._copy_contiguous(t, v, pre, pr.phase, why=f"{op} {key} must be contiguous",
                                          dtype=tw or v.dtype)
                v2 = L.reshape(self.views[c], (cols,))
            tw = v2.dtype
            if key == "weight":
                weight = v2
            else:
                bias = v2
        eps = float(info.get("eps", 0.0))
        unbiased = False
        if op == "var":
            corr = info.get("correction", 1.0)
            if corr == 1.0:
                unbiased = True
            elif corr != 0.0:
                # m2 / (cols - c) == (m2 / cols) * cols / (cols - c)
                factor = cols / (cols - corr) if cols != corr else math.inf
                epi = (EwInstr("mul", ("a0", "c0"), (factor,)),) + tuple(_shift_instr(i, 1) for i in epi)
        spec = RowSpec("row", op, vx, ldi, wo, ldo, rows, cols, weight, bias, eps, unbiased, pro, epi)
        reads = [vx, weight, bias]
        self._add(pr, pr.name, "reduction_template", spec, reads, [wo], touched=pr.ins + [out_t, x_t] +
                  info["pro"] + info["epi"] + [p.nodes[nm].outputs[0].name for nm in info["pro"] + info["epi"]])
        if post is not None:
            src, dst = post
            if perm is not None:
                src = L.permute(src, L.inverse_permutation(perm))
            self.tasks.append(self._copy_task(f"{pr.name}_out", list(pr.nodes), src, dst, pr.phase,
                                              note="writes the rows back in the reference's layout"))

    def _emit_axis(self, pr: _Proto, pre: list[Task]) -> None:
        p = self.p
        info = pr.info
        x_t, out_t = info["x"], info["out"]
        d0, d1 = info["d0"], info["d1"]
        pro, epi = self._hook(info["pro"]), self._hook(info["epi"])
        vx = self._read(x_t, pre, pr.phase)

        def groups(v: View):
            return (L.collapse(v.shape[:d0], v.strides[:d0]), L.collapse(v.shape[d0:d1], v.strides[d0:d1]),
                    L.collapse(v.shape[d1:], v.strides[d1:]))

        gs = groups(vx)
        if any(g is None for g in gs) or vx.dtype not in _FLOAT_DTYPES:
            c = self._copy_contiguous(x_t, vx, pre, pr.phase, why="reduction groups must collapse")
            vx = self.views[c]
            gs = groups(vx)
        (outer, so), (red, sr), (inner, si) = gs
        xs = vx.shape
        ow = d0

        def out_groups(v: View):
            if len(v.shape) == len(xs):  # keepdim
                return L.collapse(v.shape[:d0], v.strides[:d0]), L.collapse(v.shape[d1:], v.strides[d1:])
            return L.collapse(v.shape[:ow], v.strides[:ow]), L.collapse(v.shape[ow:], v.strides[ow:])

        vo = self._out_view(pr, out_t, lambda tv: all(g is not None for g in out_groups(tv)) and
                            tv.dtype in _FLOAT_DTYPES)
        (o_o, out_so), (o_i, out_si) = out_groups(vo)
        if inner <= 1:
            si, out_si = 1, 1
        if outer <= 1:
            so, out_so = 0, 0
        ws_floats = _axis_workspace_floats(outer, red, inner, si, so, sr, vx.itemsize)
        ws = None
        if ws_floats:
            wt = p.add_synthetic(f"{out_t}_ws", (ws_floats,), "float32")
            ws = self._fresh(wt, "float32", (ws_floats,), pr.phase)
            self.views[wt] = ws
        spec = AxisSpec("axis", info["op"], vx, outer, red, inner, so, sr, si, vo, out_so, out_si, ws, ws_floats,
                        pro, epi)
        self._add(pr, pr.name, "reduction_template", spec, [vx], [vo] + ([ws] if ws else []),
                  touched=pr.ins + [out_t, x_t])

    # -- attention

    def _emit_attn(self, pr: _Proto, pre: list[Task]) -> None:
        p = self.p
        info = pr.info
        st = self.storage
        if "kt" in info:
            vq = self._read(info["q"], pre, pr.phase)
            vk = L.transpose(self._read(info["kt"], pre, pr.phase), -1, -2)
            vv = self._read(info["v"], pre, pr.phase)
            names = (info["q"], info["kt"], info["v"])
        else:
            vq = self._read(info["q"], pre, pr.phase)
            vk = self._read(info["k"], pre, pr.phase)
            vv = self._read(info["v"], pre, pr.phase)
            names = (info["q"], info["k"], info["v"])

        def four(v: View) -> View:
            return L.unsqueeze(v, 0) if v.ndim == 3 else v

        def fix(v: View, name: str) -> View:
            v4 = four(v)
            if v4.dtype != st or v4.strides[-1] != 1:
                c = self._copy_contiguous(name, v, pre, pr.phase, why="attention reads rows with unit stride", dtype=st)
                v4 = four(self.views[c])
            return v4

        q4, k4, v4 = fix(vq, names[0]), fix(vk, names[1]), fix(vv, names[2])
        out_t = info["out"]

        def accept(tv: View) -> bool:
            return tv.dtype == st and four(tv).strides[-1] == 1

        vo = self._out_view(pr, out_t, accept)
        o4 = four(vo)
        B, H, lq, d = q4.shape
        lk = k4.shape[2]
        mask_v, mask_kind = None, info.get("mask_kind", "none")
        if info.get("mask"):
            mv = self._read(info["mask"], pre, pr.phase)
            try:
                mv4 = L.broadcast_to(mv, (B, H, lq, lk))
            except ValueError:
                raise p.fail(p.node(pr.nodes[0]), "attention mask does not broadcast to the scores")
            if mask_kind == "bool" and mv4.dtype not in ("bool", "uint8", "int8"):
                raise p.fail(p.node(pr.nodes[0]), "boolean attention mask of another dtype")
            if mask_kind in ("add_same", "add_f32"):
                want = st if mask_kind == "add_same" else "float32"
                if mv4.dtype != want:  # a constant mask is cast once, at create
                    phase = "create" if self.buffers[mv.buffer].kind in ("weight", "const") else pr.phase
                    c = self._copy_contiguous(info["mask"], mv, pre, phase, why="additive mask dtype", dtype=want)
                    mv4 = L.broadcast_to(self.views[c], (B, H, lq, lk))
            mask_v = mv4
        blocks_v = None
        if mask_v is not None and self.buffers[mask_v.buffer].kind in ("weight", "const"):
            blocks_v = self._mask_blocks(pr, mask_v, mask_kind, B, H, lq, lk, pre)
        tf32 = self.policy == "tf32" and st == "float32"
        spec = AttentionSpec("attention", q4, k4, v4, o4, B, H, lq, lk, d, int(info.get("heads_per_kv", 1)),
                             float(info["scale"]), bool(info.get("causal", False)), 0, mask_kind, mask_v,
                             tf32, blocks_v)
        self._add(pr, pr.name, "attention_template", spec, [q4, k4, v4, mask_v, blocks_v], [o4],
                  touched=pr.ins + [out_t] + list(names))

    def _mask_blocks(self, pr: _Proto, mv4: View, kind: str, B: int, H: int, lq: int, lk: int,
                     pre: list[Task]) -> View:
        """A create-time task summarising a constant mask per 64 x 32 cell (which key tiles the
        kernel may skip, which it must mask); the summary's view, broadcast like the mask."""
        cq, ck = ATTENTION_MASK_CELL
        nb = B if B > 1 and mv4.strides[0] != 0 else 1
        nh = H if H > 1 and mv4.strides[1] != 0 else 1
        shape = (nb, nh, -(-lq // cq), -(-lk // ck))
        name = self.p.add_synthetic(f"{_ident(pr.name)}_mask_blocks", shape, "uint8")
        v = self._fresh(name, "uint8", shape, "create")
        self.views[name] = v
        vb = L.broadcast_to(v, (B, H) + shape[2:])
        spec = AttentionMaskBlocksSpec("attention_mask_blocks", mv4, kind, self.storage, B, H, lq, lk, vb)
        pre.append(Task(f"mask_blocks_{_ident(pr.name)}", "attention_template", (), (mv4.buffer,), (v.buffer,), spec,
                        phase="create", note="which key tiles the constant mask hides (skipped) or cuts (masked)"))
        return vb

    # -- batch norm statistics

    def _emit_bn_stats(self, pr: _Proto, pre: list[Task]) -> None:
        p = self.p
        info = pr.info
        c = p.shape(info["scale"])[0]
        vx = None
        n = s = 1
        sn = sc = ss = 0
        if info["mode"] == "batch":
            vx = self._read(info["x"], pre, pr.phase)

            def g(v: View):
                return (L.collapse(v.shape[:1], v.strides[:1]), L.collapse(v.shape[1:2], v.strides[1:2]),
                        L.collapse(v.shape[2:], v.strides[2:]))
            gs = g(vx)
            if any(x is None for x in gs):
                cc = self._copy_contiguous(info["x"], vx, pre, pr.phase, why="batch statistics layout")
                vx = self.views[cc]
                gs = g(vx)
            (n, sn), (_, sc), (s, ss) = gs
            if s <= 1:
                ss = 1

        def vec(t: str | None) -> View | None:
            if not t:
                return None
            v = self._read(t, pre, pr.phase)
            v1 = L.reshape(v, (c,))
            if v1 is None or (c > 1 and v1.strides[0] != 1):
                cc = self._copy_contiguous(t, v, pre, pr.phase, why="per-channel vector must be contiguous")
                v1 = L.reshape(self.views[cc], (c,))
            return v1

        w, b = vec(info["weight"]), vec(info["bias"])
        rm = vec(info["rm"]) if info["mode"] == "running" else None
        rv = vec(info["rv"]) if info["mode"] == "running" else None
        scale = self._out_view(pr, info["scale"], lambda tv: False)
        shift = self._out_view(pr, info["shift"], lambda tv: False)
        splits, ws = 1, None
        if info["mode"] == "batch":
            splits = _bn_splits(n * s, c)
            wt = p.add_synthetic(f"{info['scale']}_ws", (splits * c * 3,), "float32")
            ws = self._fresh(wt, "float32", (splits * c * 3,), pr.phase)
            self.views[wt] = ws
        spec = BnStatsSpec("bn_stats", info["mode"], vx, n, c, s, sn, sc, ss, w, b, rm, rv, info["eps"],
                           L.reshape(scale, (c,)), L.reshape(shift, (c,)), ws, splits)
        self._add(pr, pr.name, "custom_kernel", spec, [vx, w, b, rm, rv], [scale, shift] + ([ws] if ws else []),
                  touched=pr.ins)

    # -- cat

    def _emit_cat(self, pr: _Proto, pre: list[Task]) -> None:
        p = self.p
        out_t = pr.outs[0]
        vo = self._out_view(pr, out_t, lambda tv: True)
        dim = pr.info["dim"]
        off = 0
        items = []
        reads = []
        for x in pr.info["parts"]:
            size = p.shape(x)[dim] if p.shape(x) else 1
            dst = L.slice_(vo, dim, off, off + size)
            off += size
            vx = self._read(x, pre, pr.phase)
            if vx.buffer == dst.buffer and vx.offset == dst.offset and L.same_strides(vx.shape, vx.strides, dst.strides):
                continue  # its producer wrote it in place
            items.append(_copy_item(vx, dst))
            reads.append(vx)
        if items:
            self._add(pr, pr.name, "copy", CopySpec("copy", tuple(items)), reads, [vo], touched=pr.ins + [out_t])
        else:
            # every part was written in place: the producers' tasks cover the cat
            self.cats_in_place.append((pr.nodes[0], list(pr.info["parts"])))
            self.views[out_t] = vo

    # ------------------------------------------------------------------ outputs

    def _emit_output_copies(self) -> None:
        g = self.g
        for i, t in enumerate(g.outputs):
            dst = L.contiguous(f"out{i}", g.spec(t).shape, g.spec(t).dtype)
            pre: list[Task] = []
            src = self.view_of(t, pre, "run")
            self.tasks.extend(pre)
            if src.buffer == dst.buffer and src.offset == 0 and L.same_strides(src.shape, src.strides, dst.strides):
                continue
            task = self._copy_task(f"output_{_ident(t)}", [], src, dst, "run", note=f"output {i}")
            self.tasks.append(task)
            self.touch[id(task)] = set(self._chain(t))

    # ------------------------------------------------------------------ provenance of layout ops

    def _cover_views(self, tasks: list[Task]) -> list[Task]:
        """Every reference node must be covered: a layout op by the first task that reads or
        writes a tensor through it; a cat written in place by the tasks that wrote its parts."""
        covered = {c for t in tasks for c in t.covers}
        extra: dict[int, list[str]] = defaultdict(list)
        by_out = {}
        for i, t in enumerate(tasks):
            for x in self.touch.get(id(t), ()):
                by_out.setdefault(x, i)
        for cat, parts in self.cats_in_place:
            for x in parts:
                for r in self._chain(x):
                    i = by_out.get(r)
                    if i is not None:
                        extra[i].append(cat)
                        break
            covered.add(cat)
        for n in self.g.nodes:
            if n.name in covered:
                continue
            hit = None
            for o in n.outputs:
                if o.name in by_out:
                    hit = by_out[o.name]
                    break
            if hit is None:
                # a layout op whose result nobody reads (a split's unused part): the reader of a sibling
                for x in n.inputs:
                    if x in by_out:
                        hit = by_out[x]
                        break
            if hit is None and tasks:
                hit = 0
            if hit is not None:
                extra[hit].append(n.name)
        out = []
        for i, t in enumerate(tasks):
            if extra.get(i):
                covers = list(t.covers)
                for c in extra[i]:
                    if c not in covers:
                        covers.append(c)
                order = {nm: k for k, nm in enumerate(n.name for n in self.g.nodes)}
                covers.sort(key=lambda c: order.get(c, 1e9))
                t = dataclasses.replace(t, covers=tuple(covers))
            out.append(t)
        return out

    # ------------------------------------------------------------------ names, costs

    def _finish(self, tasks: list[Task]) -> list[Task]:
        seen: dict[str, int] = {}
        out = []
        for t in tasks:
            name = _ident(t.name) or "task"
            if name in seen:
                seen[name] += 1
                name = f"{name}_{seen[name]}"
            else:
                seen[name] = 0
            flops, nbytes, peak = _spec_cost(t.params, self.policy, self.p.ceil)
            ct = flops / peak if peak else 0.0
            mt = nbytes / self.p.ceil.bandwidth
            bound = "compute" if ct > mt else "memory"
            if not t.covers:
                t = dataclasses.replace(t, covers=tuple(self._covers_for(t)))
            out.append(dataclasses.replace(t, name=name, flops=int(flops), bytes=int(nbytes),
                                           est_time_s=max(ct, mt), bound=bound))
        return out

    def _covers_for(self, t: Task) -> list[str]:
        tt = self.touch.get(id(t), set())
        return [n.name for n in self.g.nodes if any(o.name in tt for o in n.outputs)]

    def _node_cost(self, n: Node) -> NodeCost:
        p = self.p
        flops, nbytes = _node_flops_bytes(n, p)
        peak = p.ceil.gemm_peak(self.policy) if n.op in GEMM_OPS or n.op == SDPA_OP else p.ceil.fp32
        ct = flops / peak if peak else 0.0
        mt = nbytes / p.ceil.bandwidth
        bound = "none" if not flops and not nbytes else ("compute" if ct > mt else "memory")
        return NodeCost(n.name, n.op, int(flops), int(nbytes), max(ct, mt), bound)

    # ------------------------------------------------------------------ arena

    def _arena(self, tasks: list[Task]) -> dict[str, Buffer]:
        """First-fit offsets by liveness: a buffer lives from the first task that writes it to
        the last that reads it; buffers whose lifetimes overlap never share bytes."""
        life: dict[str, list[int]] = {}
        run = [t for t in tasks if t.phase == "run"]
        for i, t in enumerate(run):
            for b in t.inputs + t.outputs:
                if self.buffers[b].kind == "arena":
                    lo_hi = life.setdefault(b, [i, i])
                    lo_hi[0] = min(lo_hi[0], i)
                    lo_hi[1] = max(lo_hi[1], i)
        placed: list[tuple[int, int, int, int]] = []  # (start, end, lo, hi)
        out: dict[str, Buffer] = {}
        for b in sorted(life, key=lambda x: (-self.buffers[x].nbytes, life[x][0])):
            size = _align(self.buffers[b].nbytes)
            lo, hi = life[b]
            clashes = sorted((s, e) for s, e, l2, h2 in placed if not (h2 < lo or hi < l2))
            off = 0
            for s, e in clashes:
                if off + size <= s:
                    break
                off = max(off, e)
            placed.append((off, off + size, lo, hi))
            out[b] = dataclasses.replace(self.buffers[b], offset=off)
        return out


# ====================================================================== elementwise translation


def _c(v: Any) -> float:
    if isinstance(v, bool):
        return 1.0 if v else 0.0
    return float(v)


def _ew_translate(n: Node, ops: Mapping[str, str], p: _Planner, base: int) -> list[EwInstr] | None:
    """Instructions computing node ``n`` from operand refs (``ops``: tensor -> "a<k>"/"t<k>");
    results are numbered from ``base``. The last instruction is the node's value."""
    op = n.op
    names = _EW_ARGS.get(op, ("self",))
    a = p.args(n, names)
    out: list[EwInstr] = []

    def val(key: str) -> str | float | None:
        x = a.get(key)
        if x is None:
            v = n.attr(key)
            return None if v is None else _c(v)
        return ops[x[1]] if x[0] == "t" else _c(x[1])

    def emit(name: str, *args: str | float) -> str:
        refs, consts = [], []
        for x in args:
            if isinstance(x, str):
                refs.append(x)
            else:
                refs.append(f"c{len(consts)}")
                consts.append(float(x))
        out.append(EwInstr(name, tuple(refs), tuple(consts)))
        return f"t{base + len(out) - 1}"

    s = val("self") if "self" in names else None
    short = op.removeprefix(A)
    alpha = _c(n.attr("alpha", 1) if n.attr("alpha") is not None else 1)
    if short in ("add.Tensor", "sub.Tensor", "add.Scalar", "sub.Scalar"):
        o = val("other")
        if not isinstance(o, str):
            o = alpha * o
        elif alpha != 1.0:
            o = emit("mul", o, alpha)
        emit("add" if short.startswith("add") else "sub", s, o)
    elif short == "rsub.Scalar":
        o = val("other")
        t = emit("mul", s, alpha) if alpha != 1.0 else s
        emit("sub", o, t)
    elif short in ("mul.Tensor", "mul.Scalar"):
        emit("mul", s, val("other"))
    elif short in ("div.Tensor", "div.Scalar"):
        emit("div", s, val("other"))
    elif short == "div.Tensor_mode":
        mode = n.attr("rounding_mode")
        emit({None: "div", "trunc": "div_trunc", "floor": "div_floor"}[mode], s, val("other"))
    elif short == "pow.Tensor_Scalar":
        e = _c(n.attr("exponent"))
        table = {2.0: "square", 3.0: "cube", 0.5: "sqrt", -1.0: "reciprocal", -0.5: "rsqrt", 1.0: "copy"}
        if e in table:
            emit(table[e], s)
        else:
            emit("pow", s, e)
    elif short == "pow.Tensor_Tensor":
        emit("pow", s, val("other"))
    elif short in ("maximum.default", "minimum.default"):
        emit("max" if short.startswith("max") else "min", s, val("other"))
    elif short.split(".")[0] in ("eq", "ne", "lt", "le", "gt", "ge"):
        emit(short.split(".")[0], s, val("other"))
    elif short in ("logical_and.default", "bitwise_and.Tensor"):
        emit("and", s, val("other"))
    elif short in ("logical_or.default", "bitwise_or.Tensor"):
        emit("or", s, val("other"))
    elif short in ("bitwise_not.default", "logical_not.default"):
        if short.startswith("bitwise") and p.spec(n.inputs[0]).dtype != "bool":
            return None
        emit("not", s)
    elif short == "where.self":
        emit("where", val("condition"), s, val("other"))
    elif short == "scalar_tensor.default":
        emit("const", _c(n.attr("s")))
    elif short == "full.default":
        emit("const", _c(n.attr("fill_value")))
    elif short == "leaky_relu.default":
        emit("leaky_relu", s, _c(n.attr("negative_slope", 0.01)))
    elif short == "gelu.default":
        emit("gelu_tanh" if n.attr("approximate") == "tanh" else "gelu_erf", s)
    elif short == "hardtanh.default":
        emit("clamp", s, _c(n.attr("min_val", -1.0)), _c(n.attr("max_val", 1.0)))
    elif short in ("clamp.default", "clamp_min.default", "clamp_max.default"):
        lo = n.attr("min") if short != "clamp_max.default" else None
        hi = n.attr("max") if short != "clamp_min.default" else None
        emit("clamp", s, -math.inf if lo is None else _c(lo), math.inf if hi is None else _c(hi))
    elif short == "elu.default":
        if _c(n.attr("scale", 1)) != 1.0 or _c(n.attr("input_scale", 1)) != 1.0:
            return None
        emit("elu", s, _c(n.attr("alpha", 1.0)))
    elif short == "softplus.default":
        emit("softplus", s, _c(n.attr("beta", 1.0)), _c(n.attr("threshold", 20.0)))
    elif short == "_to_copy.default":
        dt = n.attr("dtype") or p.spec(n.inputs[0]).dtype
        src = p.spec(n.inputs[0]).dtype
        if dt == "bool":
            emit("to_bool", s)
        elif dt in ("int8", "int16", "int32", "int64", "uint8") and src in _FLOAT_DTYPES:
            emit("trunc", s)
        elif dt == "float16" and src != dt:
            emit("to_half", s)
        elif dt == "bfloat16" and src != dt:
            emit("to_bf16", s)
        else:
            emit("copy", s)
    elif op == "stitch.affine_channel":
        t = emit("mul", ops[n.inputs[0]], ops[n.inputs[1]])
        emit("add", t, ops[n.inputs[2]])
    elif op == "stitch.mask_bool":
        emit("where", ops[n.inputs[1]], ops[n.inputs[0]], -math.inf)
    elif op == "stitch.mask_add":
        emit("add", ops[n.inputs[0]], ops[n.inputs[1]])
    elif short in ("neg.default", "rsqrt.default", "sqrt.default", "exp.default", "log.default", "tanh.default",
                   "relu.default", "sigmoid.default", "silu.default", "abs.default", "reciprocal.default",
                   "erf.default", "sin.default", "cos.default", "log1p.default", "expm1.default", "floor.default",
                   "ceil.default", "round.default", "sign.default", "trunc.default", "hardswish.default",
                   "hardsigmoid.default", "mish.default", "relu6.default"):
        emit(short.split(".")[0], s)
    else:
        return None
    return out


def _shift_instr(i: EwInstr, by: int) -> EwInstr:
    return EwInstr(i.op, tuple(f"t{int(x[1:]) + by}" if x.startswith("t") else ("t0" if x == "a0" else x)
                               for x in i.args), i.consts)


# ====================================================================== costs


def _align(n: int) -> int:
    return (n + ARENA_ALIGN - 1) // ARENA_ALIGN * ARENA_ALIGN


def _ident(name: str) -> str:
    s = "".join(ch if ch.isalnum() or ch == "_" else "_" for ch in name)
    return s if not s or not s[0].isdigit() else "_" + s


def _copy_item(src: View, dst: View) -> CopyItem:
    if src.shape != dst.shape:
        raise AssertionError(f"copy of {src.shape} into {dst.shape}")
    shape, (ss, ds) = L.coalesce(src.shape, src.strides, dst.strides)
    if len(shape) > 6:
        raise AssertionError("copy with more than 6 dims after coalescing")
    return CopyItem(src, dst, shape, ss, ds)


def _bn_splits(rows: int, c: int) -> int:
    """How many pieces the batch-statistics kernel cuts the reduced rows into."""
    tiles = max(1, (c + 31) // 32)
    want = max(1, 1024 // tiles)
    per = max(64, -(-rows // want))
    return max(1, -(-rows // per))


def _axis_workspace_floats(outer: int, red: int, inner: int, si: int, so: int, sr: int, itemsize: int) -> int:
    """Upper bound of reduce.cuh's reduce_axis_workspace_floats over both vector widths."""
    best = 0
    for vec in (1, 16 // itemsize):
        if vec > 1 and not (si == 1 and inner % vec == 0 and so % vec == 0 and sr % vec == 0):
            continue
        ivec = inner // vec if vec else inner
        bx = 32 if ivec >= 32 else 1 << max(0, (max(ivec, 1) - 1).bit_length())
        tiles = outer * (-(-ivec // bx))
        max_by = 256 // bx
        splits = 1
        if tiles < 512:
            by_rows = -(-red // (max_by * 8))
            want = -(-1024 // max(tiles, 1))
            splits = max(1, min(want, by_rows))
        rps = -(-red // splits)
        splits = -(-red // rps)
        if splits > 1:
            best = max(best, splits * outer * inner)
    return best


def _view_bytes(v: View | None) -> int:
    return 0 if v is None else v.footprint * v.itemsize


def _spec_cost(spec: Any, policy: str, ceil: DeviceCeilings) -> tuple[float, float, float]:
    """(FLOPs, fewest bytes, peak FLOP/s) of one task."""
    if isinstance(spec, GemmSpec):
        flops = 2.0 * spec.m * spec.n * spec.k * spec.batch + spec.m * spec.n * spec.batch * (len(spec.chain) + 1)
        nbytes = sum(_view_bytes(v) for v in (spec.a, spec.b, spec.c, spec.bias, spec.residual)) + _view_bytes(spec.out)
        return flops, nbytes, ceil.gemm_peak(policy)
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
        return float(n * (1 + len(spec.prologue))), _view_bytes(spec.x) + _view_bytes(spec.out), ceil.fp32
    if isinstance(spec, AttentionSpec):
        flops = 4.0 * spec.batch * spec.heads * spec.lq * spec.lk * spec.head_dim
        if spec.causal:
            flops *= _causal_fraction(spec.lq, spec.lk, spec.causal_offset)
        kernel = _attention_kernel_policy(spec.q.dtype, spec.tf32)
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
        return float(4 * n), float(_view_bytes(spec.x) + 2 * spec.c * 4), ceil.fp32
    return 0.0, 0.0, ceil.fp32


def _causal_fraction(lq: int, lk: int, offset: int = 0) -> float:
    """The fraction of the lq x lk scores visible under a causal mask (key j <= query i + offset)."""
    if lq <= 0 or lk <= 0:
        return 0.0
    vis = sum(min(lk, max(0, i + offset + 1)) for i in range(lq)) if lq <= 65536 else \
        lq * lk * min(1.0, max(0.0, (lq / 2 + offset) / lk))
    return vis / (lq * lk)


def _attention_kernel_policy(storage: str, tf32: bool) -> str:
    """Which peak (and efficiency) the fused attention kernel of a storage type runs at."""
    if storage == "float32":
        return "tf32" if tf32 else "fp32"
    return "bf16" if storage == "bfloat16" else "fp16"


def attention_time(policy: str, ceil: DeviceCeilings, bh: int, lq: int, lk: int, d: int, *, causal: bool = False,
                   masked: bool = False, fused: bool = True) -> float:
    """Cost-model seconds of attention over ``bh`` (batch x head) pairs under ``policy``.

    ``fused``: the fused kernel of the policy at :data:`ATTENTION_EFFICIENCY` of the peak, the
    causal half skipped, q / k / v / o read and written once. Unfused: two cuBLAS GEMMs at
    :data:`GEMM_EFFICIENCY` over every score (no causal skipping) and the score matrix in the
    policy's storage through memory — written by the first GEMM, read and written by the mask
    pass (``masked``) and by softmax, read by the second GEMM — plus a launch per pass.
    """
    esize = float(DTYPE_SIZES[_STORAGE[policy]])
    mm = 2.0 * bh * lq * lk * d  # one of the two matrix products
    io = esize * bh * 2 * (lq + lk) * d  # q and o; k and v
    if fused:
        kernel = _attention_kernel_policy(_STORAGE[policy], policy == "tf32")
        work = 2 * mm * (_causal_fraction(lq, lk) if causal else 1.0)
        return work / (ceil.gemm_peak(kernel) * ATTENTION_EFFICIENCY[kernel]) + io / ceil.bandwidth + ceil.launch_s
    passes = 4 + (2 if masked else 0)
    scores = esize * bh * lq * lk
    return (2 * mm / (ceil.gemm_peak(policy) * GEMM_EFFICIENCY) + (passes * scores + io) / ceil.bandwidth
            + (3 + masked) * ceil.launch_s)


def _node_flops_bytes(n: Node, p: _Planner) -> tuple[float, float]:
    op = n.op
    outs = [o for o in n.outputs if p.users.get(o.name) or o.name in p.graph_outputs] or list(n.outputs[:1])
    out_bytes = sum(o.nbytes for o in outs)
    in_bytes = sum(p.spec(t).nbytes for t in dict.fromkeys(n.inputs))
    if op in VIEW_OPS:
        if op in (A + "clone.default", A + "contiguous.default"):
            return 0.0, float(in_bytes + out_bytes)
        return 0.0, 0.0
    if op in GEMM_OPS:
        a, b, bias, _ = p._gemm_operands(n) if op != A + "addmm.default" else (n.inputs[1], n.inputs[2], n.inputs[0], 1)
        an = a if isinstance(a, str) else a[1]
        bn = b if isinstance(b, str) else b[1]
        ash, bsh = p.shape(an), p.shape(bn)
        if isinstance(b, tuple):
            bsh = bsh[:-2] + (bsh[-1], bsh[-2]) if len(bsh) >= 2 else bsh
        k = ash[-1] if ash else 1
        out_numel = math.prod(n.outputs[0].shape)
        return 2.0 * out_numel * k + (out_numel if bias else 0), float(in_bytes + out_bytes)
    if op == SDPA_OP:
        a = p.args(n, _OTHER_ARGS[SDPA_OP])
        qs, ks = p.shape(a["query"][1]), p.shape(a["key"][1])
        bh = math.prod(qs[:-2])
        return 4.0 * bh * qs[-2] * ks[-2] * qs[-1] + 5.0 * bh * qs[-2] * ks[-2], float(in_bytes + out_bytes)
    if op in ROW_OPS:
        per = {"_softmax": 5, "_log_softmax": 5, "native_layer_norm": 8, "logsumexp": 4, "var": 4}.get(op.split(".")[1], 1)
        x = p.spec(n.inputs[0])
        return float(per * x.numel), float(in_bytes + out_bytes)
    if op in BN_OPS:
        x = p.spec(n.inputs[0])
        return float(8 * x.numel), float(in_bytes + out_bytes + x.nbytes)
    if op == CAT_OP:
        return 0.0, float(in_bytes + out_bytes)
    if op in EW_OPS:
        per = {"gelu": 8, "silu": 4, "sigmoid": 4, "mish": 6, "softplus": 4, "elu": 3, "hardswish": 4,
               "tanh": 4, "leaky_relu": 2}.get(op.removeprefix(A).split(".")[0], 1)
        return float(per * math.prod(n.outputs[0].shape)), float(in_bytes + out_bytes)
    return 0.0, float(in_bytes + out_bytes)


# ====================================================================== JSON


def _fmt_bytes(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def _encode(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        d = {f.name: _encode(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if type(x).__name__ in _SPEC_TYPES:
            d["kind"] = getattr(x, "kind")
        return d
    if isinstance(x, (tuple, list)):
        return [_encode(v) for v in x]
    if isinstance(x, float) and not math.isfinite(x):
        return {"float": repr(x)}
    return x


def _decode(tp: Any, v: Any) -> Any:
    origin = typing.get_origin(tp)
    if tp is Any:
        return v
    if origin in (Union, types.UnionType):
        args = typing.get_args(tp)
        if v is None:
            return None
        if isinstance(v, dict) and "kind" in v and set(args) & set(_SPEC_TYPES.values()):
            return _decode(_SPEC_KINDS[v["kind"]], v)
        non_none = [a for a in args if a is not type(None)]
        return _decode(non_none[0], v)
    if origin is tuple:
        args = typing.get_args(tp)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_decode(args[0], x) for x in v)
        return tuple(_decode(a, x) for a, x in zip(args, v))
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        kw = {f.name: _decode(hints[f.name], v[f.name]) for f in dataclasses.fields(tp) if f.name in v}
        return tp(**kw)
    if tp is float:
        if isinstance(v, dict):
            return float(v["float"])
        return float(v)
    if tp is int:
        return int(v)
    if tp is bool:
        return bool(v)
    return v


__all__ = [
    "SCHEMA", "POLICIES", "ARENA_ALIGN", "ATTENTION_HEAD_DIMS", "ATTENTION_MASK_CELL", "ATTENTION_EFFICIENCY",
    "GEMM_EFFICIENCY", "MAX_CHAIN", "GRAPH_MIN_TASKS",
    "DeviceCeilings", "H100", "H200", "EwInstr", "EpOp", "GemmSpec", "EwSpec", "RowSpec", "AxisSpec",
    "AttentionSpec", "AttentionMaskBlocksSpec", "attention_time", "CopyItem", "CopySpec", "BnStatsSpec", "TaskSpec", "Buffer", "Task", "NodeCost", "IOSpec",
    "Plan", "PlanError", "PLANNER_OPS", "EW_OPS_ARITY", "plan",
]
