"""One host, several workers: no compile runs while a worker times.

PyTorch's baselines (eager, and ``torch.compile`` in its default mode) launch their kernels from
Python one at a time, so their times depend on the host's CPUs. In a suite of three workers on one
host, torch.compile's time for the same model moved by up to 1.8x between two runs, both ways,
while other workers' nvcc and inductor compiles shared the CPUs; the programs, replaying CUDA
graphs from the native runner, moved by under 5 % (BENCHMARKS.md, "The zoo and the performance set
again"). A ratio taken in one process is still unfair when the baseline alone is starved.

When ``STITCHCUDA_HOST_LOCK`` names a file (``stitchcuda bench`` sets it for its workers: one file
in the cache, shared by every suite on the host), a timing loop holds the host alone (:func:`quiet`) and a compile holds it
shared (:func:`busy`): a timing loop waits for the compiles in flight, and no new compile starts
while it waits (a turnstile: a stream of compiles cannot starve it). Without the variable both
are free. Locks are ``flock`` on the file (released by the kernel when a process dies); a wait
longer than ``MAX_WAIT_S`` gives up and goes on unlocked, and says so.

Several workers on one GPU (``stitchcuda bench --per-gpu N``): each also has ``STITCHCUDA_GPU_LOCK``
naming its GPU's file, and whatever runs on the GPU holds that GPU alone (:func:`gpu_alone`): a
verification child from its start to its end (its trials, its runtime's first-call tuning, its
timing), the interpreter's TF32 model, a task check. So one worker's trials never run beside
another's timing or tuning, while the other workers' CPU work (capture, planning, nvcc) overlaps
it; their compiles still wait for a timing loop as above.

What a process waited for its GPU in all is :func:`gpu_waited`: an ``optimize`` budget is of the loop's
own work, and :func:`own_clock` (its clock) leaves those waits out. Counted in, a worker's loop spent
its budget queued behind its neighbours' verifications: mobilenet_v1's guided precision repair waited
122 s of its 120 for the GPU two other workers were timing on, and ended with nothing verified.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
import time
from dataclasses import dataclass
from typing import Iterator

ENV = "STITCHCUDA_HOST_LOCK"
GPU_ENV = "STITCHCUDA_GPU_LOCK"

#: Seconds a worker waits for the host before it goes on without it (a compile can take minutes).
MAX_WAIT_S = 600.0

#: Seconds a worker waits for its GPU: as long as a problem may take (a verification can take many minutes).
GPU_MAX_WAIT_S = 3600.0

_held = [0]  # this process's depth: a compile inside a timing window (or the reverse) does not wait for itself
_gpu_held = [0]  # the same for its GPU
_gpu_waited = [0.0]  # seconds this process waited for its GPU, in all (gpu_waited)


@dataclass
class Held:
    """What a holder waited: ``seconds``; ``acquired`` False when it gave up waiting or no lock is set."""

    seconds: float = 0.0
    acquired: bool = False


def _take(path: str, mode: int, deadline: float) -> int | None:
    """An fd of ``path`` locked in ``mode``, or None at the deadline."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.02)


@contextlib.contextmanager
def _hold(env: str, depth: list[int], exclusive: bool, max_wait_s: float, turnstile: bool = True) -> Iterator[Held]:
    """The lock file ``env`` names, shared or ``exclusive`` (behind the turnstile where there is one),
    counted in this process's ``depth``: a nested hold does not wait for its own process."""
    path = os.environ.get(env, "")
    fds: tuple[int | None, ...] = ()
    held = Held()
    if path and not depth[0]:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        t0 = time.monotonic()
        deadline = t0 + max_wait_s
        gate = _take(path + ".gate", fcntl.LOCK_EX, deadline) if turnstile else None
        main = _take(path, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH, deadline) \
            if gate is not None or not turnstile else None
        if gate is not None and not exclusive:
            os.close(gate)  # a compile passes the turnstile; a timing loop keeps it until it is done
            gate = None
        fds, held = (main, gate), Held(time.monotonic() - t0, main is not None)
    depth[0] += 1
    try:
        yield held
    finally:
        depth[0] -= 1
        for fd in fds:
            if fd is not None:
                os.close(fd)


def quiet(max_wait_s: float = MAX_WAIT_S) -> contextlib.AbstractContextManager[Held]:
    """The host alone for a timing loop (see the module docstring)."""
    return _hold(ENV, _held, True, max_wait_s)


def busy(max_wait_s: float = MAX_WAIT_S) -> contextlib.AbstractContextManager[Held]:
    """The host shared, for a compile (see the module docstring)."""
    return _hold(ENV, _held, False, max_wait_s)


@contextlib.contextmanager
def gpu_alone(what: str = "GPU work", max_wait_s: float = GPU_MAX_WAIT_S) -> Iterator[Held]:
    """This process alone on its GPU, where ``GPU_ENV`` names the GPU's lock file (see the module
    docstring); free without it. A wait past ``max_wait_s`` goes on unlocked: ``acquired`` False.
    A wait of a second or more, or giving up, is said on stderr (a suite worker's log), with ``what``."""
    with _hold(GPU_ENV, _gpu_held, True, max_wait_s, turnstile=False) as held:
        _gpu_waited[0] += held.seconds
        if held.seconds >= 1.0:
            print(f"[gpu] {what} waited {held.seconds:.0f} s for the GPU that other workers share"
                  + ("" if held.acquired else "; gave up waiting: it runs beside them, its times are not alone"),
                  file=sys.stderr, flush=True)
        yield held


def gpu_waited() -> float:
    """Seconds this process has waited for its GPU (:func:`gpu_alone`) since it started."""
    return _gpu_waited[0]


def own_clock() -> float:
    """A monotonic clock that stands still while this process waits for its GPU: the seconds of its
    own work (the module docstring)."""
    return time.monotonic() - _gpu_waited[0]


__all__ = ["ENV", "GPU_ENV", "MAX_WAIT_S", "GPU_MAX_WAIT_S", "Held", "quiet", "busy", "gpu_alone", "gpu_waited",
           "own_clock"]
