"""The plan's data: task specs, buffers, tasks and the :class:`Plan` every later stage reads.

Takes nothing and does nothing: these are the frozen, JSON-serialisable values the planner's
passes produce (:mod:`.lower` builds the specs, :mod:`.schedule` the buffers' offsets) and the
Coder, the plan interpreter (:mod:`stitchcuda.check`), the Verifier and the loop read. A spec
says exactly what one task computes over which :class:`~stitchcuda.layout.View` of which
buffer; nothing downstream decides a layout, a leading dim or a precision again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, ClassVar, Mapping, Sequence, Union

from ..device import Ceilings
from ..errors import ArgumentError
from ..ir import DTYPE_SIZES
from ..layout import View
from ..serial import from_jsonable, to_jsonable
from .constraints import Constraints

SCHEMA = "stitchcuda.plan/2"
GENERATOR = "stitchcuda.plan (deterministic passes)"
ARENA_ALIGN = 256


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

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "gemm")

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

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "elementwise")

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
    single-input expressions (input ``a0``) applied before / after the reduction. A layer / rms
    norm with a ``workspace`` (fp32, ``workspace_floats``) may split few, long rows over many
    blocks (reduce.cuh decides by the device's SM count)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "row")

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
    workspace: View | None = None
    workspace_floats: int = 0


@dataclass(frozen=True)
class AxisSpec:
    """reduce.cuh's middle-axis reduction: x as [outer, red, inner], out as [outer, inner];
    ``workspace`` (fp32, ``workspace_floats``) lets a long reduced axis split over blocks."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "axis")

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

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "copy")

    kind: str
    items: tuple[CopyItem, ...]


@dataclass(frozen=True)
class BnStatsSpec:
    """Per-channel batch statistics of x viewed as [n, c, s] (strides sn, sc, ss), turned into
    ``scale = weight * rsqrt(var + eps)`` and ``shift = bias - mean * scale`` (fp32, c each).
    ``mode`` ``batch``: biased variance over n and s (training-mode batch norm), computed by a
    generated two-pass Welford kernel with ``splits`` partial results in ``workspace``;
    ``running``: from the running statistics (eval mode)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "bn_stats")

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

    @property
    def by_planes(self) -> bool:
        """Whether pass 1 walks each channel's contiguous runs (see :func:`bn_by_planes`)."""
        return bn_by_planes(self.s, self.ss)


def bn_by_planes(s: int, ss: int) -> bool:
    """Batch statistics of x as [n, c, s]: with runs of at least 64 contiguous elements per
    (sample, channel) (NCHW), a block per channel slice reads along the runs; otherwise (NHWC,
    or few elements per plane) a block's lanes run along the channels."""
    return s >= 64 and ss == 1


@dataclass(frozen=True)
class GroupStatsSpec:
    """norm.cuh's group statistics: x as ``rows`` x ``cols`` (row r at ``r * ldi``, unit stride
    along the row), one normalisation group per row; row r is group ``r % groups`` of sample
    ``r // groups``, covering channels ``g * cpg ...`` (``cpg`` per group, ``cols / cpg``
    elements each). Per (sample, channel): ``scale = weight[c] * rsqrt(var + eps)``, ``shift =
    bias[c] - mean * scale`` (fp32, biased variance over the row) into ``scale`` / ``shift``
    ([samples * groups * cpg]). Group norm, and instance norm (one channel per group). A row is
    cut into ``splits`` pieces whose Welford partials go through ``workspace``."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "group_stats")

    kind: str
    x: View
    ldi: int
    rows: int
    cols: int
    groups: int
    cpg: int
    weight: View | None
    bias: View | None
    eps: float
    scale: View
    shift: View
    workspace: View | None = None
    splits: int = 1


@dataclass(frozen=True)
class PoolSpec:
    """pool.cuh: max / average pooling over up to three spatial dims. ``x`` is [planes, d, h, w]
    and ``out`` [planes, od, oh, ow] (views; a missing spatial dim has size 1). Per spatial dim:
    ``kernel``, ``stride``, ``padding``, ``dilation``; ``adaptive``: window i of an output of n
    over an input of m is [floor(i m / n), ceil((i + 1) m / n)). ``mode`` ``max`` (padding never
    wins; NaN propagates) or ``avg`` (``count_include_pad``: divide by the window clipped to the
    padded input, else by its valid elements; ``divisor`` > 0 overrides both). Hooks as RowSpec."""

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


@dataclass(frozen=True)
class ScanSpec:
    """scan.cuh: inclusive scan of x viewed as [outer, n, inner] (strides ``in_so, in_sn, in_si``)
    along n into out (``out_so, out_sn, out_si``); ``op`` sum, prod, max, min or logsumexp;
    ``reverse`` scans from the end. fp32 accumulation. Hooks as RowSpec."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "scan")

    kind: str
    op: str
    x: View
    outer: int
    n: int
    inner: int
    in_so: int
    in_sn: int
    in_si: int
    out: View
    out_so: int
    out_sn: int
    out_si: int
    reverse: bool = False
    prologue: tuple[EwInstr, ...] = ()
    epilogue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class ArgSpec:
    """scan.cuh's arg reduction: the index (int64, along the reduced axis) of the first maximum
    (``op`` max) or minimum of x viewed as [outer, red, inner] (strides ``in_so, in_sr, in_si``)
    into out [outer, inner] (``out_so, out_si``); NaN counts as the extreme, as in PyTorch."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "arg")

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
    prologue: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class GatherSpec:
    """index.cuh's gather: for every index p of ``out`` (rank <= 8),
    ``out[p] = x[base + sum_d src_d(p) * coef[d] + sum_k idx_k(p) * index_coef[k]]`` where
    ``src_d(p) = p_d - lo[d]`` (or ``min(floor(p_d * nearest[d]), size[d] - 1)`` in fp32 where
    ``nearest[d]`` > 0: nearest-neighbour upsampling), ``idx_k(p)`` is ``inputs[k]`` (int32 /
    int64, a view over out's shape) plus ``index_size[k]`` when negative; an element with some
    ``src_d`` outside
    ``[0, size[d])`` is ``fill`` (padding). Offsets are in elements of x from its first element
    and may be negative (flip). Covers gather, index_select, embedding, advanced indexing, flip,
    constant padding, repeat and nearest upsampling."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "gather")

    kind: str
    x: View
    out: View
    base: int
    coef: tuple[int, ...]
    lo: tuple[int, ...]
    size: tuple[int, ...]
    nearest: tuple[float, ...] = ()
    inputs: tuple[View, ...] = ()
    index_coef: tuple[int, ...] = ()
    index_size: tuple[int, ...] = ()
    fill: float = 0.0


@dataclass(frozen=True)
class IotaSpec:
    """index.cuh's iota: ``out[i] = start + i * step`` over the elements of out in row-major
    order (``arange``), computed in double and stored in out's dtype."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "iota")

    kind: str
    out: View
    start: float
    step: float


@dataclass(frozen=True)
class ConvSpec:
    """``out = activation(conv(x, w) + bias)`` through st_conv (cuDNN): PyTorch's convolution
    over ``len(in_size)`` spatial dims, or its transposed form. x is [batch, in_channels,
    *in_size], w [out_channels, in_channels / groups, *kernel] ([in_channels, out_channels /
    groups, *kernel] when ``transposed``), out [batch, out_channels, *out_size]: all dense
    channels-first, in the storage type of ``policy`` (bias too: one value per output channel).
    ``activation``: ``none``, ``relu``, ``gelu`` (erf), ``gelu_tanh``, ``silu``, ``sigmoid``,
    ``tanh``. The workspace is the runtime's (per stream), the plan cached by shape."""

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

    @property
    def out_size(self) -> tuple[int, ...]:
        return tuple(self.out.shape[2:])


@dataclass(frozen=True)
class RecurrentSpec:
    """One layer of a recurrent module (both directions) through recurrent.cuh's persistent kernel:
    for every step t (direction 1 walking t from ``steps - 1`` down),
    ``gh = h W_hhᵀ + b_hh`` and ``(h, c) = cell(gx[d, t], gh, h, c)`` (:func:`stitchcuda.recurrent.
    cell`; ``mode`` ``lstm``, ``gru``, ``rnn_tanh``, ``rnn_relu``), written to ``out[t, :, d·H:(d+1)·H]``.

    ``gx`` [D, T, B, G·H] (last dim dense) holds ``x W_ihᵀ + b_ih`` for every step, computed before
    by the layer's input-projection GEMMs; ``w_hh`` / ``w_hh_r`` [G·H, H] dense; ``b_hh`` /
    ``b_hh_r`` [G·H] or None; ``h0`` / ``c0`` [D, B, H] (None: zeros); ``out`` [T, B, D·H]; ``hn``
    / ``cn`` [D, B, H] the final state (None: not written); any strides. All in the storage type of
    ``policy``; the state stays fp32 (``workspace``: 2·D·B·H floats for the steps' exchange)."""

    JSON_TAG: ClassVar[tuple[str, str]] = ("kind", "recurrent")

    kind: str
    policy: str
    mode: str
    steps: int
    batch: int
    hidden: int
    directions: int
    gx: View
    w_hh: View
    out: View
    workspace: View
    w_hh_r: View | None = None
    b_hh: View | None = None
    b_hh_r: View | None = None
    h0: View | None = None
    c0: View | None = None
    hn: View | None = None
    cn: View | None = None


TaskSpec = Union[GemmSpec, EwSpec, RowSpec, AxisSpec, AttentionSpec, AttentionMaskBlocksSpec, CopySpec,
                 BnStatsSpec, GroupStatsSpec, PoolSpec, ScanSpec, ArgSpec, GatherSpec, IotaSpec, ConvSpec,
                 RecurrentSpec]


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
    ceilings: Ceilings
    inputs: tuple[IOSpec, ...]
    outputs: tuple[IOSpec, ...]
    weights: tuple[IOSpec, ...]
    buffers: tuple[Buffer, ...]
    tasks: tuple[Task, ...]
    node_costs: tuple[NodeCost, ...]
    arena_bytes: int
    cuda_graph: bool
    notes: tuple[str, ...] = ()
    generator: str = GENERATOR
    constraints: Constraints = Constraints()

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

    # -------------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        d = to_jsonable(self)
        d["schema"] = SCHEMA
        return d

    def to_json(self, indent: int | None = 1) -> str:
        return json.dumps(self.to_dict(), indent=indent, allow_nan=False)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Plan":
        if d.get("schema") != SCHEMA:
            raise ValueError(f"not a {SCHEMA} plan (schema={d.get('schema')!r})")
        return from_jsonable(cls, {k: v for k, v in d.items() if k != "schema"})

    @classmethod
    def from_json(cls, text: str) -> "Plan":
        return cls.from_dict(json.loads(text))

    def task(self, name: str) -> Task:
        for t in self.tasks:
            if t.name == name:
                return t
        raise KeyError(f"plan {self.name} has no task {name!r}; tasks: {', '.join(t.name for t in self.tasks)}")

    # -------------------------------------------------------------- text

    def __str__(self) -> str:
        c = self.ceilings
        head = (f"plan {self.name}: policy {self.policy}, {len(self.tasks)} task(s) "
                f"({len(self.create_tasks)} at create), arena {fmt_bytes(self.arena_bytes)}, "
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


class PlanError(ArgumentError):
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


def fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


__all__ = ["SCHEMA", "GENERATOR", "ARENA_ALIGN", "EwInstr", "EpOp", "GemmSpec", "EwSpec", "RowSpec", "AxisSpec",
           "AttentionSpec", "AttentionMaskBlocksSpec", "CopyItem", "CopySpec", "BnStatsSpec", "GroupStatsSpec",
           "PoolSpec", "ScanSpec", "ArgSpec", "GatherSpec", "IotaSpec", "ConvSpec", "RecurrentSpec", "TaskSpec", "Buffer",
           "Task", "NodeCost", "IOSpec", "Plan", "PlanError", "fmt_bytes"]
