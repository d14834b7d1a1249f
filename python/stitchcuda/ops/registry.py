"""The registry's types and tables: ATen operators and the elementwise instructions they lower to.

Two kinds of entry:

* :class:`Instr` — one fp32 operation of generated elementwise code: its C++ expression (the
  only spelling of its numerics in the project: the Coder renders it, the op harness compiles it
  for the host and the device), its PyTorch reference (float64; the plan interpreter and the
  tests evaluate it), its cost, the domain its tests sample, and the runtime epilogue op
  (``st_ep_kind``) that computes the same function inside a GEMM's epilogue chain, if any.
* :class:`AtenOp` — one ATen overload the planner maps: its kind (which pass takes it), its
  tensor arguments in schema order, its cost per output element, and for elementwise operators
  how a node lowers to instructions.

:func:`elementwise` adds both at once: adding a unary or binary elementwise op is one call.
Entries are added when :mod:`stitchcuda.ops` is imported; :func:`registered` adds some for the
length of a ``with`` block (tests).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Sequence

A = "aten."

#: Kinds of ATen operator, by the planner pass that takes them.
KINDS = ("elementwise", "view", "gemm", "row", "batch_norm", "attention", "cat", "group_norm", "arg", "pool", "scan",
         "gather", "iota", "scatter", "conv", "recurrent")


EwArg = str  # "a<k>": input k, "t<k>": instruction k's result, "c<k>": the instruction's const k


@dataclass(frozen=True)
class EwInstr:
    """One fp32 operation of a generated elementwise expression: instruction ``op`` (an
    :class:`Instr`'s name) over ``args`` (:data:`EwArg` references) and constants ``consts``."""

    op: str
    args: tuple[str, ...]
    consts: tuple[float, ...] = ()


@dataclass(frozen=True)
class EpOp:
    """One op of the runtime's fused GEMM epilogue chain: ``st_ep_kind`` name without ``ST_EP_``."""

    kind: str
    a: float = 0.0
    b: float = 0.0


@dataclass(frozen=True)
class Domain:
    """Where an instruction's tests sample: uniform in [lo, hi] (per operand), plus the IEEE
    edge values when ``edges``; ``integers`` rounds samples (ops defined on integers, bools)."""

    lo: float = -6.0
    hi: float = 6.0
    edges: bool = True
    integers: bool = False


@dataclass(frozen=True)
class Instr:
    name: str
    arity: int
    c: str                                  # C++ expression over {0}, {1}, {2} (fp32)
    ref: Callable[..., Any]                 # PyTorch reference over float64 tensors
    flops: int = 1
    domain: Domain = Domain()
    epilogue: str | None = None             # st_ep_kind (without ST_EP_) computing the same function
    #: The epilogue op's (a, b) from the instruction's constants; None: it cannot take these
    #: constants. Default: the constants themselves.
    epilogue_params: Callable[[tuple[float, ...]], tuple[float, ...] | None] | None = None


@dataclass(frozen=True)
class AtenOp:
    name: str                               # "aten.relu.default"
    kind: str                               # one of KINDS
    args: tuple[str, ...] = ("self",)       # tensor arguments, schema order
    flops: int = 1                          # cost-model FLOPs per output element
    lower: Callable[..., Any] | str | None = None   # elementwise: how a node becomes instructions
    chain: bool = False                     # may join a GEMM's epilogue chain (elementwise, one operand)


INSTRS: dict[str, Instr] = {}
ATEN: dict[str, AtenOp] = {}
_version = [0]


def version() -> int:
    """Bumped on every change of the tables (derived sets are cached per version)."""
    return _version[0]


def add_instr(i: Instr) -> Instr:
    if i.name in INSTRS and INSTRS[i.name] != i:
        raise ValueError(f"instruction {i.name!r} is registered already")
    INSTRS[i.name] = i
    _version[0] += 1
    return i


def add_aten(op: AtenOp) -> AtenOp:
    if op.kind not in KINDS:
        raise ValueError(f"{op.name}: kind {op.kind!r} is not one of {', '.join(KINDS)}")
    if op.name in ATEN and ATEN[op.name] != op:
        raise ValueError(f"ATen operator {op.name!r} is registered already")
    ATEN[op.name] = op
    _version[0] += 1
    return op


def elementwise(name: str, c: str, ref: Callable[..., Any], *, aten: Sequence[str] | None = None, arity: int = 1,
                flops: int = 1, domain: Domain = Domain(), epilogue: str | None = None,
                epilogue_params: Callable[[tuple[float, ...]], tuple[float, ...] | None] | None = None,
                args: Sequence[str] | None = None, lower: Callable[..., Any] | str | None = None,
                chain: bool | None = None) -> Instr:
    """Register instruction ``name`` and the ATen overloads ``aten`` that compute it directly
    (default: ``aten.<name>.default`` for a unary op; ``()``: none). ``lower`` (default: the
    instruction applied to the schema's tensor arguments in order) says how a node of those
    overloads becomes instructions (see :mod:`.elementwise`); ``chain`` (default: when the
    instruction has an ``epilogue``) lets such a node join a GEMM's epilogue chain."""
    ins = add_instr(Instr(name, arity, c, ref, flops, domain, epilogue, epilogue_params))
    names = list(aten) if aten is not None else ([f"{A}{name}.default"] if arity == 1 else [])
    for a in names:
        add_aten(AtenOp(a, "elementwise", tuple(args) if args is not None else (("self",) if arity == 1 else
                                                                                   ("self", "other")),
                        flops, lower if lower is not None else name,
                        chain=bool(epilogue) if chain is None else chain))
    return ins


@contextlib.contextmanager
def registered(*entries: Callable[[], Any]) -> Iterator[None]:
    """Run each registering callable, and take what it added out again afterwards."""
    before_i, before_a = dict(INSTRS), dict(ATEN)
    try:
        for e in entries:
            e()
        yield
    finally:
        INSTRS.clear()
        INSTRS.update(before_i)
        ATEN.clear()
        ATEN.update(before_a)
        _version[0] += 1


__all__ = ["A", "KINDS", "Domain", "Instr", "AtenOp", "INSTRS", "ATEN", "version", "add_instr", "add_aten",
           "elementwise", "registered"]
