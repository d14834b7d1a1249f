"""``check_task``: one task's body checked alone, before the whole program is verified.

Takes a plan, a task and a body (an override's source, or None for the template's) — and, to run
it, the graph and weights; gives a :class:`TaskCheck` verdict. Never raises for the candidate's
faults: a body that does not define its contract function, does not compile, breaks a static
rule, crashes, or computes something else is a verdict with the reason.

1. **contract**: the body defines the task's :class:`~stitchcuda.code.contract.TaskContract`
   function (the Coder refuses it otherwise);
2. **static**: the Verifier's static rules over the whole program with the body in place (no
   PyTorch, no dynamic loading, no state kept between calls, ...);
3. **build**: the program with the body in place, plus one exported entry that calls the task's
   function alone, through the build cache (nvcc: works without a GPU);
4. **run** (GPU): the plan interpreter (:mod:`.interp`) runs the program on fresh random inputs up
   to the task and gives the task's real input buffers and its expected outputs; the body runs on
   those inputs on the GPU (outputs poisoned first), and every output it must write is compared
   with the interpreter's at the policy's tolerance (NaN never passes, unwritten elements fail),
   with inputs checked unchanged; several trials, fresh inputs each.

Without a GPU, a task stops after *build* with ``ran=False``: "compiled, not run" is never
"passed". With ``source=None`` the CPU can still check the template's semantics: the whole plan
interpreted against the reference graph (float64) — the model the GPU run compares bodies with.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .. import build as _build
from ..code import CodeError, Override, code, contract
from ..code.contract import TaskContract
from ..ir import Graph
from ..plan.specs import Plan
from ..precision import get as get_policy


@dataclass(frozen=True)
class TaskCheck:
    """The verdict on one task body. ``stage`` is where it stopped (contract, static, build, run,
    compare, done); ``ran`` whether the body ran on a device."""

    task: str
    ok: bool
    stage: str
    reason: str
    ran: bool = False
    device: str = "cpu"
    trials: int = 0
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    tolerance: float = 0.0
    seconds: float = 0.0
    compile_output: str = ""
    findings: tuple[str, ...] = ()
    seeds: tuple[int, ...] = field(default=())

    def __str__(self) -> str:
        state = "passed" if self.ok else "FAILED"
        return f"task {self.task}: {state} at {self.stage} ({self.device}): {self.reason}"


def _harness(c: TaskContract) -> str:
    """An exported entry calling the task's function alone: pointers in contract order."""
    args = ", ".join(f"static_cast<{'const ' if p.role == 'in' else ''}{p.ctype}*>(ptrs[{i}])"
                     for i, p in enumerate(c.params))
    sep = ", " if args else ""
    return (f'\nextern "C" ST_API st_status st_check_task(void* const* ptrs, void* stream) {{\n'
            f"  return task::{c.function}({args}{sep}static_cast<cudaStream_t>(stream));\n}}\n")


def check_task(plan: Plan, task: str, source: str | Override | None = None, *, graph: Graph,
               weights: Mapping[str, Any] | None = None, device: str = "auto", trials: int = 3, seed: int | None = None,
               arch: str | None = None, cache: Any = None) -> TaskCheck:
    """Check the body ``source`` (None: the template's) of task ``task`` of ``plan`` alone; see
    the module docstring. ``graph`` is the graph the plan was made from; ``weights`` (name ->
    tensor) are needed to run (random ones are drawn when None). ``device``: ``"auto"`` (the
    GPU when there is one), ``"cpu"`` (stop after the build), ``"cuda"``."""
    t0 = time.monotonic()
    tol = get_policy(plan.policy).tolerance

    def verdict(ok: bool, stage: str, reason: str, **kw: Any) -> TaskCheck:
        return TaskCheck(task, ok, stage, reason, tolerance=tol, seconds=time.monotonic() - t0, **kw)

    try:
        c = contract(plan, task)
    except KeyError as e:
        return verdict(False, "contract", str(e.args[0]))
    tol = get_policy(c.policy).tolerance
    overrides = {task: source} if source is not None else {}
    try:
        prog = code(plan, graph, None, overrides=overrides)
    except CodeError as e:
        return verdict(False, "contract", str(e))
    text = prog.program_cu + _harness(c)

    from ..verifier.static import check_source

    bad = [f for f in check_source(prog.program_cu, manifest=prog.manifest) if f.severity == "reject"]
    if bad:
        return verdict(False, "static", "; ".join(f"{f.rule}: {f.message}" for f in bad[:5]),
                       findings=tuple(str(f) for f in bad))

    res = _build.build(text, arch=arch, cache=cache, name=f"{plan.name}_{c.function}_check", policy=plan.policy)
    if not res.ok:
        out = res.compile.output if res.compile is not None else res.message
        reason = "does not compile: " + res.message if res.compile is not None else f"could not build: {res.message}"
        return verdict(False, "build", reason, compile_output=out)

    use_gpu = device == "cuda" or (device == "auto" and _has_gpu())
    if not use_gpu:
        return verdict(False, "build", "compiled; not run (no GPU): a body is correct only once it has run",
                       compile_output=res.compile.output if res.compile else "")
    from ..hostlock import gpu_alone

    with gpu_alone("a task check"):  # workers sharing a GPU take turns on it (hostlock.py)
        return _run(plan, c, graph, weights, res.library, trials, seed, tol, verdict)


#: A test seam: when set, called on each trial just before the body's inputs are copied and its
#: outputs poisoned on the current stream (a GPU test queues a long sleep there, so a body stream
#: that does not wait for those copies reads them unfinished).
HOLD_CURRENT_STREAM: Callable[[], None] | None = None


def _has_gpu() -> bool:
    from ..device import has_gpu

    return has_gpu()


def _run(plan: Plan, c: TaskContract, graph: Graph, weights, library: str, trials: int, seed: int | None,
         tol: float, verdict) -> TaskCheck:
    import torch

    from .interp import TORCH, Simulator

    dev = torch.device("cuda")
    lib = ctypes.CDLL(library)
    fn = lib.st_check_task
    fn.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
    fn.restype = ctypes.c_int
    rng = torch.Generator().manual_seed(seed if seed is not None else int(time.time_ns() % 2**31))
    seeds = tuple(int(torch.randint(0, 2**31 - 1, (1,), generator=rng)) for _ in range(trials))
    weights = dict(weights) if weights is not None else random_values(graph.weights, seeds[0], scale_by_fan_in=True)
    worst_abs = worst_rel = 0.0
    stream = torch.cuda.Stream(dev)
    for k, s in enumerate(seeds):
        inputs = [x.to(dev) for x in random_values(graph.inputs, s).values()]
        sim = Simulator(plan, device="cuda")
        sim.create({n: w.to(dev) for n, w in weights.items()})
        before, after = sim.around(c.task, inputs, {n: w.to(dev) for n, w in weights.items()})
        # The body's own copy of every buffer it touches: what the interpreter had before the task;
        # what it must write poisoned (unless it also reads it: in place).
        read = {p.buffer for p in c.params if p.role == "in"}
        if HOLD_CURRENT_STREAM is not None:
            HOLD_CURRENT_STREAM()
        bufs = {p.buffer: before.bufs[p.buffer].clone() for p in c.params}
        for p in c.params:
            if p.role != "in" and p.buffer not in read:
                bufs[p.buffer].fill_(0xFF)
        ptrs = (ctypes.c_void_p * max(len(c.params), 1))(*[
            bufs[p.buffer].data_ptr() + p.offset * torch.empty((), dtype=TORCH[p.dtype]).element_size()
            for p in c.params])
        # the copies and the poison above were queued on the current stream; the body's stream
        # (non-blocking) must see them done, or it reads half-copied inputs and its writes are
        # overwritten by the poison
        stream.wait_stream(torch.cuda.current_stream(dev))
        status = fn(ptrs, ctypes.c_void_p(stream.cuda_stream))
        try:
            stream.synchronize()
        except RuntimeError as e:  # an illegal address or a trap in the body
            return verdict(False, "run", f"trial {k}: the body crashed: {e}", ran=True, device="cuda", trials=k,
                           seeds=seeds)
        if status != 0:
            return verdict(False, "run", f"trial {k}: the body returned status {status}", ran=True, device="cuda",
                           trials=k, seeds=seeds)
        for p in c.params:
            if p.role == "in" and not any(q.buffer == p.buffer and q.role != "in" for q in c.params):
                if not torch.equal(bufs[p.buffer], before.bufs[p.buffer]):
                    return verdict(False, "compare", f"trial {k}: input {p.name} was written", ran=True, device="cuda",
                                   trials=k + 1, seeds=seeds)
        for p in c.params:
            if p.role != "out":
                continue
            got = _view(bufs[p.buffer], p).to(torch.float64)
            want = _view(after.bufs[p.buffer], p).to(torch.float64)
            nan = torch.isnan(got) & ~torch.isnan(want)
            err = (got - want).abs()
            bad = nan | (err > tol + tol * want.abs()) | (torch.isnan(got) != torch.isnan(want))
            if err.numel():
                finite = err[~torch.isnan(err)]
                if finite.numel():
                    worst_abs = max(worst_abs, float(finite.max()))
                    rel = finite / (want.abs()[~torch.isnan(err)] + 1e-30)
                    worst_rel = max(worst_rel, float(rel.max()))
            if bool(bad.any()):
                i = int(bad.reshape(-1).nonzero()[0])
                return verdict(False, "compare", f"trial {k} (seed {s}): output {p.name} differs at flat index {i}: "
                                                 f"{float(got.reshape(-1)[i]):.6g} vs {float(want.reshape(-1)[i]):.6g} "
                                                 f"(tol {tol:g}); {int(bad.sum())} of {bad.numel()} elements wrong",
                               ran=True, device="cuda", trials=k + 1, max_abs_err=worst_abs, max_rel_err=worst_rel,
                               seeds=seeds)
    return verdict(True, "done", f"{len(seeds)} trials on fresh inputs match the plan interpreter within {tol:g}",
                   ran=True, device="cuda", trials=len(seeds), max_abs_err=worst_abs, max_rel_err=worst_rel, seeds=seeds)


def _view(raw, p):
    import torch

    from .interp import TORCH

    size = torch.empty((), dtype=TORCH[p.dtype]).element_size()
    flat = raw[: raw.numel() // size * size].view(TORCH[p.dtype])
    # A buffer may be a slice of the arena: offsets count from the slice's start.
    return torch.as_strided(flat, p.shape, p.strides, flat.storage_offset() + p.offset)


def random_values(specs, seed: int, scale_by_fan_in: bool = False) -> dict:
    """Fresh values for tensors of these specs: normal floats, small integers, random bools.
    ``scale_by_fan_in``: floats of two or more dims scaled by 1 / sqrt(fan-in) and vectors by
    0.1, as layers are initialised (unit-variance weights make activations grow a hundredfold per
    layer, and then fp32 rounding alone exceeds 1e-4 on outputs that cancel)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    out = {}
    for s in specs:
        dt = getattr(torch, s.dtype)
        if dt.is_floating_point:
            x = torch.randn(s.shape, generator=g)
            if scale_by_fan_in and len(s.shape) >= 2:
                x = x / math.sqrt(max(1, math.prod(s.shape[1:])))
            elif scale_by_fan_in:
                x = x * 0.1
            out[s.name] = x.to(dt)
        elif dt == torch.bool:
            out[s.name] = torch.rand(s.shape, generator=g) < 0.5
        else:
            out[s.name] = torch.randint(0, 8, s.shape, generator=g).to(dt)
    return out


def check_plan_semantics(plan: Plan, graph: Graph, weights: Mapping[str, Any] | None = None, seed: int = 0) -> tuple[bool, float]:
    """The whole plan interpreted on the CPU against the reference graph in float64 (what the
    templates' bodies are checked against is right): (within the policy's tolerance, max error)."""
    import torch

    from ..evaluate import evaluate_graph
    from .interp import simulate

    weights = dict(weights) if weights is not None else random_values(graph.weights, seed, scale_by_fan_in=True)
    inputs = random_values(graph.inputs, seed + 1)
    got = simulate(plan, weights, list(inputs.values()))
    want = evaluate_graph(graph, {k: v.double() if v.is_floating_point() else v for k, v in inputs.items()},
                          {k: v.double() if v.is_floating_point() else v for k, v in weights.items()})
    tol = get_policy(plan.policy).tolerance
    worst = 0.0
    ok = True
    for g, w in zip(got, want):
        g, w = g.to(torch.float64), w.to(torch.float64)
        err = (g - w).abs()
        worst = max(worst, float(err.max()) if err.numel() else 0.0)
        ok = ok and bool(((err <= tol + tol * w.abs()) & ~torch.isnan(g)).all())
    return ok, worst


__all__ = ["TaskCheck", "check_task", "check_plan_semantics"]
