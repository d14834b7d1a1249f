"""``arange`` through index.cuh's iota: ``out[i] = start + i * step``, once at create unless it is
a graph output.
"""


from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from .. import ops
from ..dtypes import ctype
from ..ir import Node
from ..layout import View
from . import cxx
from .base import ClaimRule, Proto, TaskKind, view_bytes

A = ops.A


HEADER = "index.cuh"


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
class IotaProto(Proto):
    out: str = ""
    start: float = 0.0
    step: float = 1.0


# ---------------------------------------------------------------------- claim


def claim(cx) -> None:
    """Claim every free iota node, in graph order."""
    ix = cx.ix
    for n in sorted(ix.nodes.values(), key=lambda m: ix.pos[m.name]):
        if ops.kind(n.op) == "iota" and cx.free(n):
            _iota(cx, n)


def _iota(cx, n: Node) -> None:
    ix = cx.ix
    start = float(n.attr("start", 0) or 0)
    step = float(n.attr("step", 1) if n.attr("step") is not None else 1)
    out = n.outputs[0].name
    phase = "run" if out in ix.graph_outputs else "create"
    cx.claim(IotaProto(cx.name([n.name]), (n.name,), (out,), (), phase, out=out, start=start, step=step))


# ---------------------------------------------------------------------- lower


def lower(lw, pr: IotaProto, pre: list) -> None:
    vo = lw.out_view(pr, pr.out, lambda tv: tv.ndim == 1 and tv.strides[0] >= 0)
    spec = IotaSpec("iota", vo, float(pr.start), float(pr.step))
    lw.add(pr, pr.name, spec, [], [vo], touched=[pr.out])


# ---------------------------------------------------------------------- cost, interpret, render


def cost(spec: IotaSpec, ceil) -> tuple[float, float, float]:
    return float(math.prod(spec.out.shape)), float(view_bytes(spec.out)), ceil.fp32


def interpret(mem, s: IotaSpec) -> None:
    import torch

    n = s.out.shape[0] if s.out.ndim else 1
    mem.write(s.out, s.start + torch.arange(n, dtype=torch.float64, device=mem.device) * s.step)


def render(t, i: IotaSpec, n, fn: str) -> tuple[list[str], list[str]]:
    size = i.out.shape[0] if i.out.ndim else 1
    stride = i.out.strides[0] if i.out.ndim else 1
    call = (f"stitch::launch_iota<{ctype(i.out.dtype)}>({n('out')}, {size}, {stride}, {cxx.dlit(i.start)}, "
            f"{cxx.dlit(i.step)}, stream)")
    return cxx.include(HEADER), cxx.call(t.name, call)


KIND = TaskKind("iota", IotaSpec, "elementwise_kernel", cost, interpret, render, lowers=((IotaProto, lower),),
                claims=(ClaimRule("fuse", 190, claim),), scratch=frozenset())

__all__ = ["IotaSpec", "IotaProto", "KIND"]
