"""The plan interpreter: every task spec executed over byte buffers on the CPU, as the GPU would.

Takes a :class:`~stitchcuda.plan.specs.Plan`, weights and inputs (PyTorch tensors); gives the
outputs — and, task by task, the state of every buffer (:meth:`Simulator.steps`), which is what
:func:`stitchcuda.check.check_task` compares one task's body against. The planner decides
layouts, leading dims, batch strides, fusion, epilogue order, in-place writes and arena offsets;
the Coder only spells them; this module runs the specs with PyTorch (math in float64, results
stored in each buffer's storage dtype) over one byte array per buffer — the arena is *one* byte
array, so two intermediates whose lifetimes the planner wrongly overlapped corrupt each other
here too. Outputs are poisoned with NaN and the arena filled with garbage before every run, so
reading what was not written in this run shows up.

Each task runs by its kind's interpreter (:mod:`stitchcuda.kinds`: ``interpret(mem, spec)``),
which mirrors the semantics its template and the runtime document; elementwise instructions and
GEMM epilogue ops are evaluated by the op registry's PyTorch references (:mod:`stitchcuda.ops`).
It is a model of the plan, not of the kernels: the kernels are checked against it.
"""

from __future__ import annotations

import math
from typing import Collection, Mapping, Sequence

import torch

from .. import kinds
from .. import ops
from .. import plan as P
from ..layout import View
from ..ops import EwInstr

TORCH = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "bool": torch.bool,
         "uint8": torch.uint8, "int8": torch.int8, "int32": torch.int32, "int64": torch.int64, "float64": torch.float64}
F64 = torch.float64


def eval_instrs(instrs: Sequence[EwInstr], leaves: Sequence[torch.Tensor]) -> torch.Tensor:
    """An elementwise expression over float64 leaves, each instruction by its registry reference."""
    vals: list[torch.Tensor] = []

    def arg(a: str, ins: EwInstr) -> torch.Tensor:
        if a.startswith("a"):
            return leaves[int(a[1:])]
        if a.startswith("t"):
            return vals[int(a[1:])]
        return torch.tensor(float(ins.consts[int(a[1:])]), dtype=F64)

    for ins in instrs:
        vals.append(ops.instr(ins.op).ref(*[arg(a, ins) for a in ins.args]))
    return vals[-1] if vals else leaves[0]


def round_tf32(x: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to TF32 (10 mantissa bits, to nearest, ties to even), as tensor cores take fp32
    operands. The interpreter's own: its values are float64 at any scale. ``precision.round_tf32``
    is the hardware's ``cvt.rna`` on float32 tensors (ties away from zero) for the Verifier's
    emulation; the two differ only on exact ties."""
    m, e = torch.frexp(x)
    return torch.ldexp(torch.round(m * 2048.0) / 2048.0, e)


class Memory:
    """One byte array per buffer (the arena one array for all of its buffers), on ``device``.
    ``tf32``: the task running reads its float32 operands rounded to TF32 (a model of its products
    on tensor cores; its epilogue's operands are rounded too, so an upper bound)."""

    def __init__(self, plan: P.Plan, device: str = "cpu"):
        self.plan = plan
        self.device = torch.device(device)
        self.tf32 = False
        self.bufs: dict[str, torch.Tensor] = {}
        self.arena = torch.zeros(max(plan.arena_bytes, 1), dtype=torch.uint8, device=self.device)
        for b in plan.buffers:
            if b.kind == "arena":
                assert b.offset % P.ARENA_ALIGN == 0, f"{b.name} misaligned"
                assert b.offset + b.nbytes <= plan.arena_bytes, f"{b.name} outside the arena"
                self.bufs[b.name] = self.arena[b.offset:b.offset + b.nbytes]
            else:
                self.bufs[b.name] = torch.zeros(max(b.nbytes, 1), dtype=torch.uint8, device=self.device)

    def clone(self) -> "Memory":
        """An independent copy of every buffer (the arena stays one byte array)."""
        m = Memory.__new__(Memory)
        m.plan = self.plan
        m.device = self.device
        m.tf32 = self.tf32
        m.arena = self.arena.clone()
        m.bufs = {}
        for b in self.plan.buffers:
            m.bufs[b.name] = m.arena[b.offset:b.offset + b.nbytes] if b.kind == "arena" else self.bufs[b.name].clone()
        return m

    def typed(self, name: str, dtype: str) -> torch.Tensor:
        raw = self.bufs[name]
        size = torch.empty((), dtype=TORCH[dtype]).element_size()
        n = raw.numel() // size * size
        return raw[:n].view(TORCH[dtype])

    def view(self, v: View, shape: Sequence[int] | None = None, strides: Sequence[int] | None = None,
             offset: int = 0) -> torch.Tensor:
        flat = self.typed(v.buffer, v.dtype)
        shape = v.shape if shape is None else tuple(shape)
        strides = v.strides if strides is None else tuple(strides)
        if math.prod(shape) == 0:
            return torch.empty(shape, dtype=flat.dtype, device=flat.device)
        last = v.offset + offset + sum((d - 1) * s for d, s in zip(shape, strides))
        assert 0 <= v.offset + offset and last < flat.numel(), f"view {v.describe()} {shape}/{strides} out of bounds"
        return torch.as_strided(flat, shape, strides, flat.storage_offset() + v.offset + offset)

    def read(self, v: View, shape=None, strides=None, offset: int = 0) -> torch.Tensor:
        x = self.view(v, shape, strides, offset).to(F64)
        return round_tf32(x) if self.tf32 and v.dtype == "float32" else x

    def eval(self, instrs: Sequence[EwInstr], leaves: Sequence[torch.Tensor]) -> torch.Tensor:
        """An elementwise expression over float64 leaves, each instruction by its registry reference."""
        return eval_instrs(instrs, leaves)

    def hook(self, instrs: Sequence[EwInstr], x: torch.Tensor) -> torch.Tensor:
        """A reduction's hook (instructions on ``a0``) applied to ``x``; none: ``x`` itself."""
        return eval_instrs(instrs, [x]) if instrs else x

    def write(self, v: View, value: torch.Tensor, shape=None, strides=None, offset: int = 0) -> None:
        dst = self.view(v, shape, strides, offset)
        value = value.expand(dst.shape)
        if dst.dtype == torch.bool:
            value = value != 0
        elif not dst.dtype.is_floating_point:
            value = torch.trunc(value)
        dst.copy_(value.to(dst.dtype))


# ---------------------------------------------------------------------- tasks


def run_task(mem: Memory, t: P.Task) -> None:
    """Run one task's spec over ``mem``, by its kind's interpreter."""
    kinds.of_spec(t.params).interpret(mem, t.params)


# ---------------------------------------------------------------------- whole programs


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal element for element, NaN equal to NaN (an input holding NaN is unchanged too)."""
    return a.shape == b.shape and bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())


def _put(mem: Memory, name: str, value: torch.Tensor, dtype: str) -> None:
    flat = mem.typed(name, dtype)
    flat[: value.numel()].copy_(value.reshape(-1).to(flat.dtype))


class Simulator:
    """A program instance on the CPU: ``create(weights)`` then ``run(inputs) -> outputs``."""

    def __init__(self, plan: P.Plan, device: str = "cpu"):
        self.plan = plan
        self.mem = Memory(plan, device)

    def create(self, weights: Mapping[str, torch.Tensor]) -> None:
        for b in self.plan.buffers:
            if b.kind == "weight":
                _put(self.mem, b.name, weights[b.source].detach().to(F64 if b.dtype.startswith(("float", "bfloat"))
                                                                     else weights[b.source].dtype), b.dtype)
        for t in self.plan.create_tasks:
            run_task(self.mem, t)

    def run(self, inputs: Sequence[torch.Tensor], garbage: float = float("nan"), tf32: Collection[str] = ()
            ) -> list[torch.Tensor]:
        """The outputs for ``inputs``; the tasks named in ``tf32`` read their float32 operands at
        TF32 (:class:`Memory`)."""
        plan = self.plan
        self.mem.arena.fill_(0xFF)  # NaN in every float type
        for b in plan.buffers:
            if b.kind == "input":
                _put(self.mem, b.name, inputs[b.index], b.dtype)
            elif b.kind == "output":
                self.mem.bufs[b.name].fill_(0xFF)
        before = [x.clone() for x in inputs]
        for t in plan.run_tasks:
            self.mem.tf32 = t.name in tf32
            run_task(self.mem, t)
        self.mem.tf32 = False
        for b in plan.buffers:
            if b.kind == "input":
                now = self.mem.typed(b.name, b.dtype)[: math.prod(b.shape)].reshape(b.shape)
                assert _same(now.to(inputs[b.index].dtype), before[b.index]), f"input {b.source} was written"
        outs = []
        for o in plan.outputs:
            b = next(x for x in plan.buffers if x.kind == "output" and x.source == o.tensor and
                     x.index == plan.outputs.index(o))
            outs.append(self.mem.typed(b.name, b.dtype)[: math.prod(b.shape)].reshape(b.shape).clone())
        return outs


    def around(self, task: str, inputs: Sequence[torch.Tensor], weights: Mapping[str, torch.Tensor] | None = None
               ) -> tuple[Memory, Memory]:
        """The memory just before and just after task ``task``. A run-phase task runs on
        ``inputs`` after the program was created; a create-phase one needs ``weights`` (the
        program is created again, up to it)."""
        plan = self.plan
        t = plan.task(task)
        if t.phase == "create":
            if weights is None:
                raise ValueError(f"task {task} runs at create: give the weights")
            for b in plan.buffers:
                if b.kind == "weight":
                    _put(self.mem, b.name, weights[b.source].detach().to(
                        F64 if b.dtype.startswith(("float", "bfloat")) else weights[b.source].dtype), b.dtype)
            todo = plan.create_tasks
        else:
            self.mem.arena.fill_(0xFF)
            for b in plan.buffers:
                if b.kind == "input":
                    _put(self.mem, b.name, inputs[b.index], b.dtype)
                elif b.kind == "output":
                    self.mem.bufs[b.name].fill_(0xFF)
            todo = plan.run_tasks
        for r in todo:
            if r.name == task:
                before = self.mem.clone()
                run_task(self.mem, r)
                return before, self.mem.clone()
            run_task(self.mem, r)
        raise AssertionError(f"task {task} not found in its phase")


def simulate(plan: P.Plan, weights: Mapping[str, torch.Tensor], inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    sim = Simulator(plan)
    sim.create(weights)
    sim.run(inputs)
    return sim.run(inputs)  # twice: the second run must not depend on the first


__all__ = ["Simulator", "simulate", "eval_instrs", "run_task", "Memory", "TORCH", "F64"]
