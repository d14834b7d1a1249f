"""Memory that grows with the number of calls: a leak, judged as a verdict, not a warning.

A program that allocates on every call and never frees (device memory, pinned host memory, the
runtime's host pool) runs out in deployment after enough calls, however right its outputs. The
check (:func:`leak_check`): warm-up calls first (a program may size its arena, plans and graphs on its
first calls), a reading, ``n`` calls, a reading, ``n`` more calls, a reading; memory that grew over
both stretches, by at least :data:`DEVICE_BYTES` (device) or :data:`HOST_BYTES` (host resident or
pinned, the runtime's pool) over the second, grows with the number of calls. ``n`` is as many calls
as fit in the time budget at the warm-up calls' pace (10 to 2000), so a leak of a few KiB per call
shows on a fast program and one of 100 KiB on a slow one.

The readings are the runner's (:meth:`..run.native.RemoteRunner.memory`: the runner process's own
device memory where NVML names that process (:mod:`.gpu_processes`), else the device's free memory;
the runner process's resident and pinned bytes, the runtime's pool; nothing else runs in that
process while it calls) or, in the Verifier's own process, the device memory PyTorch does not hold.
A reading of the whole device moves with every other process on it: a leak failed there names the
scope, so that a shared GPU is suspected first.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from ..report.verdict import DynamicCheck

#: Growth over the second stretch of calls that is a leak (with growth over the first too).
DEVICE_BYTES = 1 << 20
HOST_BYTES = 4 << 20

MiB = float(1 << 20)


@dataclass(frozen=True)
class MemoryReading:
    """Bytes in use now; None where this runner cannot say."""

    device: int | None = None  # device memory in use (the runner's own, or total - free, or beyond PyTorch's)
    host: int | None = None  # resident host memory of the process running the program
    pinned: int | None = None  # page-locked host memory of that process, and the runtime's host pool
    device_scope: str = "device"  # "process": the runner's own, from NVML (.gpu_processes); "device": everyone's

    def minus(self, other: "MemoryReading") -> "MemoryReading":
        def d(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else a - b

        # two readings of different scopes do not subtract: no device figure for that stretch
        device = d(self.device, other.device) if self.device_scope == other.device_scope else None
        return MemoryReading(device, d(self.host, other.host), d(self.pinned, other.pinned), self.device_scope)


def calls_for(per_call_s: float, budget_s: float = 2.0, lo: int = 10, hi: int = 2000) -> int:
    """Calls per stretch: two stretches in about ``budget_s``."""
    if per_call_s <= 0:
        return hi
    return int(max(lo, min(hi, budget_s / (2 * per_call_s))))


def leak_check(calls: Callable[[int], None], read: Callable[[], MemoryReading], *, n: int | None = None,
               warmup: int = 5, budget_s: float = 2.0, clock: Callable[[], float] = time.monotonic) -> DynamicCheck:
    """The ``memory_leak`` check (module docstring); ``calls(k)`` makes ``k`` program calls and waits
    for them, ``read()`` reads the memory in use. ``n`` (calls per stretch) defaults to what fits
    ``budget_s`` at the warm-up calls' pace."""
    t0 = clock()
    calls(warmup)
    if n is None:
        n = calls_for((clock() - t0) / max(warmup, 1), budget_s, lo=10)
    r0 = read()
    t0 = clock()
    calls(n)
    r1 = read()
    calls(n)
    r2 = read()
    seconds = clock() - t0
    first, second = r1.minus(r0), r2.minus(r1)
    leaks = []
    for what, limit in (("device", DEVICE_BYTES), ("host", HOST_BYTES), ("pinned", HOST_BYTES)):
        a, b = getattr(first, what), getattr(second, what)
        if a is None or b is None:
            continue
        if b >= limit and a >= limit // 2:
            leaks.append(f"{what} memory grew by {a / MiB:.1f} MiB over {n} calls, then by {b / MiB:.1f} MiB over "
                         f"{n} more ({b / n / 1024:.1f} KiB per call)")
    if leaks:
        shared = " (read over the whole device: another process on it moves this figure too)" \
            if r2.device_scope == "device" and any(x.startswith("device") for x in leaks) else ""
        return DynamicCheck("memory_leak", "fail", "; ".join(leaks) + ": it grows with the number of calls" + shared)
    seen = [w for w in ("device", "host", "pinned") if getattr(second, w) is not None]
    scope = {"process": " (device: the runner process's own)", "device": " (device: the whole device's)"}
    return DynamicCheck("memory_leak", "pass", f"{2 * n} calls after {warmup} warm-up calls ({seconds:.1f} s): "
                                               f"{', '.join(seen) or 'no'} memory flat"
                                               + (scope.get(r2.device_scope, "") if second.device is not None else ""))


__all__ = ["MemoryReading", "leak_check", "calls_for", "DEVICE_BYTES", "HOST_BYTES"]
