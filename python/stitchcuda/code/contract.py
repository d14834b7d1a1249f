"""The task seam: what one task's function receives and must produce.

``contract(plan, task)`` gives a :class:`TaskContract`: the C++ function every implementation
of the task defines — the template's, a hand-written one, an LLM's — with one typed pointer per
tensor the task reads or writes (each already offset to the tensor's first element, with its
dtype, shape and strides in elements), the stream, and what the body must do (the reference
nodes it covers, the spec it implements). The generated program calls the function with the
plan's buffers; ``code(..., overrides={task: source})`` puts another body in its place and
``check_task`` checks one alone.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from typing import Any, Iterator

from .. import kinds
from ..dtypes import SIZES as _SIZES
from ..dtypes import ctype as _ctype
from ..kinds.cxx import ident
from ..layout import View
from ..serial import to_jsonable
from ..plan.specs import Buffer, Plan, Task


@dataclass(frozen=True)
class Param:
    """One pointer argument of a task's function."""

    name: str          # C identifier in the signature
    role: str          # "in" (read), "out" (written), "scratch" (workspace: written and read, contents undefined)
    dtype: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]  # in elements
    buffer: str        # the plan's buffer
    buffer_kind: str   # input / output / weight / const / arena
    offset: int        # elements from the buffer's start
    tensor: str        # the graph tensor the buffer holds ("" for scratch)
    field: str         # the spec field it comes from ("a", "inputs[1]", "items[0].dst", ...)

    @property
    def ctype(self) -> str:
        return _ctype(self.dtype)

    @property
    def decl(self) -> str:
        const = "const " if self.role == "in" else ""
        return f"{const}{self.ctype}* {self.name}"

    @property
    def footprint(self) -> int:
        """Elements from the first to one past the last the view can touch."""
        if not self.shape or any(d == 0 for d in self.shape):
            return 0 if self.shape and any(d == 0 for d in self.shape) else 1
        return 1 + sum((d - 1) * abs(s) for d, s in zip(self.shape, self.strides))


@dataclass(frozen=True)
class TaskContract:
    plan: str
    task: str
    function: str
    strategy: str
    phase: str
    covers: tuple[str, ...]
    params: tuple[Param, ...]
    aliases: tuple[tuple[str, str], ...]  # pairs of params whose memory overlaps
    policy: str
    spec: str                             # the task's spec, as JSON (what the template implements)
    note: str = ""

    @property
    def signature(self) -> str:
        args = ", ".join([p.decl for p in self.params] + ["cudaStream_t stream"])
        return f"st_status {self.function}({args})"

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"task {self.task} has no parameter {name!r}")

    def describe(self) -> str:
        """The contract as text: for people, for generated comments and for LLM prompts."""
        lines = [f"Task {self.task} of program {self.plan} ({self.strategy}, "
                 f"{'run once at create' if self.phase == 'create' else 'run on every call'}), "
                 f"precision policy {self.policy}.",
                 f"Covers reference nodes: {', '.join(self.covers) or '(layout only)'}.",
                 "Implement exactly this function:",
                 f"  {self.signature}",
                 "Pointers (each points at the tensor's first element; strides are in elements; "
                 "inputs must not be written):"]
        for p in self.params:
            what = {"in": "reads", "out": "writes", "scratch": "scratch (contents undefined on entry)"}[p.role]
            src = f"{p.buffer_kind} {p.tensor}" if p.tensor else p.buffer_kind
            lines.append(f"  {p.name}: {what} {p.dtype} shape [{', '.join(map(str, p.shape))}] "
                         f"strides [{', '.join(map(str, p.strides))}] ({src})")
        if self.aliases:
            lines.append("Aliasing: " + "; ".join(f"{a} and {b} share memory" for a, b in self.aliases) +
                         " (each element is read before it is written).")
        lines += ["Run all device work on `stream` (asynchronously; never synchronise the device or use the "
                  "legacy default stream); return ST_OK, or an st_status error after st_set_error(...).",
                  "All math is fp32 (storage may be 16-bit); the result must match the reference within the "
                  "policy's tolerance on any valid input."]
        if self.note:
            lines.append(f"Note: {self.note}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["signature"] = self.signature
        return d


# ---------------------------------------------------------------------- views of a spec


def spec_views(spec: Any) -> Iterator[tuple[str, View, str]]:
    """Every tensor view of a task spec as (field, view, role), in a fixed order: reads, then
    writes, then scratch (which fields a kind writes and uses as scratch: its ``writes`` and
    ``scratch``)."""
    kind = kinds.of_spec(spec)
    reads, writes, scratch = [], [], []
    for f in dataclasses.fields(spec):
        v = getattr(spec, f.name)
        if isinstance(v, View):
            (writes if f.name in kind.writes else scratch if f.name in kind.scratch else reads).append((f.name, v))
        elif isinstance(v, tuple) and v and isinstance(v[0], View):
            reads.extend((f"{f.name}[{i}]", x) for i, x in enumerate(v))
        elif isinstance(v, tuple) and v and dataclasses.is_dataclass(v[0]) and hasattr(v[0], "src"):
            for i, it in enumerate(v):  # copy items
                reads.append((f"{f.name}[{i}].src", it.src))
                writes.append((f"{f.name}[{i}].dst", it.dst))
    for f, v in reads:
        yield f, v, "in"
    for f, v in writes:
        yield f, v, "out"
    for f, v in scratch:
        yield f, v, "scratch"


def param_name(field: str) -> str:
    """``inputs[1]`` -> ``in1``, ``items[0].dst`` -> ``dst0``, ``out`` -> ``out``."""
    if field.startswith("inputs["):
        return "in" + field[7:-1]
    if field.startswith("items["):
        i, _, part = field[6:].partition("].")
        return f"{part}{i}"
    return {"o": "out"}.get(field, field)


def contract(plan: Plan, task: Task | str) -> TaskContract:
    """The contract of ``task`` (a task of ``plan``, or its name)."""
    t = plan.task(task) if isinstance(task, str) else task
    bufs = {b.name: b for b in plan.buffers}
    params = []
    for field, v, role in spec_views(t.params):
        b: Buffer = bufs[v.buffer]
        params.append(Param(param_name(field), role, v.dtype, v.shape, v.strides, b.name, b.kind, v.offset,
                            b.source, field))
    aliases = []
    for i, a in enumerate(params):
        for c in params[i + 1:]:
            if a.buffer == c.buffer and _overlap(a, c):
                aliases.append((a.name, c.name))
    policy = getattr(t.params, "policy", plan.policy)
    spec = json.dumps(to_jsonable(t.params), separators=(",", ":"))
    return TaskContract(plan.name, t.name, function_name(t.name), t.strategy, t.phase, t.covers, tuple(params),
                        tuple(aliases), policy, spec, t.note)


def function_name(task: str) -> str:
    """The C++ name of a task's function."""
    return ident(task) or "_"


def _overlap(a: Param, b: Param) -> bool:
    n_a, n_b = a.footprint * _size(a.dtype), b.footprint * _size(b.dtype)
    sa, sb = a.offset * _size(a.dtype), b.offset * _size(b.dtype)
    return sa < sb + n_b and sb < sa + n_a


def _size(dtype: str) -> int:
    return _SIZES[dtype]


__all__ = ["Param", "TaskContract", "contract", "spec_views", "param_name", "function_name"]

