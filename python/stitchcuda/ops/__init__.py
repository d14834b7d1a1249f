"""The op registry: one entry per operator, read by every stage that needs to know one.

The frontend's support check (:func:`supported`), the planner (which pass takes a node:
:func:`kind`; schema arguments: :func:`args`; how an elementwise node becomes instructions:
:func:`lower`), the Coder (:func:`instr` ``.c``), the plan interpreter (``.ref``), the cost
model (``.flops``) and the op harness (``.domain``) all read these tables. Adding an elementwise
op is one :func:`~stitchcuda.ops.registry.elementwise` call; the tests cover it by themselves.

Modules: :mod:`.registry` (types and tables), :mod:`.elementwise`, :mod:`.structural`,
:mod:`.epilogue` (the runtime's GEMM epilogue ops).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Sequence

from .elementwise import Lowering, num  # (importing .elementwise registers its entries)
from . import pointwise  # (importing .pointwise registers the long tail of pointwise entries)
from .epilogue import EPILOGUES, EpKind
from .registry import A, ATEN, INSTRS, AtenOp, Domain, EpOp, EwInstr, Instr, elementwise, registered, version
from .structural import RESHAPES, TRANSPARENT  # (importing .structural registers its entries)

SDPA = A + "scaled_dot_product_attention.default"
CAT = A + "cat.default"


def aten(op: str) -> AtenOp | None:
    return ATEN.get(op)


def kind(op: str) -> str | None:
    """Which planner pass takes ``op`` (see :data:`~stitchcuda.ops.registry.KINDS`), or None."""
    e = ATEN.get(op)
    return e.kind if e is not None else None


def args(op: str, default: Sequence[str] = ("self",)) -> tuple[str, ...]:
    e = ATEN.get(op)
    return e.args if e is not None else tuple(default)


def instr(name: str) -> Instr:
    i = INSTRS.get(name)
    if i is None:
        raise KeyError(f"no elementwise instruction {name!r}")
    return i


@functools.lru_cache(maxsize=64)
def _of_kind(k: str, _v: int) -> frozenset[str]:
    return frozenset(n for n, e in ATEN.items() if e.kind == k)


def of_kind(k: str) -> frozenset[str]:
    return _of_kind(k, version())


@functools.lru_cache(maxsize=8)
def _supported(_v: int) -> frozenset[str]:
    return frozenset(n for n in ATEN if n.startswith(A))


def supported() -> frozenset[str]:
    """Every ATen overload some pass of the planner maps (the frontend's support check)."""
    return _supported(version())


def lower(node: Any, operands: dict[str, str], in_dtype: Callable[[int], str], arg_of: Callable[..., Any],
          base: int) -> list | None:
    """The instructions computing elementwise ``node`` (:class:`EwInstr`
    list, results numbered from ``base``; the last is the node's value), or None when its
    arguments are outside what the instructions compute. ``operands`` maps input tensors to
    references; ``arg_of(node, names)`` is the planner's schema-argument binding."""
    e = ATEN.get(node.op)
    if e is None or e.kind != "elementwise":
        return None
    a = arg_of(node, e.args)
    out: list = []

    def val(key: str):
        x = a.get(key)
        if x is None:
            v = node.attr(key)
            return None if v is None else num(v)
        return operands[x[1]] if x[0] == "t" else num(x[1])

    def emit(name: str, *xs: Any) -> str:
        if name not in INSTRS:
            raise KeyError(f"{node.op}: lowering emits unknown instruction {name!r}")
        refs, consts = [], []
        for x in xs:
            if isinstance(x, str):
                refs.append(x)
            else:
                refs.append(f"c{len(consts)}")
                consts.append(float(x))
        out.append(EwInstr(name, tuple(refs), tuple(consts)))
        return f"t{base + len(out) - 1}"

    lw = Lowering(node, val, emit, in_dtype)
    if isinstance(e.lower, str):
        emit(e.lower, *[val(k) for k in e.args])
        return out
    return out if e.lower(lw) else None


def epilogue_of(node: Any, in_dtype: Callable[[int], str], arg_of: Callable[..., Any]):
    """The runtime epilogue op (:class:`EpOp`) computing elementwise
    ``node`` applied to its only tensor operand, when the registry allows it in a GEMM's
    chain; else None."""
    e = ATEN.get(node.op)
    if e is None or not e.chain or len(node.inputs) != 1:
        return None
    ins = lower(node, {node.inputs[0]: "a0"}, in_dtype, arg_of, 0)
    if not ins or len(ins) != 1 or not ins[0].args or ins[0].args[0] != "a0":
        return None
    i = INSTRS[ins[0].op]
    if i.epilogue is None or any(not x.startswith("c") for x in ins[0].args[1:]):
        return None
    params = i.epilogue_params(ins[0].consts) if i.epilogue_params else ins[0].consts
    if params is None:
        return None
    params = tuple(params) + (0.0,) * (2 - len(params))
    return EpOp(i.epilogue, params[0], params[1])


__all__ = ["pointwise", "A", "SDPA", "CAT", "RESHAPES", "TRANSPARENT", "ATEN", "INSTRS", "AtenOp", "Instr", "Domain", "EwInstr", "EpOp", "EpKind", "EPILOGUES",
           "Lowering", "elementwise", "registered", "version", "aten", "kind", "args", "instr", "of_kind", "supported",
           "lower", "epilogue_of"]
