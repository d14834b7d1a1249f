"""What the GPU half of the Verifier measures besides verdicts and kernel records, as plain data.

Phase timings (how long verification itself took), the timing harness's settings and its >10x
re-check, the profile's per-task times, idle gaps and launch accounting, the reference's own
profile (top ops by CUDA time, for the Planner) and the program's memory use. Pure Python, like
:mod:`.profile`, so the report can be written and read back without a GPU or PyTorch.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PhaseTiming:
    """Seconds one phase of verification took (build, correctness, timing, profile, ...)."""

    name: str
    seconds: float
    part_of: str = ""  # a part of another phase (the correctness phase's by kind of work): not summed again


@dataclass(frozen=True)
class SpeedupRecheck:
    """A >10x speedup over the precision-matched baseline, timed again by the host clock with a
    device-wide synchronise after every call (so work hidden from the stream's events shows up)."""

    baseline: str
    event_speedup: float
    wall_speedup: float
    program_event_ms: float
    program_wall_ms: float
    baseline_wall_ms: float
    overhead_ms: float  # host wall time of an empty launch + synchronise, subtracted before comparing
    outputs_ok: bool
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class TimedCallCheck:
    """The timed calls' check (``run.timed_calls.TimedCalls``): of ``calls`` timed calls (warm-up
    included), ``checked`` were compared with the reference, ``failed`` of them wrong; the last one
    judged was call ``last_checked`` (1-based; the phase's last)."""

    calls: int
    checked: int
    failed: int
    detail: str = ""
    last_checked: int = 0
    wrong: int = 0  # checked calls wrong with the same inputs in fresh buffers too: wrong answers (trials), no cheat
    wrong_detail: str = ""

    @property
    def passed(self) -> bool:
        return self.failed == 0 and self.checked > 0

    def summary(self) -> str:
        if self.failed:
            return f"{self.failed} of {self.checked} checked timed calls wrong (of {self.calls}): {self.detail}"
        if self.wrong:
            return (f"{self.checked} of {self.calls} timed calls checked; {self.wrong} wrong, and wrong again with the "
                    "same inputs in fresh buffers: a wrong answer on that draw (among the trials), not a cheat")
        return f"{self.checked} of {self.calls} timed calls checked, all right"


@dataclass(frozen=True)
class WallCheck:
    """The program's time by CUDA events on its stream against the host clock around one call with a
    device-wide synchronise before and after (medians); work the events cannot see (on another
    stream, or the legacy default stream, through the runtime's own entry points or not) shows as
    the difference. Run for every program, not only for large speedups."""

    event_ms: float
    wall_ms: float
    overhead_ms: float
    calls: int
    passed: bool
    detail: str = ""


@dataclass(frozen=True)
class TimingDetails:
    """How the numbers in the TimingTable were taken."""

    stream: str = "a fresh torch.cuda.Stream"
    l2_flush_bytes: int = 0
    warmup_calls: int = 0
    min_trials: int = 100
    min_seconds: float = 1.0
    max_seconds: float = 10.0
    matched_baseline: str = ""  # the baseline the speedup check uses ("torch.compile at bf16", ...)
    recheck: SpeedupRecheck | None = None
    notes: tuple[str, ...] = ()
    timed_calls: TimedCallCheck | None = None
    wall: WallCheck | None = None
    runner: str = ""  # where the program ran: "native runner (no Python in its process)" or "in process"


@dataclass(frozen=True)
class ProfiledTaskTime:
    """Device time of one manifest task, from the kernels attributed to it."""

    task: str
    strategy: str
    kernels: tuple[str, ...]
    calls: int  # kernel executions over all profiled runs
    total_ns: int
    per_run_ns: float
    share: float  # of all kernel time
    flops: int = 0  # per run (manifest)
    bytes: int = 0  # per run (manifest)
    achieved_flops_s: float = 0.0
    achieved_bytes_s: float = 0.0
    bound: str = "unknown"


@dataclass(frozen=True)
class GapStats:
    """Idle time between kernels inside one run (medians over the profiled runs)."""

    runs: int
    span_ns: float  # first kernel start to last kernel end
    busy_ns: float  # union of kernel intervals
    idle_ns: float  # span - busy
    max_gap_ns: float
    gaps_over_5us: float  # per run


@dataclass(frozen=True)
class LaunchCheck:
    """Did the profiler see every kernel? Kernel records against the launch calls CUPTI recorded
    (cudaLaunchKernel / cuLaunchKernel*; a graph launch accounts for its kernels)."""

    kernels: int
    launches: int | None  # None when launch API records were not collected
    graph_launches: int = 0
    graph_kernels: int = 0
    dropped_records: int = 0
    ok: bool = True
    detail: str = ""


@dataclass(frozen=True)
class GraphCheck:
    """For a program that replays a CUDA graph: kernel time per run against CUDA-event time per run."""

    kernel_ns_per_run: float
    event_ns_per_run: float
    ratio: float  # kernel / event
    ok: bool


@dataclass(frozen=True)
class ProfileDetails:
    source: str  # "cupti" | "torch.profiler"
    runs: int
    tasks: tuple[ProfiledTaskTime, ...] = ()
    unattributed: tuple[str, ...] = ()  # kernel names no task claimed
    gaps: GapStats | None = None
    launches: LaunchCheck | None = None
    graph: GraphCheck | None = None
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class RefOpTime:
    """One op of the PyTorch reference, by CUDA time (torch.profiler), for the Planner."""

    name: str
    calls: int
    self_device_us: float
    total_device_us: float
    share: float


@dataclass(frozen=True)
class MemoryUse:
    program_bytes: int  # device memory the program allocated itself (create + first run), beyond PyTorch's
    torch_peak_bytes: int  # the harness's own peak (inputs, outputs, reference)
    cap_bytes: int = 0  # the cap the program was held to (0: none)


@dataclass(frozen=True)
class LibraryCall:
    """Runtime calls the program made, counted by entry point, precision policy (-1: none taken) and
    operand dtypes (the runtime's enum values), as the native runner saw them."""

    fn: str
    policy: int
    dtypes: str
    count: int


@dataclass(frozen=True)
class GpuDetails:
    """Everything the GPU child measured that is not a verdict, a timing table or a kernel record."""

    device: str = ""
    torch_version: str = ""
    timing: TimingDetails | None = None
    profile: ProfileDetails | None = None
    reference_ops: tuple[RefOpTime, ...] = ()
    memory: MemoryUse | None = None
    correctness_notes: tuple[str, ...] = ()
    library_calls: tuple[LibraryCall, ...] = ()
    isolation: str = ""  # how the candidate ran: the native runner, or in the Verifier's process (and why)


__all__ = ["PhaseTiming", "SpeedupRecheck", "TimedCallCheck", "WallCheck", "LibraryCall", "TimingDetails",
           "ProfiledTaskTime", "GapStats", "LaunchCheck", "GraphCheck", "ProfileDetails", "RefOpTime", "MemoryUse",
           "GpuDetails"]
