"""Timing: the program and its PyTorch baselines, by one harness, on one stream.

The program is timed where it runs (:class:`ProgramClock`): in the native runner's process, by the
runner, or in this one (:class:`LocalClock`); the baselines in this process, on the stream the
Verifier made. Method (MEASURING.md, "Time properly"): CUDA events (cuda-python's ``cuda.bindings.runtime``:
cudaEventCreate / cudaEventRecord / cudaEventSynchronize / cudaEventElapsedTime) recorded on the
program's stream around one call; before every trial the L2 cache is flushed by a
``cudaMemsetAsync`` over a buffer at least twice the L2 size, on the same stream and outside the
events; warm-up calls first (module load, plan creation, torch.compile's compilation stay out);
then trials until there are at least ``min_trials`` (100) *and* ``min_seconds`` (1 s) have passed,
whichever comes later, capped at ``max_seconds`` (10 s). The result is the median and the IQR.

The timed calls are checked (:class:`CallHooks`, filled by :mod:`..run.timed_calls`): what runs
between calls, outside the events, changes the inputs, refills the outputs and judges an
unannounced sample of the calls: the ``timed_calls`` dynamic check.

The reference is timed by the same loop on the same stream: eager fp32 (TF32 off), eager with the
program's precision allowed (TF32 flags for tf32, bf16/fp16 autocast), and ``torch.compile``
(default mode) at both, so every ratio in the report comes from one process run.

Every program's event time is checked against the host clock around device-wide synchronisations
(:func:`wall_check`, the ``hidden_work`` check): work enqueued on another stream — through the
runtime's own entry points or not — is invisible to the events on the caller's stream and visible
there. A speedup of more than 10x over the precision-matched baseline (the faster of eager and
torch.compile at the program's precision) is also re-checked: host wall-clock time per call with a
device-wide synchronise after it (work the events cannot see, e.g. on another stream, shows up
there), on fresh inputs with L2 flushed, outputs compared with the reference.

:func:`measure` and :func:`recheck_speedup` take the timer, flush and clock as arguments, so the
loop logic is tested on the CPU with fakes; :class:`EventTimer` and :class:`L2Flusher` are the
GPU parts.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Protocol

from ...hostlock import busy, quiet
from ..report.profile import Timing, TimingTable
from ..report.records import SpeedupRecheck, TimedCallCheck, TimingDetails, WallCheck

RECHECK_SPEEDUP = 10.0


# ------------------------------------------------------------------ the loop (device-agnostic)


@dataclass(frozen=True)
class LoopSettings:
    warmup_min_calls: int = 3
    warmup_seconds: float = 0.05
    warmup_max_calls: int = 50
    min_trials: int = 100
    min_seconds: float = 1.0
    max_seconds: float = 10.0
    min_samples: int = 3  # even past max_seconds


def measure(fn: Callable[[], Any], timer: Any, flush: Callable[[], None], settings: LoopSettings = LoopSettings(),
            clock: Callable[[], float] = time.perf_counter, calls: CallHooks | None = None
            ) -> tuple[Timing, int, list[float]]:
    """Warm up, then time ``fn`` once per trial with ``timer.time(fn) -> ms`` after ``flush()``.
    With ``calls``, ``calls.before()`` runs before every call (warm-up included),
    ``calls.after(k)`` after timed trial ``k`` and ``calls.finish()`` after the last, all outside the
    timed region.

    Returns (Timing, warm-up calls, samples in ms)."""
    t0 = clock()
    warm = 0
    while warm < settings.warmup_max_calls and (warm < settings.warmup_min_calls
                                                or clock() - t0 < settings.warmup_seconds):
        if calls is not None:
            calls.before()
        flush()
        timer.time(fn)
        warm += 1
    samples: list[float] = []
    start = clock()
    while True:
        if calls is not None:
            calls.before()
        flush()
        samples.append(timer.time(fn))
        if calls is not None:
            calls.after(len(samples) - 1)
        elapsed = clock() - start
        if len(samples) >= settings.min_trials and elapsed >= settings.min_seconds:
            break
        if elapsed >= settings.max_seconds and len(samples) >= settings.min_samples:
            break
    if calls is not None:
        calls.finish()
    return Timing.from_samples(samples), warm, samples


def recheck_speedup(program: "Callable[[], Any] | ProgramClock", baseline: Callable[[], Any], *,
                    program_event_ms: float, baseline_event_ms: float, baseline_name: str,
                    check_outputs: Callable[[], bool],
                    sync_device: Callable[[], None], flush: Callable[[], None], calls: int = 20,
                    clock: Callable[[], float] = time.perf_counter) -> SpeedupRecheck:
    """Host wall clock per call with a device-wide synchronise after it (module docstring).

    The program's wall time, less the overhead of an empty launch-and-synchronise, must stay within
    twice its event time plus 20 us: more means device work the stream's events did not see."""

    def wall(fn: Callable[[], Any]) -> float:
        xs = []
        for _ in range(calls):
            flush()
            sync_device()
            t = clock()
            fn()
            sync_device()
            xs.append((clock() - t) * 1e3)
        return statistics.median(xs)

    overhead = wall(lambda: None)
    if hasattr(program, "wall"):  # a ProgramClock: the program's own wall time, less its own overhead
        p_wall = statistics.median(program.wall() for _ in range(calls))
        p_wall += overhead - statistics.median(program.overhead() for _ in range(calls))
    else:
        p_wall = wall(program)
    b_wall = wall(baseline)
    outputs_ok = bool(check_outputs())
    hidden = p_wall - overhead - program_event_ms
    time_ok = hidden <= max(program_event_ms, 0.02)
    wall_speedup = (b_wall - overhead) / max(p_wall - overhead, 1e-6)
    event_speedup = baseline_event_ms / program_event_ms if program_event_ms > 0 else float("inf")
    reasons = []
    if not time_ok:
        reasons.append(f"{hidden:.3g} ms of each call is invisible to the stream's events (work on another stream "
                       "or on the host)")
    if not outputs_ok:
        reasons.append("outputs wrong on fresh inputs with L2 flushed")
    return SpeedupRecheck(baseline=baseline_name, event_speedup=event_speedup, wall_speedup=wall_speedup,
                          program_event_ms=program_event_ms, program_wall_ms=p_wall, baseline_wall_ms=b_wall,
                          overhead_ms=overhead, outputs_ok=outputs_ok, passed=time_ok and outputs_ok,
                          detail="; ".join(reasons))


class CallHooks(Protocol):
    """What runs around every timed call, outside the timed region (:class:`..run.timed_calls.TimedCalls`):
    ``before()`` before every call (warm-up included), ``after(k)`` after timed trial ``k``,
    ``finish()`` after the last one, ``result()`` what it found."""

    def before(self) -> None: ...
    def after(self, k: int) -> None: ...
    def finish(self) -> None: ...
    def result(self) -> TimedCallCheck: ...


class ProgramClock(Protocol):
    """How the program is timed, wherever it runs: ``time()`` is one call between two CUDA events on
    its stream, L2 flushed first; ``wall()`` one call between two device-wide synchronisations, by
    the host clock; ``overhead()`` the same around one empty kernel on the program's stream (all in
    ms). The overhead is a launch that must be waited for, not nothing: the latency of waking a host
    thread blocked on the device, and the device time-sliced with another process's work, inflate
    every wall time by the same few milliseconds, which an empty synchronise (~1 us) never shows and
    the events never see (seen on an H200: a 14 us program read 2.26 ms by the host clock, most
    likely while another process's kernels ran). The native runner answers all three in its own process
    (:class:`..run.native.RemoteRunner`); :class:`LocalClock` is a program called in this one."""

    where: str

    def time(self) -> float: ...
    def wall(self) -> float: ...
    def overhead(self) -> float: ...


class LocalClock:
    """A :class:`ProgramClock` over a callable that enqueues one call on ``stream`` in this process."""

    where = "in the Verifier's process"

    def __init__(self, fn: Callable[[], Any], timer: Any, flush: Callable[[], None], sync_device: Callable[[], None],
                 clock: Callable[[], float] = time.perf_counter, probe: Callable[[], Any] = lambda: None):
        self.fn, self.timer, self.flush, self.sync, self.clock = fn, timer, flush, sync_device, clock
        self.probe = probe  # one empty piece of device work on the program's stream (``overhead``)

    def time(self) -> float:
        self.flush()
        return self.timer.time(self.fn)

    def _wall(self, fn: Callable[[], Any]) -> float:
        self.sync()
        t = self.clock()
        fn()
        self.sync()
        return (self.clock() - t) * 1e3

    def wall(self) -> float:
        return self._wall(self.fn)

    def overhead(self) -> float:
        return self._wall(self.probe)


class _ClockTimer:
    """``measure``'s timer over a :class:`ProgramClock` (the clock flushes and times one call itself)."""

    def __init__(self, clock: ProgramClock):
        self.clock = clock

    def time(self, fn: Any) -> float:
        return self.clock.time()


#: Work hidden from the events: the wall time, less the synchronisations' own, beyond this multiple of
#: the event time and this many ms.
HIDDEN_FACTOR, HIDDEN_MS = 1.0, 0.05


def wall_check(clock: ProgramClock, event_ms: float, calls: int = 10) -> WallCheck:
    """The program's event time against its wall time around device-wide synchronisations (medians
    of ``calls``): more than ``HIDDEN_FACTOR`` x the event time and ``HIDDEN_MS`` beyond it is work the
    stream's events did not see (on another stream, the legacy default stream, the host)."""
    walls, over = [], []
    for _ in range(calls):  # interleaved: both see the same device and the same host
        walls.append(clock.wall())
        over.append(clock.overhead())
    wall, overhead = statistics.median(walls), statistics.median(over)
    hidden = wall - overhead - event_ms
    passed = hidden <= max(HIDDEN_FACTOR * event_ms, HIDDEN_MS)
    detail = "" if passed else (f"{hidden:.3g} ms of each call is invisible to CUDA events on the caller's stream "
                                f"(events {event_ms:.3g} ms, host clock around device-wide synchronisations "
                                f"{wall:.3g} ms, {overhead:.3g} ms of it an empty kernel's launch and wait): work "
                                "on another stream or on the host")
    return WallCheck(event_ms=event_ms, wall_ms=wall, overhead_ms=overhead, calls=calls, passed=passed, detail=detail)


def matched_baseline(table: TimingTable) -> tuple[str, Timing] | None:
    """The faster of eager and torch.compile at the program's precision."""
    cands = [(n, t) for n, t in (("eager at policy", table.eager_policy), ("torch.compile at policy",
                                                                            table.compile_policy)) if t is not None]
    return min(cands, key=lambda x: x[1].median_ms) if cands else None


# ------------------------------------------------------------------ GPU parts (cuda-python)


def _check(result: Any, what: str) -> Any:
    """cuda-python calls return (err, value...) tuples; raise on an error with its name."""
    from cuda.bindings import runtime as cudart

    err = result[0] if isinstance(result, tuple) else result
    if int(err) != int(cudart.cudaError_t.cudaSuccess):
        name = cudart.cudaGetErrorName(err)[1]
        raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    if isinstance(result, tuple):
        return result[1] if len(result) == 2 else result[1:]
    return None


class EventTimer:
    """A pair of CUDA events on ``stream`` (an int cudaStream_t); ``time(fn)`` -> milliseconds."""

    def __init__(self, stream: int, device: int = 0):
        from cuda.bindings import runtime as cudart

        self._rt = cudart
        _check(cudart.cudaSetDevice(device), "cudaSetDevice")
        self.stream = cudart.cudaStream_t(stream)
        self.start = _check(cudart.cudaEventCreate(), "cudaEventCreate")
        self.end = _check(cudart.cudaEventCreate(), "cudaEventCreate")

    def time(self, fn: Callable[[], Any]) -> float:
        rt = self._rt
        _check(rt.cudaEventRecord(self.start, self.stream), "cudaEventRecord")
        fn()
        _check(rt.cudaEventRecord(self.end, self.stream), "cudaEventRecord")
        _check(rt.cudaEventSynchronize(self.end), "cudaEventSynchronize")
        return float(_check(rt.cudaEventElapsedTime(self.start, self.end), "cudaEventElapsedTime"))

    def close(self) -> None:
        for ev in (self.start, self.end):
            self._rt.cudaEventDestroy(ev)


class L2Flusher:
    """A device buffer of at least twice the L2 size, overwritten by cudaMemsetAsync on ``stream``."""

    def __init__(self, stream: int, device: int = 0, nbytes: int | None = None):
        import torch
        from cuda.bindings import runtime as cudart

        self._rt = cudart
        _check(cudart.cudaSetDevice(device), "cudaSetDevice")
        l2 = int(_check(cudart.cudaDeviceGetAttribute(cudart.cudaDeviceAttr.cudaDevAttrL2CacheSize, device),
                        "cudaDeviceGetAttribute(L2CacheSize)"))
        self.l2_bytes = l2
        self.nbytes = nbytes or max(2 * l2, 32 << 20)
        self.buffer = torch.empty(self.nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        self.stream = cudart.cudaStream_t(stream)
        self._value = 0

    def __call__(self) -> None:
        self._value = (self._value + 1) & 0xFF
        _check(self._rt.cudaMemsetAsync(self.buffer.data_ptr(), self._value, self.nbytes, self.stream),
               "cudaMemsetAsync")

    def probe(self) -> None:
        """The least device work there is, on the stream: one byte set (``LocalClock.overhead``)."""
        _check(self._rt.cudaMemsetAsync(self.buffer.data_ptr(), self._value, 1, self.stream), "cudaMemsetAsync")


def precision_context(precision: str):
    """PyTorch allowed the program's precision (:meth:`stitchcuda.precision.Policy.baseline`)."""
    from ...precision import get

    return get(precision).baseline()


def time_all(program: "Callable[[], Any] | ProgramClock", model: Any, model_args: list[Any], *, precision: str,
             stream: Any, compile: bool = True, autotune: bool = False, settings: LoopSettings = LoopSettings(),
             recheck_outputs: Callable[[], bool] | None = None, log: Callable[[str], None] = lambda s: None,
             calls: CallHooks | None = None) -> tuple[TimingTable, TimingDetails]:
    """Time the program (its calls checked by ``calls``; a :class:`ProgramClock`, or a callable that
    enqueues one call on ``stream``) and the four baselines on ``stream`` (a torch.cuda.Stream), a fifth
    with ``autotune`` (``torch.compile(mode="max-autotune")`` at the policy), and check its event time
    against the host clock (:func:`wall_check`). GPU only."""
    import torch

    from ...precision import fp32_exact

    notes: list[str] = []
    sint = stream.cuda_stream
    dev = stream.device.index or 0
    timer = EventTimer(sint, dev)
    flush = L2Flusher(sint, dev)

    sync_device = lambda: torch.cuda.synchronize(dev)  # noqa: E731
    clock = program if hasattr(program, "wall") else LocalClock(program, timer, flush, sync_device,
                                                                 probe=flush.probe)

    def run_measure(fn: Callable[[], Any], what: str) -> tuple[Timing | None, int]:
        log(f"timing {what}")
        try:
            with quiet() as host, torch.cuda.stream(stream), torch.no_grad():
                if host.seconds >= 1.0:
                    notes.append(f"{what}: timed after {host.seconds:.0f} s waiting for other workers' compiles "
                                 "on this host to end" + ("" if host.acquired else " (gave up waiting: timed beside them)"))
                if what == "program":
                    t, warm, _ = measure(None, _ClockTimer(clock), lambda: None, settings, calls=calls)
                else:
                    t, warm, _ = measure(fn, timer, flush, settings)
            return t, warm
        except Exception as e:  # noqa: BLE001 - a baseline that fails is reported, the program's own error is not
            if what == "program":
                raise
            notes.append(f"{what}: not measured ({type(e).__name__}: {str(e)[:200]})")
            return None, 0

    prog, warm = run_measure(None, "program")
    assert prog is not None
    log("checking the program's event time against the host clock")
    with torch.cuda.stream(stream), torch.no_grad():
        walls = wall_check(clock, prog.median_ms)

    def eager(ctx):
        def fn():
            with ctx():
                model(*model_args)
        return fn

    eager32, _ = run_measure(eager(fp32_exact), "eager fp32")
    eager_pol = eager32 if precision == "fp32" else run_measure(eager(lambda: precision_context(precision)),
                                                                f"eager at {precision}")[0]
    comp32 = comp_pol = None
    comp_fn = None
    if compile:
        comp32, comp_fn = _time_compiled(model, model_args, fp32_exact, run_measure, "torch.compile fp32", notes)
        if precision != "fp32":
            comp_pol, comp_fn = _time_compiled(model, model_args, lambda: precision_context(precision), run_measure,
                                               f"torch.compile at {precision}", notes)
        else:
            comp_pol = comp32
    else:
        notes.append("torch.compile baselines not measured (disabled)")
    comp_auto = None
    if autotune:  # the strongest baseline: a user who wants speed asks torch.compile to autotune
        comp_auto, _ = _time_compiled(model, model_args, (lambda: precision_context(precision)) if precision != "fp32"
                                      else fp32_exact, run_measure, f"torch.compile max-autotune at {precision}", notes,
                                      mode="max-autotune")
    if precision == "fp32":
        notes.append("policy fp32: the 'at policy' rows are the fp32 rows")
    table = TimingTable(program=prog, eager_fp32=eager32, eager_policy=eager_pol, compile_fp32=comp32,
                        compile_policy=comp_pol, compile_autotune=comp_auto)
    matched = matched_baseline(table)
    recheck = None
    if matched is not None and table.speedup(matched[1]) and table.speedup(matched[1]) > RECHECK_SPEEDUP:
        name, base = matched
        base_fn = eager(lambda: precision_context(precision)) if name.startswith("eager") else comp_fn
        log("re-checking a speedup over 10x")
        with torch.cuda.stream(stream), torch.no_grad():
            recheck = recheck_speedup(clock, base_fn, program_event_ms=prog.median_ms,
                                      baseline_event_ms=base.median_ms, baseline_name=name,
                                      check_outputs=recheck_outputs or (lambda: True),
                                      sync_device=sync_device, flush=flush)
    timer.close()
    details = TimingDetails(stream=f"a fresh torch.cuda.Stream on cuda:{dev}", l2_flush_bytes=flush.nbytes,
                            warmup_calls=warm, min_trials=settings.min_trials, min_seconds=settings.min_seconds,
                            max_seconds=settings.max_seconds,
                            matched_baseline=matched[0].replace("at policy", f"at {precision}") if matched else "",
                            recheck=recheck, notes=tuple(notes),
                            timed_calls=calls.result() if calls is not None else None, wall=walls,
                            runner=getattr(clock, "where", ""))
    return table, details


def _call_in(fn: Callable[..., Any], args: list[Any], ctx: Callable[[], Any]) -> None:
    with ctx():
        fn(*args)


def _time_compiled(model, args, ctx, run_measure, what: str, notes: list[str], mode: str | None = None):
    """(Timing, the compiled callable) or (None, None) when compilation fails; ``mode`` is
    torch.compile's (None: its default)."""
    import torch

    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, mode=mode) if mode else torch.compile(model)
    except Exception as e:  # noqa: BLE001
        notes.append(f"{what}: torch.compile failed ({type(e).__name__}: {str(e)[:200]})")
        return None, None
    t0 = time.monotonic()
    try:
        with busy(), torch.no_grad():  # compile outside the timed loop, as a compile (hostlock.py)
            _call_in(compiled, args, ctx)
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        notes.append(f"{what}: compilation failed ({type(e).__name__}: {str(e)[:200]})")
        return None, None
    notes.append(f"{what}: compiled in {time.monotonic() - t0:.1f} s")
    fn = (lambda: _call_in(compiled, args, ctx))
    return run_measure(fn, what)[0], fn


__all__ = ["LoopSettings", "measure", "CallHooks", "ProgramClock", "LocalClock", "wall_check", "HIDDEN_FACTOR",
           "HIDDEN_MS", "recheck_speedup", "matched_baseline", "EventTimer", "L2Flusher",
           "precision_context", "time_all", "RECHECK_SPEEDUP"]
