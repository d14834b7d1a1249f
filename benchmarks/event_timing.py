"""Device times of a callable for the benchmark scripts (run as ``python benchmarks/<script>.py``,
which puts this folder on the path): CUDA events around each run, the L2 flushed before each when a
flush buffer is given (zeroing twice the L2 outside the timed region), after ``warmup`` untimed runs."""

from __future__ import annotations

import statistics
from typing import Callable


def event_times(fn: Callable[[], object], runs: int, flush=None, warmup: int = 0) -> list[float]:
    """Milliseconds of each of ``runs`` timed calls of ``fn``."""
    import torch

    for _ in range(warmup):
        fn()
    if warmup:
        torch.cuda.synchronize()
    times = []
    for _ in range(runs):
        if flush is not None:
            flush.zero_()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e))
    return times


def flushed_median_ms(fn: Callable[[], object], flush, runs: int, warmup: int = 0) -> float:
    """The median of :func:`event_times` with the L2 flushed before each run."""
    return statistics.median(event_times(fn, runs, flush, warmup))
