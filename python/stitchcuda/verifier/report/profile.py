"""Measurements as plain data: kernel records, timings, device ceilings, and the roofline verdict
on each kernel.

The GPU side fills these from CUPTI activity records and CUDA events; everything here is pure
Python so feedback, rubric and report can be tested on hand-made fixtures.

Each kernel gets two floors (MEASURING.md): ``bytes / bandwidth`` and ``flops / peak``. The larger
is the time it cannot beat; which one is larger says whether it is memory- or compute-bound. A
kernel that runs for only a few microseconds and sits far above both floors is latency-bound
(launch overhead, too few blocks, a serial tail): no amount of bandwidth or FLOP/s helps it.
"""

from __future__ import annotations

from ...device import H100, H200, Ceilings  # noqa: F401  (re-exported)

import re
import statistics
from dataclasses import dataclass
from typing import Literal

Bound = Literal["memory", "compute", "latency", "unknown"]
RecordKind = Literal["kernel", "memcpy", "memset"]

#: A kernel shorter than this (mean per call) that reaches under half its floor-limited speed is
#: called latency-bound.
LATENCY_NS = 10_000.0

_TENSOR_CORE_NAME = re.compile(r"xmma|hmma|wgmma|gmma|mma|tensorop|tf32|bf16|f16|cutlass|sm\d\d_xmma|gemm", re.I)


@dataclass(frozen=True)
class KernelRecord:
    """One kernel (or copy / memset) execution, as CUPTI reports it; ``bytes`` and ``flops`` come
    from the task the kernel belongs to (the planner's cost model), 0 when unknown."""

    name: str
    start_ns: int
    end_ns: int
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    registers: int = 0
    shared_mem: int = 0  # static + dynamic bytes per block
    bytes: int = 0
    flops: int = 0
    kind: RecordKind = "kernel"
    stream: int = 0
    task: str = ""

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


@dataclass(frozen=True)
class Timing:
    """A timed region: median and interquartile range of ``n`` trials, in milliseconds."""

    median_ms: float
    iqr_ms: float = 0.0
    n: int = 0

    @classmethod
    def from_samples(cls, samples_ms: list[float] | tuple[float, ...]) -> "Timing":
        xs = sorted(samples_ms)
        if not xs:
            raise ValueError("Timing.from_samples: no samples")
        if len(xs) < 4:
            return cls(statistics.median(xs), xs[-1] - xs[0], len(xs))
        q = statistics.quantiles(xs, n=4, method="inclusive")
        return cls(statistics.median(xs), q[2] - q[0], len(xs))


@dataclass(frozen=True)
class TimingTable:
    """The program and its baselines, all timed by one harness in one process run."""

    program: Timing
    eager_fp32: Timing | None = None
    eager_policy: Timing | None = None  # eager with the program's precision allowed (TF32 flags, autocast)
    compile_fp32: Timing | None = None
    compile_policy: Timing | None = None
    # torch.compile(mode="max-autotune") at the policy: what a user who wants speed runs (asked for:
    # VerifyOptions.autotune, ``--baselines max-autotune``; minutes of autotuning per reference)
    compile_autotune: Timing | None = None

    def baselines(self) -> list[tuple[str, Timing | None]]:
        out = [("eager fp32", self.eager_fp32), ("eager at policy", self.eager_policy),
               ("torch.compile fp32", self.compile_fp32), ("torch.compile at policy", self.compile_policy)]
        return out + ([("torch.compile max-autotune at policy", self.compile_autotune)]
                      if self.compile_autotune is not None else [])

    def speedup(self, baseline: Timing | None) -> float | None:
        if baseline is None or self.program.median_ms <= 0:
            return None
        return baseline.median_ms / self.program.median_ms

    def best_baseline(self) -> tuple[str, Timing] | None:
        present = [(n, t) for n, t in self.baselines() if t is not None]
        return min(present, key=lambda x: x[1].median_ms) if present else None


#: One ceilings type for the cost model and the roofline (:mod:`stitchcuda.device`).
H100_SXM = H100


@dataclass(frozen=True)
class KernelSummary:
    """All calls of one kernel name, placed against the ceilings."""

    name: str
    calls: int
    total_ns: int
    mean_ns: float
    share: float  # of all recorded device time
    bytes: int
    flops: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    registers: int
    shared_mem: int
    bound: Bound
    floor_ns: float  # max(bytes / bandwidth, flops / peak), all calls
    efficiency: float  # floor / measured, 0..1 (0 when unknown)
    kind: RecordKind = "kernel"

    @property
    def achieved_bytes_s(self) -> float:
        return self.bytes / (self.total_ns * 1e-9) if self.total_ns else 0.0

    @property
    def achieved_flops_s(self) -> float:
        return self.flops / (self.total_ns * 1e-9) if self.total_ns else 0.0

    def describe_bound(self) -> str:
        if self.bound == "memory":
            return f"memory-bound, {self.efficiency:.0%} of bandwidth"
        if self.bound == "compute":
            return f"compute-bound, {self.efficiency:.0%} of peak"
        if self.bound == "latency":
            floor = f"; roofline floor {format_ns(self.floor_ns / self.calls)}" if self.floor_ns else ""
            return f"latency-bound ({format_ns(self.mean_ns)} per call{floor})"
        return "bound unknown (no bytes/FLOPs attributed)"


@dataclass(frozen=True)
class ProfileSummary:
    """One run's device activity: busy time, span, launches, and every kernel name summarised."""

    busy_ns: int
    span_ns: int
    launches: int
    kernels: tuple[KernelSummary, ...]

    def top(self, k: int = 3) -> tuple[KernelSummary, ...]:
        return self.kernels[:k]

    def by_name(self) -> dict[str, KernelSummary]:
        return {s.name: s for s in self.kernels}


def classify(bytes_: int, flops: int, total_ns: float, calls: int, ceilings: Ceilings | None, precision: str,
             tensor_cores: bool, kind: RecordKind = "kernel") -> tuple[Bound, float, float]:
    """(bound, floor_ns, efficiency) for ``calls`` executions taking ``total_ns`` together."""
    mean = total_ns / max(calls, 1)
    if ceilings is None or (bytes_ == 0 and flops == 0):
        return ("latency" if 0 < mean < LATENCY_NS and kind == "kernel" else "unknown"), 0.0, 0.0
    t_mem = bytes_ / ceilings.bandwidth * 1e9
    t_cmp = flops / ceilings.peak(precision, tensor_cores) * 1e9
    floor = max(t_mem, t_cmp)
    eff = min(1.0, floor / total_ns) if total_ns > 0 else 0.0
    if kind != "kernel":
        return "memory", t_mem, (min(1.0, t_mem / total_ns) if total_ns > 0 else 0.0)
    if mean < LATENCY_NS and eff < 0.5:
        return "latency", floor, eff
    return ("memory" if t_mem >= t_cmp else "compute"), floor, eff


def summarise(records: list[KernelRecord] | tuple[KernelRecord, ...], ceilings: Ceilings | None = None,
              precision: str = "fp32") -> ProfileSummary:
    """Group records by name, sort by total time, classify each against the ceilings."""
    if not records:
        return ProfileSummary(0, 0, 0, ())
    groups: dict[str, list[KernelRecord]] = {}
    for r in records:
        groups.setdefault(r.name, []).append(r)
    busy = sum(r.duration_ns for r in records)
    span = max(r.end_ns for r in records) - min(r.start_ns for r in records)
    out = []
    for name, rs in groups.items():
        total = sum(r.duration_ns for r in rs)
        b = sum(r.bytes for r in rs)
        f = sum(r.flops for r in rs)
        kind = rs[0].kind
        tc = bool(_TENSOR_CORE_NAME.search(name))
        bound, floor, eff = classify(b, f, total, len(rs), ceilings, precision, tc, kind)
        first = rs[0]
        out.append(KernelSummary(name=name, calls=len(rs), total_ns=total, mean_ns=total / len(rs),
                                 share=total / busy if busy else 0.0, bytes=b, flops=f, grid=first.grid,
                                 block=first.block, registers=first.registers, shared_mem=first.shared_mem,
                                 bound=bound, floor_ns=floor, efficiency=eff, kind=kind))
    out.sort(key=lambda s: (-s.total_ns, s.name))
    launches = sum(1 for r in records if r.kind == "kernel")
    return ProfileSummary(busy_ns=busy, span_ns=span, launches=launches, kernels=tuple(out))


def format_ns(ns: float) -> str:
    if ns >= 1e6:
        return f"{ns / 1e6:.3g} ms"
    if ns >= 1e3:
        return f"{ns / 1e3:.3g} us"
    return f"{ns:.0f} ns"


def format_bytes(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1000
    return f"{n:.3g} TB"


__all__ = ["Bound", "RecordKind", "LATENCY_NS", "KernelRecord", "Timing", "TimingTable", "Ceilings", "H100_SXM",
           "H200", "KernelSummary", "ProfileSummary", "classify", "summarise", "format_ns", "format_bytes"]
