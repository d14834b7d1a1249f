"""Protos: tasks before layouts are known — what each computes, over which graph tensors.

*match* and *fuse* produce them (one typed proto per kind of task, frozen); *place*, *order* and
*lower* read them; :class:`Fused` is what the front half of the planner hands the back half.
Every proto names the reference (or synthetic) nodes it covers, the tensors it materialises and
the tensors it reads, and its phase (``create``: computed once from weights).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Union

from .graph import GraphIndex
from .specs import EpOp, EwInstr


@dataclass(frozen=True)
class Operand:
    """A GEMM operand: a graph tensor, read transposed (``linear``'s weight) or not."""

    tensor: str
    transposed: bool = False


@dataclass(frozen=True)
class ChainStep:
    """One step of a GEMM's epilogue chain, in reference order: ``scale`` / ``div`` by
    ``value``, ``bias`` (per-column ``tensor``), ``residual`` (same-shape ``tensor`` times
    ``value``), or ``op`` (an :class:`EpOp`)."""

    kind: str
    value: float = 0.0
    tensor: str | None = None
    op: EpOp | None = None


@dataclass(frozen=True)
class Proto:
    name: str
    nodes: tuple[str, ...]   # covered nodes
    outs: tuple[str, ...]    # tensors it materialises
    ins: tuple[str, ...]     # tensors it reads
    phase: str = "run"

    #: Nodes whose inputs the task reads directly (an elementwise group's members).
    @property
    def reading_nodes(self) -> tuple[str, ...]:
        return ()


@dataclass(frozen=True)
class GemmProto(Proto):
    a: Operand = Operand("")
    b: Operand = Operand("")
    bias: str | None = None
    alpha: float = 1.0
    steps: tuple[ChainStep, ...] = ()
    out: str = ""
    policy: str = ""


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


@dataclass(frozen=True)
class RowProto(Proto):
    """A row reduction over the last ``k`` dims (after ``perm`` when the reduced dims were not
    trailing), with unary prologue / epilogue hooks (node names)."""

    op: str = ""
    x: str = ""
    out: str = ""
    k: int = 1
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()
    weight: str | None = None
    bias: str | None = None
    eps: float = 0.0
    correction: float = 1.0
    perm: tuple[int, ...] | None = None
    writes_row: bool = False
    strategy: str = "auto"
    #: The op's own transforms of one value (instructions on ``a0``), applied after the prologue
    #: hook and before the epilogue hook (a vector norm: |x|^p before a sum, ^(1/p) after it).
    op_pro: tuple[EwInstr, ...] = ()
    op_epi: tuple[EwInstr, ...] = ()


@dataclass(frozen=True)
class AxisProto(Proto):
    """A reduction over the contiguous run of dims ``d0:d1`` in the middle of x."""

    op: str = ""
    x: str = ""
    out: str = ""
    d0: int = 0
    d1: int = 0
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()
    op_pro: tuple[EwInstr, ...] = ()
    op_epi: tuple[EwInstr, ...] = ()


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


@dataclass(frozen=True)
class BnStatsProto(Proto):
    mode: str = "batch"
    x: str = ""
    weight: str | None = None
    bias: str | None = None
    rm: str | None = None
    rv: str | None = None
    eps: float = 0.0
    scale: str = ""
    shift: str = ""


@dataclass(frozen=True)
class CatProto(Proto):
    dim: int = 0
    parts: tuple[str, ...] = ()


@dataclass(frozen=True)
class GroupStatsProto(Proto):
    """Per-(sample, channel) scale and shift of a group norm (instance norm: one channel per
    group) from x [samples, groups * cpg, ...]; the affine itself is a synthetic elementwise node."""

    x: str = ""
    weight: str | None = None
    bias: str | None = None
    eps: float = 0.0
    samples: int = 1
    groups: int = 1
    cpg: int = 1
    scale: str = ""
    shift: str = ""


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


@dataclass(frozen=True)
class ScanProto(Proto):
    """An inclusive scan of x along ``dim`` (``reverse``: from the end), with hooks."""

    op: str = "sum"
    x: str = ""
    out: str = ""
    dim: int = 0
    reverse: bool = False
    pro: tuple[str, ...] = ()
    epi: tuple[str, ...] = ()


@dataclass(frozen=True)
class ArgProto(Proto):
    """The index of the first max / min of x along ``dim`` (None: of the flattened tensor)."""

    op: str = "max"
    x: str = ""
    out: str = ""
    dim: int | None = None


@dataclass(frozen=True)
class GatherProto(Proto):
    """A gather-like node (gather, index_select, embedding, index, flip, pad, repeat, nearest
    upsampling): *lower* reads the node's arguments; ``x`` the tensor read, ``indices`` the
    index tensors."""

    node: str = ""
    x: str = ""
    indices: tuple[str, ...] = ()
    out: str = ""


@dataclass(frozen=True)
class ScatterProto(Proto):
    """``out`` = ``x`` with the slice ``node`` names (slice_scatter / select_scatter) replaced by
    ``src``: two copies, the first skipped when out is written over x in place."""

    node: str = ""
    x: str = ""
    src: str = ""
    out: str = ""


@dataclass(frozen=True)
class IotaProto(Proto):
    out: str = ""
    start: float = 0.0
    step: float = 1.0


@dataclass(frozen=True)
class ConvProto(Proto):
    """``out = activation(conv(x, w) + bias)``: PyTorch's convolution (``transposed``: its
    transposed form) over the last ``len(stride)`` dims, with cuDNN's fused activation
    (``none``, ``relu``, ``gelu``, ``gelu_tanh``, ``silu``, ``sigmoid``, ``tanh``) taking the
    elementwise node(s) after it."""

    x: str = ""
    w: str = ""
    bias: str | None = None
    out: str = ""
    stride: tuple[int, ...] = ()
    padding: tuple[int, ...] = ()
    dilation: tuple[int, ...] = ()
    output_padding: tuple[int, ...] = ()
    transposed: bool = False
    groups: int = 1
    activation: str = "none"
    policy: str = ""


@dataclass(frozen=True)
class RecurrentProto(Proto):
    """One recurrent node (``nn.RNN`` / ``nn.GRU`` / ``nn.LSTM``; :class:`~stitchcuda.recurrent.
    Recurrence` says what it computes): per layer, one input-projection GEMM per direction and one
    persistent recurrent kernel. ``hn`` / ``cn`` are None when nobody reads them."""

    node: str = ""
    out: str = ""
    hn: str | None = None
    cn: str | None = None
    policy: str = ""


AnyProto = Union[GemmProto, EwProto, RowProto, AxisProto, AttnProto, BnStatsProto, CatProto, GroupStatsProto,
                 PoolProto, ScanProto, ArgProto, GatherProto, IotaProto, ScatterProto, ConvProto, RecurrentProto]


@dataclass(frozen=True)
class Fused:
    """The front half's result: the (frozen) graph index, every proto in claim order, which
    proto claimed each node, the tensors kept in float32 whatever the policy, and notes."""

    index: GraphIndex
    protos: tuple[AnyProto, ...]
    claimed: Mapping[str, int]
    keep_f32: frozenset[str] = frozenset()
    notes: tuple[str, ...] = ()
    policy: str = "fp32"
    node_policy: Mapping[str, str] = field(default_factory=dict)

    def tensor_storage(self, t: str, storage_of) -> str:
        """Storage dtype of a tensor: the policy's for float32, except fp32-kept tensors."""
        return "float32" if t in self.keep_f32 else storage_of(self.index.spec(t).dtype)


__all__ = ["Operand", "ChainStep", "Proto", "GemmProto", "EwProto", "RowProto", "AxisProto", "AttnProto",
           "BnStatsProto", "CatProto", "GroupStatsProto", "PoolProto", "ScanProto", "ArgProto", "GatherProto",
           "IotaProto", "ScatterProto", "ConvProto", "RecurrentProto", "AnyProto", "Fused"]
