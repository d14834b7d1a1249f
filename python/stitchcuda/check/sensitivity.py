"""Where TF32 hurts a program: each rounding task's share of its outputs' error, by the plan interpreter.

A deep net that fails at tf32 fails by accumulation: every convolution or GEMM rounds its
operands to 10 mantissa bits, and some layers amplify what the earlier ones lost. Raising every
such task to fp32 verifies but costs the speed; a bisection over them on the GPU costs a build and
a verification per step. The interpreter (:mod:`.interp`, float64 math, each buffer stored in its
own dtype) can say where the error comes from at a fraction of that: run the plan once exactly,
once per suspect task with only that task's operands at TF32, and order the suspects by the error
each alone gives the outputs (as a ratio to the policy's bound, ``atol + tol |ref|`` with the
Verifier's ``atol``). The fewest of the worst are then raised so that the rest, still at TF32,
stay within ``target`` of the bound (a binary search over how many, each step one run).

It is a model, not the verdict: the GPU's verification of the candidate decides. Its size is not
the GPU's either: tensor cores round fp32 operands to TF32 by the library's choice (to nearest, or
by dropping bits), and the model rounds to nearest. On the CPU, with the Verifier's draw, the model
of mobilenet_v1 gave 3.2x the bound where the GPU's program gave 2.8x, but efficientnet_b0's 0.8x
where the GPU's gave 3.0x (dropping the bits instead: 10.7x and 20x). So where the GPU's own
error is known (``observed``: the failing candidate's worst element over its bound) and above the
model's, the model is scaled up to it: the tasks left at TF32 must stay within ``target`` of the
bound after the scaling (a model above the GPU is not scaled down).
Where one run per suspect would take too long (ResNet-101: 105 suspects at 0.9 s a run on an H200),
the suspects are taken in groups of consecutive tasks in plan order (neighbours in depth), as many
groups as the time allows, each group at TF32 alone; the fewest of the worst groups are raised.
When the model sees almost nothing (every suspect at TF32 under ``VISIBLE`` of the bound: no
structure to scale, or more than ``MAX_SCALE`` times below the GPU's error: the wrong structure),
or without ``observed`` does not show the failure, or cannot run even two groups in time,
:func:`tf32_sensitivity` says so and the loop raises every suspect, as before.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

#: The fraction of the policy's bound the tasks left at TF32 may use in the model (the rest is the
#: margin for what the model does not see: other inputs, other draws, the kernels' own order).
TARGET = 0.5

#: Seconds the analysis may take before it gives up (estimated from the exact run's time).
TIME_LIMIT_S = 90.0

#: Below this share of the bound (every suspect at TF32) the model shows too little to scale.
VISIBLE = 0.05

#: The most the model is scaled up to the GPU's error. Further off, it does not see the failure's
#: cause, and its order of the tasks is no guide: on the GPU, mobilenet_v1's model on the captured
#: weights gave 0.13x where the program gave 2.6x; scaled x20, it raised 13 of 14 convolutions and
#: left at TF32 the one that alone gives 2.0x on the Verifier's draw (the candidate failed).
MAX_SCALE = 5.0


@dataclass(frozen=True)
class Sensitivity:
    """``alone``: suspect -> the error ratio of the outputs with only it at TF32 (most sensitive
    first); ``every``: with every suspect at TF32; ``raise_``: the fewest suspects whose raising
    brings the rest within ``target`` (empty with ``why`` when the model cannot say); ``rest``:
    the ratio with every suspect but those at TF32; ``runs``, ``seconds``: what it cost."""

    alone: tuple[tuple[str, float], ...]
    every: float
    raise_: tuple[str, ...]
    rest: float
    target: float
    runs: int
    seconds: float
    why: str = ""
    scale: float = 1.0  # the GPU's observed error over the model's (1: not scaled)
    groups: int = 0     # suspects judged in this many groups of consecutive tasks (0: one by one)

    def describe(self) -> str:
        if not self.raise_:
            return f"the interpreter cannot guide the repair: {self.why}"
        scaled = (f", scaled x{self.scale:.2g} to the GPU's {self.every * self.scale:.2g}x" if self.scale != 1.0 else "")
        grouped = (f", judged in {self.groups} groups of consecutive tasks (one run each: too many suspects for one "
                   "run a task)" if self.groups else "")
        return (f"the interpreter's TF32 model: every rounding task at TF32 gives {self.every:.2g}x the bound{scaled}; "
                f"all but {len(self.raise_)} of {len(self.alone)} give {self.rest:.2g}x in the model{grouped} "
                f"(most sensitive alone: {', '.join(f'{t} {r:.2g}x' for t, r in self.alone[:3])})")


def runs_needed(units: int) -> int:
    """Interpreter runs of an analysis over ``units`` (tasks or groups): exact, every suspect, each
    unit alone, then the binary search over how many to raise."""
    return 2 + units + max(1, units).bit_length()


def consecutive_groups(items: Sequence[str], n: int) -> list[tuple[str, ...]]:
    """``items`` in order, cut into ``n`` runs of consecutive items whose sizes differ by at most one."""
    n = max(1, min(n, len(items)))
    size, extra = divmod(len(items), n)
    out, i = [], 0
    for k in range(n):
        j = i + size + (1 if k < extra else 0)
        out.append(tuple(items[i:j]))
        i = j
    return out


def error_ratio(outs: Sequence[Any], exact: Sequence[Any], tol: float) -> float:
    """The worst element's error over the Verifier's bound ``atol + tol |ref|``, over every output."""
    import torch

    from ..verifier.run.compare import atol_for, bound, output_scale

    worst = 0.0
    for o, e in zip(outs, exact):
        if not o.is_floating_point() or o.numel() == 0:
            continue
        o64, e64 = o.double(), e.double()
        fin = torch.isfinite(e64)
        lim = bound(e64.abs(), tol, atol_for(tol, output_scale(e)))
        err = torch.where(fin, (o64 - e64).abs(), torch.zeros_like(e64))
        if bool((fin & ~torch.isfinite(o64)).any()):
            return float("inf")
        worst = max(worst, float((err / lim).max()))
    return worst


def tf32_sensitivity(plan: Any, weights: Mapping[str, Any], inputs: Sequence[Any], suspects: Sequence[str], *,
                     tol: float, target: float = TARGET, device: str = "cpu", observed: float | None = None,
                     time_limit_s: float = TIME_LIMIT_S, max_runs: int | None = None) -> Sensitivity:
    """See the module docstring. ``suspects``: run-phase task names of ``plan`` whose products
    the policy rounds; ``weights`` by source name, ``inputs`` in the plan's order; ``observed``:
    the GPU's error over the bound, when known; ``max_runs``: the runs allowed (default: as many
    as ``time_limit_s`` holds at the exact run's time)."""
    from .interp import Simulator

    t0 = time.monotonic()
    sim = Simulator(plan, device)
    sim.create({k: v.to(device) for k, v in weights.items()})
    xs = [x.to(device) for x in inputs]
    exact = sim.run(xs)
    runs = 1
    once = time.monotonic() - t0

    def ratio(rounded: Sequence[str]) -> float:
        nonlocal runs
        runs += 1
        return error_ratio(sim.run(xs, tf32=frozenset(rounded)), exact, tol)

    def give_up(why: str, alone=(), every: float = 0.0) -> Sensitivity:
        return Sensitivity(tuple(alone), every, (), every, target, runs, time.monotonic() - t0, why)

    allowed = max_runs if max_runs is not None else int(time_limit_s / max(once, 1e-9))
    units = len(suspects)
    while units > 2 and runs_needed(units) > allowed:
        units -= 1
    if runs_needed(units) > allowed:  # (two groups at the least: one group is every suspect)
        return give_up(f"{len(suspects)} suspects at {once:.1f} s a run: not even two groups of them fit "
                       f"{time_limit_s:.0f} s" if max_runs is None else f"{len(suspects)} suspects in {allowed} runs")
    groups = consecutive_groups(list(suspects), units)
    every = ratio(suspects)
    if observed is not None and observed > 1.0 and every >= VISIBLE:
        scale = max(1.0, observed / every)  # only ever stricter: a model above the GPU keeps its own margin
        if scale > MAX_SCALE:
            return give_up(f"with every suspect at TF32 the model's outputs give {every:.2g}x the bound where the "
                           f"GPU's give {observed:.2g}x: it sees too little of the failure to say which tasks cause it",
                           every=every)
    elif every > 1.0:
        scale = 1.0
    else:
        return give_up(f"with every suspect at TF32 the model's outputs are within the bound ({every:.2g}x)"
                       + (f", the GPU's {observed:.2g}x" if observed else "") + ": it does not show the failure",
                       every=every)
    target = target / scale
    # each group (a task, or consecutive tasks) at TF32 alone, the most sensitive first
    by_group = sorted(((g, ratio(g)) for g in groups), key=lambda p: -p[1])
    order = [g for g, _ in by_group]

    def tasks(gs) -> list[str]:
        return [t for g in gs for t in g]

    # the fewest of the most sensitive to raise: binary search over how many (the rest stay at TF32)
    lo, hi, rest = 0, len(order), {len(order): 0.0}
    while lo < hi:
        mid = (lo + hi) // 2
        r = ratio(tasks(order[mid:]))
        rest[mid] = r
        if r <= target:
            hi = mid
        else:
            lo = mid + 1
    alone = tuple((t, r) for g, r in by_group for t in g)  # a task: its group's ratio
    return Sensitivity(alone, every, tuple(tasks(order[:lo])), rest[lo], target, runs, time.monotonic() - t0,
                       scale=scale, groups=len(groups) if len(groups) < len(suspects) else 0)


__all__ = ["Sensitivity", "tf32_sensitivity", "error_ratio", "consecutive_groups", "runs_needed", "TARGET", "VISIBLE",
           "MAX_SCALE"]
