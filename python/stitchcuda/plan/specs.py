"""The plan's data: buffers, tasks and the :class:`Plan` every later stage reads.

Takes nothing and does nothing: these are the frozen, JSON-serialisable values the planner's
passes produce (:mod:`.lower` builds the tasks, :mod:`.schedule` the buffers' offsets) and the
Coder, the plan interpreter (:mod:`stitchcuda.check`), the Verifier and the loop read. A task's
spec (its kind's: :mod:`stitchcuda.kinds`) says exactly what it computes over which
:class:`~stitchcuda.layout.View` of which buffer; nothing downstream decides a layout, a leading
dim or a precision again.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..device import Ceilings
from ..errors import ArgumentError
from ..ir import DTYPE_SIZES
from ..kinds import TaskSpec
from ..serial import from_jsonable, to_jsonable
from .constraints import Constraints

SCHEMA = "stitchcuda.plan/2"
GENERATOR = "stitchcuda.plan (deterministic passes)"
ARENA_ALIGN = 256


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


__all__ = ["SCHEMA", "GENERATOR", "ARENA_ALIGN", "TaskSpec", "Buffer", "Task", "NodeCost", "IOSpec", "Plan", "PlanError",
           "fmt_bytes"]
