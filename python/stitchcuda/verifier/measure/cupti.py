"""Why the program takes the time it takes: CUPTI activity records of every kernel and copy.

:func:`profile_program` runs the program ``runs`` times (L2 flushed before each, a synchronise
after each) with CUPTI activity collection on, through cupti-python (``cupti``): kinds
CONCURRENT_KERNEL, MEMCPY, MEMSET, RUNTIME and DRIVER, records delivered to
``activity_register_callbacks``' buffer-completed callback and flushed with
``activity_flush_all``. Each kernel keeps its name, start/end (ns), grid, block, registers and
static + dynamic shared memory. When cupti-python is not installed, torch.profiler (Kineto, itself
CUPTI) gives the same kernels with fewer attributes; the report says which source it used.

From the records (pure functions, tested on the CPU with hand-made records):

- time per task: generated programs name kernels after their tasks, so a kernel belongs to the
  task whose name is a substring of its (demangled) name, the longest such — or, where later tasks
  run that task's compiled kernels (the manifest's ``kernels_of``: the same elementwise function),
  to the task of its group whose turn it is in program order (:func:`share_group_kernels`);
  kernels launched inside runtime calls (cuBLASLt GEMMs, the runtime's epilogue kernel) go, in
  launch order, to the tasks whose strategy is a runtime call (``cublaslt_gemm``,
  ``epilogue_template``) that no kernel claimed by name;
- per kernel, achieved bytes/s and FLOP/s from its task's manifest ``flops``/``bytes`` (split
  between a task's kernels by duration), against the device ceilings (a large device-to-device
  copy and large GEMMs through PyTorch, measured once per device and cached under
  ``$STITCHCUDA_CACHE`` or ``~/.cache/stitchcuda``), which ``profile.summarise`` turns into
  memory-, compute- or latency-bound;
- idle gaps between kernels inside a run;
- launch accounting: kernel records against the launch calls CUPTI saw (a driver launch nested in a
  runtime launch counts once; a graph launch accounts for its kernels); for a program that replays
  a CUDA graph, the kernel-time sum per run against the CUDA-event time per run (within 5%).

:func:`profile_reference` gives the PyTorch reference's top ops by CUDA time (torch.profiler),
for the Planner.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import bisect
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ...manifest import TaskRecord as Task
from ..report.profile import _TENSOR_CORE_NAME, Ceilings, KernelRecord, classify
from ..report.records import GapStats, GraphCheck, LaunchCheck, ProfileDetails, ProfiledTaskTime, RefOpTime
from .attribution import (RUNTIME_STRATEGIES, align_kernels, is_library_kernel, match_task, place_unnamed,
                          share_group_kernels)

GRAPH_TOLERANCE = 0.05
_LAUNCH = re.compile(r"launch\w*kernel|launchgrid", re.I)
_GRAPH_LAUNCH = re.compile(r"graphlaunch", re.I)


@dataclass(frozen=True)
class RawActivity:
    """A kernel, memcpy or memset as the profiler reported it (times in ns)."""

    kind: str  # kernel | memcpy | memset
    name: str
    start: int
    end: int
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    registers: int = 0
    shared_mem: int = 0
    correlation: int = 0
    stream: int = 0
    graph_id: int = 0
    bytes: int = 0


@dataclass(frozen=True)
class RawApi:
    domain: str  # runtime | driver
    name: str
    correlation: int
    start: int
    end: int
    thread: int = 0


# ------------------------------------------------------------------ pure analysis


def short_name(name: str) -> str:
    """A demangled kernel name without its parameter list and return type."""
    anon = "(anonymous namespace)"
    text = name.replace(anon, "\x00")
    depth, cut, space = 0, len(text), -1
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "(" and depth == 0:
            cut = i
            break
        elif ch == " " and depth == 0:
            space = i
    head = text[space + 1:cut].strip()
    return head.replace("\x00", anon) or name


def demangle(names: Sequence[str]) -> dict[str, str]:
    """Mangled -> demangled names via c++filt when it is installed (else unchanged)."""
    todo = sorted({n for n in names if n.startswith("_Z")})
    out = {n: n for n in names}
    tool = shutil.which("c++filt") or shutil.which("llvm-cxxfilt")
    if not todo or not tool:
        return out
    try:
        r = subprocess.run([tool], input="\n".join(todo) + "\n", capture_output=True, text=True, timeout=30)
        for a, b in zip(todo, r.stdout.splitlines()):
            out[a] = b.strip() or a
    except (OSError, subprocess.SubprocessError):
        pass
    return out


def split_runs(records: Sequence[RawActivity], windows: Sequence[tuple[int, int]] | None, runs: int
               ) -> list[list[RawActivity]]:
    """Records per run: by host timestamp windows when there are some, else in equal chunks."""
    recs = sorted(records, key=lambda r: (r.start, r.end))
    if windows:
        out: list[list[RawActivity]] = [[] for _ in windows]
        for r in recs:
            for i, (a, b) in enumerate(windows):
                if a <= r.start <= b:
                    out[i].append(r)
                    break
        return out
    if runs > 0 and len(recs) % runs == 0:
        k = len(recs) // runs
        return [recs[i * k:(i + 1) * k] for i in range(runs)]
    return [recs]


def attribute(runs: Sequence[Sequence[RawActivity]], tasks: Sequence[Task], names: dict[str, str] | None = None
              ) -> tuple[list[KernelRecord], list[str]]:
    """KernelRecords (task, bytes and FLOPs filled in) and the kernel names no task claimed.

    A kernel whose name contains a task's name is that task's. The others (library kernels, shared
    templates such as ``stitch::row_sum_kernel``) are placed by program order: the unnamed kernels
    between two named ones belong to the tasks of the run phase that claimed no kernel and lie
    between those two tasks in the manifest (which lists tasks in the order they run)."""
    names = names or {}
    by_name = {t.name: t for t in tasks}
    records: list[KernelRecord] = []
    unclaimed: set[str] = set()
    for run in runs:
        kernels = [r for r in run if r.kind == "kernel"]
        owner = [(t.name if (t := match_task(short_name(names.get(r.name, r.name)), tasks)) else "") for r in kernels]
        share_group_kernels(owner, tasks)
        place_unnamed(owner, tasks, [short_name(names.get(r.name, r.name)) for r in kernels])
        # a task's bytes and FLOPs (per run) are split between its kernels in this run by duration
        per_task: dict[str, int] = {}
        for r, o in zip(kernels, owner):
            if o:
                per_task[o] = per_task.get(o, 0) + r.end - r.start
        for r, o in zip(kernels, owner):
            label = short_name(names.get(r.name, r.name))
            b = f = 0
            if o and per_task.get(o):
                share = (r.end - r.start) / per_task[o]
                b, f = round(by_name[o].bytes * share), round(by_name[o].flops * share)
            elif not o:
                unclaimed.add(label)
            records.append(KernelRecord(name=label, start_ns=r.start, end_ns=r.end, grid=r.grid, block=r.block,
                                        registers=r.registers, shared_mem=r.shared_mem, bytes=b, flops=f,
                                        kind="kernel", stream=r.stream, task=o))
        for r in run:
            if r.kind != "kernel":
                records.append(KernelRecord(name=r.name, start_ns=r.start, end_ns=r.end, bytes=r.bytes,
                                            kind="memcpy" if r.kind == "memcpy" else "memset", stream=r.stream))
    return records, sorted(unclaimed)


def task_times(records: Sequence[KernelRecord], tasks: Sequence[Task], runs: int, ceilings: Ceilings | None,
               precision: str) -> tuple[ProfiledTaskTime, ...]:
    total = sum(r.duration_ns for r in records if r.kind == "kernel") or 1
    out = []
    for t in tasks:
        mine = [r for r in records if r.task == t.name and r.kind == "kernel"]
        if not mine:
            out.append(ProfiledTaskTime(t.name, t.strategy, (), 0, 0, 0.0, 0.0, t.flops, t.bytes))
            continue
        ns = sum(r.duration_ns for r in mine)
        per_run = ns / max(runs, 1)
        secs = per_run * 1e-9
        tc = any(_TENSOR_CORE_NAME.search(r.name) for r in mine)
        bound, _, _ = classify(t.bytes, t.flops, per_run, max(len(mine) // max(runs, 1), 1), ceilings, precision, tc)
        out.append(ProfiledTaskTime(t.name, t.strategy, tuple(sorted({r.name for r in mine})), len(mine), ns, per_run,
                            ns / total, t.flops, t.bytes, t.flops / secs if secs else 0.0,
                            t.bytes / secs if secs else 0.0, bound))
    return tuple(out)


def gap_stats(runs: Sequence[Sequence[RawActivity]]) -> GapStats | None:
    spans, busys, maxes, counts = [], [], [], []
    for run in runs:
        ks = sorted((r for r in run if r.kind == "kernel"), key=lambda r: r.start)
        if not ks:
            continue
        busy, gaps, cur_s, cur_e = 0, [], ks[0].start, ks[0].end
        for r in ks[1:]:
            if r.start > cur_e:
                busy += cur_e - cur_s
                gaps.append(r.start - cur_e)
                cur_s, cur_e = r.start, r.end
            else:
                cur_e = max(cur_e, r.end)
        busy += cur_e - cur_s
        spans.append(max(r.end for r in ks) - ks[0].start)
        busys.append(busy)
        maxes.append(max(gaps, default=0))
        counts.append(sum(1 for g in gaps if g > 5_000))
    if not spans:
        return None
    med = statistics.median
    span, busy = med(spans), med(busys)
    return GapStats(runs=len(spans), span_ns=span, busy_ns=busy, idle_ns=max(0.0, span - busy),
                    max_gap_ns=med(maxes), gaps_over_5us=med(counts))


def launch_accounting(records: Sequence[RawActivity], apis: Sequence[RawApi] | None, dropped: int = 0) -> LaunchCheck:
    """Kernel records against launch calls (module docstring)."""
    kernels = [r for r in records if r.kind == "kernel"]
    graph_kernels = [r for r in kernels if r.graph_id]
    plain = [r for r in kernels if not r.graph_id]
    if apis is None:
        return LaunchCheck(kernels=len(kernels), launches=None, graph_kernels=len(graph_kernels),
                           dropped_records=dropped, ok=dropped == 0,
                           detail="launch calls not recorded (torch.profiler)")
    rt = [a for a in apis if a.domain == "runtime"]
    launch_rt = [a for a in rt if _LAUNCH.search(a.name)]
    graph_rt = [a for a in rt if _GRAPH_LAUNCH.search(a.name)]

    spans: dict[int, tuple[list[int], list[int]]] = {}
    for b in sorted(rt, key=lambda x: x.start):
        starts, ends = spans.setdefault(b.thread, ([], []))
        starts.append(b.start)
        ends.append(b.end)

    def nested(a: RawApi) -> bool:
        """Inside a runtime call of the same thread (runtime calls do not overlap on one thread)."""
        starts, ends = spans.get(a.thread, ([], []))
        i = bisect.bisect_right(starts, a.start) - 1
        return i >= 0 and a.end <= ends[i]

    drv = [a for a in apis if a.domain == "driver" and not nested(a)]
    launch_ids = {a.correlation for a in launch_rt} | {a.correlation for a in drv if _LAUNCH.search(a.name)}
    graph_ids = {a.correlation for a in graph_rt} | {a.correlation for a in drv if _GRAPH_LAUNCH.search(a.name)}
    all_ids = {a.correlation for a in apis}
    unmatched = [r for r in plain if r.correlation not in all_ids]
    launches = len(launch_ids)
    problems = []
    if len(plain) != launches:
        problems.append(f"{len(plain)} kernel records for {launches} launch calls")
    if unmatched:
        problems.append(f"{len(unmatched)} kernel records match no API record")
    if graph_ids and not graph_kernels:
        problems.append(f"{len(graph_ids)} graph launches but no graph kernel records")
    if dropped:
        problems.append(f"{dropped} records dropped")
    return LaunchCheck(kernels=len(kernels), launches=launches, graph_launches=len(graph_ids),
                       graph_kernels=len(graph_kernels), dropped_records=dropped, ok=not problems,
                       detail="; ".join(problems) or "every launch has its kernel record")


def graph_check(runs: Sequence[Sequence[RawActivity]], event_ms: Sequence[float]) -> GraphCheck | None:
    """Kernel-time sum per run vs event time per run, for runs that replayed a graph."""
    sums = [sum(r.end - r.start for r in run if r.kind == "kernel") for run in runs
            if any(r.graph_id for r in run if r.kind == "kernel")]
    if not sums or not event_ms:
        return None
    k = statistics.median(sums)
    e = statistics.median(event_ms) * 1e6
    ratio = k / e if e else 0.0
    return GraphCheck(kernel_ns_per_run=k, event_ns_per_run=e, ratio=ratio, ok=abs(1 - ratio) <= GRAPH_TOLERANCE)


def analyse(raw: Sequence[RawActivity], apis: Sequence[RawApi] | None, *, tasks: Sequence[Task], runs: int,
            windows: Sequence[tuple[int, int]] | None, event_ms: Sequence[float], ceilings: Ceilings | None,
            precision: str, source: str, flush_bytes: int = 0, notes: Sequence[str] = ()
            ) -> tuple[list[KernelRecord], ProfileDetails]:
    """Records of the profiled runs -> KernelRecords and ProfileDetails. Memsets of exactly
    ``flush_bytes`` (the harness's L2 flush) are left out."""
    kept = [r for r in raw if not (r.kind == "memset" and flush_bytes and r.bytes == flush_bytes)]
    names = demangle([r.name for r in kept if r.kind == "kernel"])
    per_run = split_runs(kept, windows, runs)
    records, unclaimed = attribute(per_run, tasks, names)
    details = ProfileDetails(source=source, runs=len(per_run), tasks=task_times(records, tasks, len(per_run),
                                                                                 ceilings, precision),
                             unattributed=tuple(unclaimed), gaps=gap_stats(per_run),
                             launches=launch_accounting(kept, apis), graph=graph_check(per_run, event_ms),
                             notes=tuple(notes))
    return records, details


# ------------------------------------------------------------------ collection (GPU)


def cupti_available() -> bool:
    """cupti-python importable and its libcupti loadable (a timestamp read needs the library)."""
    try:
        from cupti import cupti

        cupti.get_timestamp()
    except Exception:  # noqa: BLE001 - missing package or library: fall back to torch.profiler
        return False
    return True


def collect_cupti(body: Callable[[Callable[[], int]], Any]) -> tuple[list[RawActivity], list[RawApi]]:
    """Run ``body(timestamp)`` with CUPTI activity collection on; ``timestamp()`` is CUPTI's clock
    (the clock of the records), for run windows."""
    from cupti import cupti

    acts: list[RawActivity] = []
    apis: list[RawApi] = []
    K = cupti.ActivityKind
    kinds = [K.CONCURRENT_KERNEL, K.MEMCPY, K.MEMSET, K.RUNTIME, K.DRIVER]
    names: dict[tuple[int, int], str] = {}

    def api_name(domain: int, cbid: int) -> str:
        key = (domain, cbid)
        if key not in names:
            try:
                n = cupti.get_callback_name(domain, cbid)
                names[key] = n.decode() if isinstance(n, bytes) else str(n)
            except Exception:  # noqa: BLE001
                names[key] = f"cbid{cbid}"
        return names[key]

    def requested():
        return 8 * 1024 * 1024, 0

    def completed(activities):
        # the records live in CUPTI's buffer: copy every field out now
        for a in activities:
            k = a.kind
            if k == K.CONCURRENT_KERNEL:
                acts.append(RawActivity("kernel", str(a.name), int(a.start), int(a.end),
                                        (int(a.grid_x), int(a.grid_y), int(a.grid_z)),
                                        (int(a.block_x), int(a.block_y), int(a.block_z)),
                                        int(a.registers_per_thread),
                                        int(a.static_shared_memory) + int(a.dynamic_shared_memory),
                                        int(a.correlation_id), int(a.stream_id), int(a.graph_id)))
            elif k == K.MEMCPY:
                acts.append(RawActivity("memcpy", f"memcpy kind {int(a.copy_kind)}", int(a.start), int(a.end),
                                        correlation=int(a.correlation_id), stream=int(a.stream_id),
                                        graph_id=int(a.graph_id), bytes=int(a.bytes)))
            elif k == K.MEMSET:
                acts.append(RawActivity("memset", "memset", int(a.start), int(a.end),
                                        correlation=int(a.correlation_id), stream=int(a.stream_id),
                                        graph_id=int(a.graph_id), bytes=int(a.bytes)))
            elif k in (K.RUNTIME, K.DRIVER):
                dom = cupti.CallbackDomain.RUNTIME_API if k == K.RUNTIME else cupti.CallbackDomain.DRIVER_API
                apis.append(RawApi("runtime" if k == K.RUNTIME else "driver", api_name(dom, int(a.cbid)),
                                   int(a.correlation_id), int(a.start), int(a.end), int(a.thread_id)))

    cupti.activity_register_callbacks(requested, completed)
    for k in kinds:
        cupti.activity_enable(k)
    try:
        body(lambda: int(cupti.get_timestamp()))
    finally:
        cupti.activity_flush_all(1)
        for k in kinds:
            try:
                cupti.activity_disable(k)
            except Exception:  # noqa: BLE001
                pass
    return acts, apis


def collect_torch_profiler(body: Callable[[Callable[[], int]], Any], workdir: str | os.PathLike
                           ) -> tuple[list[RawActivity], list[tuple[int, int]]]:
    """The fallback: torch.profiler's Chrome trace, kernels / memcpy / memset and the run windows
    (each run inside a ``record_function("stitchcuda_run")``)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        body(lambda: 0)
    path = Path(workdir) / "torch_trace.json"
    prof.export_chrome_trace(str(path))
    data = json.loads(path.read_text())
    events = data.get("traceEvents", data if isinstance(data, list) else [])
    acts, windows = [], []
    for e in events:
        cat = str(e.get("cat", "")).lower()
        if e.get("ph") != "X":
            continue
        start = int(float(e.get("ts", 0)) * 1000)
        end = start + int(float(e.get("dur", 0)) * 1000)
        args = e.get("args", {}) or {}
        if cat == "kernel":
            g, b = args.get("grid", [1, 1, 1]), args.get("block", [1, 1, 1])
            acts.append(RawActivity("kernel", str(e.get("name", "?")), start, end, tuple(g)[:3], tuple(b)[:3],
                                    int(args.get("registers per thread", 0) or 0),
                                    int(args.get("shared memory", 0) or 0), int(args.get("correlation", 0) or 0),
                                    int(args.get("stream", 0) or 0), int(args.get("graph id", 0) or 0)))
        elif cat in ("gpu_memcpy", "gpu_memset"):
            acts.append(RawActivity("memcpy" if cat == "gpu_memcpy" else "memset", str(e.get("name", cat)), start, end,
                                    bytes=int(args.get("bytes", 0) or 0)))
        elif e.get("name") == "stitchcuda_run" and cat == "user_annotation":
            windows.append((start, end))
    del torch
    return acts, sorted(windows)


def profile_program(run: Callable[[], Any], *, stream: Any, tasks: Sequence[Task], precision: str,
                    runs: int = 20, ceilings: Ceilings | None = None, workdir: str | os.PathLike = ".",
                    prefer_cupti: bool = True) -> tuple[list[KernelRecord], ProfileDetails]:
    """Profile ``runs`` calls of ``run`` on ``stream`` (a torch.cuda.Stream), GPU only."""
    import torch

    from .timing import EventTimer, L2Flusher

    sint = stream.cuda_stream
    flush = L2Flusher(sint, stream.device.index or 0)
    timer = EventTimer(sint, stream.device.index or 0)
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm: plans, module load
            run()
        torch.cuda.synchronize()
    event_ms: list[float] = []
    windows: list[tuple[int, int]] = []
    use_cupti = prefer_cupti and cupti_available()
    notes = [] if use_cupti else ["cupti-python is not installed: kernel records from torch.profiler "
                                  "(pip install cupti-python for grid/register detail and launch accounting)"]

    def body(stamp: Callable[[], int]) -> None:
        with torch.cuda.stream(stream):
            for _ in range(runs):
                flush()
                torch.cuda.synchronize()
                if use_cupti:
                    t0 = stamp()
                    event_ms.append(timer.time(run))
                    torch.cuda.synchronize()
                    windows.append((t0, stamp()))
                else:
                    with torch.profiler.record_function("stitchcuda_run"):
                        event_ms.append(timer.time(run))
                        torch.cuda.synchronize()

    raw: list[RawActivity] = []
    apis: list[RawApi] | None = None
    if use_cupti:
        try:
            raw, apis = collect_cupti(body)
            source = "cupti"
        except Exception as e:  # noqa: BLE001 - a CUPTI failure falls back; the program's own errors do not
            if not type(e).__module__.startswith("cupti"):
                raise
            notes.append(f"CUPTI failed ({type(e).__name__}: {e}): kernel records from torch.profiler")
            use_cupti = False
            event_ms.clear()
            windows.clear()
    if not use_cupti:
        raw, windows = collect_torch_profiler(body, workdir)
        source = "torch.profiler"
    timer.close()
    return analyse(raw, apis, tasks=tasks, runs=runs, windows=windows or None, event_ms=event_ms,
                   ceilings=ceilings, precision=precision, source=source, flush_bytes=flush.nbytes, notes=notes)


def profile_reference(model: Any, args: Sequence[Any], *, runs: int = 5, top: int = 10,
                      context: Callable[[], Any] | None = None) -> tuple[RefOpTime, ...]:
    """The reference's top ATen ops by self CUDA time (torch.profiler), per run."""
    import contextlib

    import torch
    from torch.profiler import ProfilerActivity, profile

    ctx = context or contextlib.nullcontext
    with torch.no_grad():
        with ctx():
            model(*args)  # warm
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(runs):
                with ctx():
                    model(*args)
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if not str(e.key).startswith("aten::"):
            continue
        self_us = float(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0) or 0)
        total_us = float(getattr(e, "device_time_total", None) or getattr(e, "cuda_time_total", 0) or 0)
        if self_us <= 0 and total_us <= 0:
            continue
        rows.append((e.key, int(e.count), self_us / runs, total_us / runs))
    all_self = sum(r[2] for r in rows) or 1.0
    rows.sort(key=lambda r: (-r[2], -r[3]))
    return tuple(RefOpTime(k, c // max(runs, 1) or c, s, t, s / all_self) for k, c, s, t in rows[:top])


# ------------------------------------------------------------------ device ceilings

#: Measured ceilings live with the one device description (cached in ``<cache>/ceilings.json``).
from ...device import device_ceilings, measure as measure_ceilings  # noqa: E402
from ...paths import cache_dir  # noqa: E402


__all__ = ["RawActivity", "RawApi", "short_name", "demangle", "split_runs", "match_task", "share_group_kernels",
           "attribute", "task_times",
           "gap_stats", "launch_accounting", "graph_check", "analyse", "cupti_available", "collect_cupti",
           "collect_torch_profiler", "profile_program", "profile_reference", "cache_dir", "device_ceilings",
           "measure_ceilings", "RUNTIME_STRATEGIES", "align_kernels", "is_library_kernel"]
