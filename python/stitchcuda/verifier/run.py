"""The Verifier end to end: ``verify(program_dir, reference)`` -> a verdict, and the written report.

In order, each step timed (the phase timings go into the report, for BENCHMARKS.md):

1. **inputs**: the program folder (manifest, program.cu, weights) and the reference are loaded and
   checked against each other on the CPU. A problem here is the caller's, not the candidate's: it
   raises ``ManifestError`` / ``ProblemError`` naming the file and the problem, and nothing is
   written.
2. **static**: ``static.check_program``; a rejected candidate is not built.
3. **build**: through the project's one build cache (:func:`stitchcuda.build.build`). A failure is a
   ``CompileError`` verdict; a machine that cannot build at all raises ``VerifyEnvironmentError``.
4. **correctness + timing** in one child process (:mod:`.worker`, mode ``verify``), isolated by
   :mod:`.isolate`: trials and dynamic checks, then (when correct) the program and its four
   baselines timed on one stream, then the reference's own profile.
5. **profile** in a second child (mode ``profile``): CUPTI records of the program, attributed to
   tasks and placed against the device's ceilings. A separate process, so CUPTI and the
   reference's torch.profiler never share one.
6. rubric, feedback, report.json / report.md / timeline.png in the program folder.

A crash, illegal address, hang or out-of-memory in a child is a verdict on the candidate; the
parent carries on (it never initialises CUDA itself).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from .. import manifest as mf
from . import serde
from .correctness import CorrectnessResult
from .feedback import make_feedback
from .isolate import ChildOutcome, Limits, clean_env, new_workdir, run_child, worker_argv, write_json
from .problem import ProblemError, ReferenceSpec, resolve_reference, validate_reference
from .profile import Ceilings, KernelRecord, TimingTable, summarise
from .records import GpuDetails, MemoryUse, PhaseTiming, ProfileDetails, RefOpTime, TimingDetails
from .report import ReportFiles, VerificationReport, now_utc, write_report
from .rubric import build_rubric, detect_techniques
from .static import check_program
from .timing import LoopSettings
from .verdict import CompileError, Crash, DynamicCheck, Passed, Timeout, VerificationResult, build_result


class VerifyEnvironmentError(RuntimeError):
    """The machine cannot verify (no CUDA device, no nvcc): nobody's candidate is at fault."""


@dataclass(frozen=True)
class VerifyOptions:
    trials: int = 5
    time: bool = True
    profile: bool = True
    compile: bool = True  # the torch.compile baselines
    reference_profile: bool = True
    dynamic: bool = True
    static_gate: bool = True  # do not build a candidate the static rules reject
    seed: int = 1000
    weights_seed: int = 0
    limits: Limits = field(default_factory=Limits)
    timing: LoopSettings = field(default_factory=LoopSettings)
    profile_runs: int = 20
    memory_fraction: float = 0.9  # torch's share of the device in the child
    program_memory_cap: int | None = None  # bytes the program may allocate itself; None: half the device; 0: no cap
    arch: str | None = None  # default: $STITCHCUDA_ARCH, else the manifest's
    device: int = 0
    write: bool = True
    command: str = ""
    cupti: bool = True  # False forces the torch.profiler path


@dataclass(frozen=True)
class Verification:
    """Everything one verification produced."""

    result: VerificationResult
    report: VerificationReport
    files: ReportFiles | None
    phases: tuple[PhaseTiming, ...]
    library: Path | None = None


# ------------------------------------------------------------------ build


@dataclass(frozen=True)
class BuildOutcome:
    ok: bool
    library: Path | None
    output: str
    seconds: float
    cached: bool = False


def build_program(prog: mf.ProgramDir, arch: str, timeout: float = 600.0) -> BuildOutcome:
    """Build program.cu through the project's one build cache (:func:`stitchcuda.build.build`).

    Raises :class:`VerifyEnvironmentError` when nothing could be compiled for a reason that is
    not the candidate's (no nvcc, never-compile mode, an unwritable cache); a compile error is a
    failed :class:`BuildOutcome` (a verdict)."""
    from .. import build as build_mod

    t0 = time.monotonic()
    out = build_mod.build(prog.source, arch=arch, timeout=timeout, name=prog.manifest.name,
                          policy=prog.manifest.precision)
    if out.ok and out.library:
        text = out.compile.output if out.compile is not None else out.message
        return BuildOutcome(True, Path(out.library), text, time.monotonic() - t0, out.cached)
    if out.compile is None:  # nothing was compiled: no nvcc, never-compile mode, an unwritable cache
        raise VerifyEnvironmentError(f"cannot build {prog.source}: {out.message}")
    return BuildOutcome(False, None, out.compile.output, time.monotonic() - t0)


# ------------------------------------------------------------------ children


def _job(prog: mf.ProgramDir, library: Path, spec: ReferenceSpec, o: VerifyOptions, mode: str) -> dict[str, Any]:
    return {
        "mode": mode, "library": str(library.resolve()), "manifest": str(prog.manifest_path.resolve()),
        "program_dir": str(prog.root.resolve()), "reference": spec.to_dict(),
        "weights_file": str(prog.weights.resolve()) if prog.weights else None, "weights_seed": o.weights_seed,
        "trials": o.trials, "seed": o.seed, "time": o.time, "compile": o.compile, "dynamic": o.dynamic,
        "reference_profile": o.reference_profile, "memory_fraction": o.memory_fraction,
        "program_memory_cap": o.program_memory_cap,
        "timing_settings": dataclasses.asdict(o.timing), "profile_runs": o.profile_runs, "device": o.device,
        "cupti": o.cupti,
    }


def run_worker(job: dict[str, Any], limits: Limits, *, keep: bool = False,
               argv: Callable[[Path], list[str]] = worker_argv) -> ChildOutcome:
    """Write the job into a fresh folder and run the worker on it under ``limits``."""
    wd = new_workdir()
    try:
        write_json(wd / "job.json", job)
        return run_child(argv(wd / "job.json"), wd, limits=limits, env=clean_env())
    finally:
        if not keep:
            shutil.rmtree(wd, ignore_errors=True)


def _raise_input_problems(out: ChildOutcome) -> None:
    r = out.result or {}
    if r.get("status") == "input_error" and isinstance(r.get("input_error"), dict):
        e = r["input_error"]
        raise ProblemError(e.get("file", "?"), e.get("problem", "?"))
    if r.get("status") == "error":
        raise VerifyEnvironmentError(str(r.get("error", "the verification child could not start")))


def _get(data: dict[str, Any] | None, key: str, tp: Any) -> Any:
    if not data or data.get(key) is None:
        return None
    try:
        return serde.from_jsonable(tp, data[key])
    except (TypeError, ValueError, KeyError):
        return None


# ------------------------------------------------------------------ verify


def verify(program_dir: str | os.PathLike, reference: str | os.PathLike | None = None, trials: int = 5,
           time: bool = True, profile: bool = True, **options: Any) -> VerificationResult:
    """Verify one program folder against its reference; write its report; return the verdict.

    ``reference``: a KernelBench-format file, ``kernelbench:LEVEL:ID``, or None for the
    manifest's own. Other keyword options: the fields of :class:`VerifyOptions`."""
    opts = VerifyOptions(trials=trials, time=time, profile=profile, **options)
    return verify_program(program_dir, reference, opts).result


def verify_program(program_dir: str | os.PathLike, reference: str | os.PathLike | None = None,
                   options: VerifyOptions = VerifyOptions()) -> Verification:
    """:func:`verify` with every product: the result, the report, the files, the phase timings."""
    o = options
    phases: list[PhaseTiming] = []
    clock = time.monotonic
    t = clock()
    prog = mf.load_program_dir(program_dir)  # ManifestError: bad input
    manifest = prog.manifest
    spec = resolve_reference(reference, prog.root, manifest)
    input_notes = validate_reference(spec, manifest, manifest_file=prog.manifest_path, weights_file=prog.weights)
    phases.append(PhaseTiming("inputs", clock() - t))

    t = clock()
    static = check_program(prog.root)
    findings = static.findings
    phases.append(PhaseTiming("static", clock() - t))
    notes = list(input_notes)
    arch = o.arch or os.environ.get("STITCHCUDA_ARCH") or manifest.arch

    def finish(result: VerificationResult, **parts: Any) -> Verification:
        return _finish(prog, result, phases, notes, o, arch, **parts)

    if static.rejected and o.static_gate:
        notes.append("not built: the static rules reject it")
        return finish(build_result(findings=findings))

    t = clock()
    built = build_program(prog, arch)
    phases.append(PhaseTiming("build", clock() - t))
    if built.cached:
        notes.append("build: the library was already built from this source (cached)")
    if not built.ok:
        return finish(build_result(findings=findings, compile_error=CompileError.from_output(built.output)))
    assert built.library is not None

    out = run_worker(_job(prog, built.library, spec, o, "verify"), o.limits)
    _raise_input_problems(out)
    _child_phases(phases, out, rename={"setup": "setup (child start, reference, program create)"})
    r = out.result or {}
    corr: CorrectnessResult | None = _get(r, "correctness", CorrectnessResult)
    timing = r.get("timing") or {}
    table: TimingTable | None = _get(timing, "table", TimingTable)
    tdetails: TimingDetails | None = _get(timing, "details", TimingDetails)
    ref_ops = _get(r, "reference_ops", tuple[RefOpTime, ...]) or ()
    memory = _get(r, "memory", MemoryUse)
    device = str(r.get("device", ""))
    crash, timeout = out.crash, out.timeout
    if out.status == "timeout" and timeout is not None and timeout.stage == "timing" and corr is not None:
        notes.append(f"timing did not finish in {timeout.seconds:g} s")
    kernels: tuple[KernelRecord, ...] = ()
    pdetails: ProfileDetails | None = None
    ceilings: Ceilings | None = None
    correct = corr is not None and corr.passed and crash is None and timeout is None
    if o.profile and correct:
        pout = run_worker(_job(prog, built.library, spec, o, "profile"), o.limits)
        _raise_input_problems(pout)
        _child_phases(phases, pout, rename={"setup": "profile setup (child start, reference, program create)"})
        pr = (pout.result or {}).get("profile") or {}
        kernels = tuple(_get(pr, "kernels", tuple[KernelRecord, ...]) or ())
        pdetails = _get(pr, "details", ProfileDetails)
        ceilings = _get(pr, "ceilings", Ceilings)
        if pout.status == "crash":
            crash = pout.crash
        elif pout.status == "timeout":
            timeout = pout.timeout
    elif o.profile and not correct:
        notes.append("not profiled: the candidate did not pass correctness")

    checks = list(corr.checks) if corr else []
    if tdetails is not None and tdetails.recheck is not None:
        rc = tdetails.recheck
        checks.append(DynamicCheck("speedup_recheck", "pass" if rc.passed else "fail",
                                   f"{rc.event_speedup:.1f}x by events, {rc.wall_speedup:.1f}x by wall clock over "
                                   f"{rc.baseline}" + (f": {rc.detail}" if rc.detail else "")))
    result = build_result(findings=findings, crash=crash, timeout=timeout, trials=corr.trials if corr else (),
                          checks=checks, tolerance=corr.tolerance if corr else None) \
        if (corr is not None or crash is not None or timeout is not None) else \
        build_result(findings=findings, crash=Crash("other", "the verification child produced no result"))
    if isinstance(result.verdict, Passed) and corr is not None and corr.warnings:
        result = dataclasses.replace(result, verdict=dataclasses.replace(
            result.verdict, warnings=result.verdict.warnings + corr.warnings))
    details = GpuDetails(device=device, torch_version=str(r.get("torch_version", "")), timing=tdetails,
                         profile=pdetails, reference_ops=tuple(ref_ops), memory=memory,
                         correctness_notes=tuple(r.get("correctness_notes", ()) or ()))
    return finish(result, table=table, kernels=kernels, ceilings=ceilings, details=details, device=device)


def _child_phases(phases: list[PhaseTiming], out: ChildOutcome, rename: dict[str, str]) -> None:
    reported = (out.result or {}).get("phases") or {}
    if reported:
        for name, secs in reported.items():
            phases.append(PhaseTiming(rename.get(name, name), float(secs)))
        # what the child did not report: start-up before its first phase, the last phase of a killed child
        rest = out.seconds - sum(float(s) for s in reported.values())
        if out.status != "ok":
            phases.append(PhaseTiming(f"{out.phase} (until {out.status})", max(rest, 0.0)))
        elif rest > 0.05:
            phases.append(PhaseTiming("child process overhead", rest))
    else:
        for name, secs in out.phase_seconds:
            phases.append(PhaseTiming(rename.get(name, name), secs))


def _commit() -> str:
    if os.environ.get("STITCHCUDA_COMMIT"):
        return os.environ["STITCHCUDA_COMMIT"]
    try:
        r = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=5)
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def _finish(prog: mf.ProgramDir, result: VerificationResult, phases: list[PhaseTiming], notes: list[str],
            o: VerifyOptions, arch: str, *, table: TimingTable | None = None, kernels: tuple[KernelRecord, ...] = (),
            ceilings: Ceilings | None = None, details: GpuDetails | None = None, device: str = "") -> Verification:
    manifest = prog.manifest
    source = prog.read_source()
    rubric = build_rubric(source=source, manifest=manifest, findings=result.findings, checks=result.checks,
                          kernels=kernels)
    summary = summarise(kernels, ceilings, manifest.precision) if kernels else None
    fb = make_feedback(result, profile=summary, timings=table, precision=manifest.precision,
                       techniques=tuple(detect_techniques(source)))
    report = VerificationReport(program=manifest.name, precision=manifest.precision, arch=arch, result=result,
                                rubric=rubric, timings=table, kernels=kernels, ceilings=ceilings, feedback=fb.text,
                                device=device, created=now_utc(), commit=_commit(), command=o.command,
                                notes=tuple(notes), phases=tuple(phases), details=details)
    files = write_report(report, prog.root) if o.write else None
    return Verification(result, report, files, tuple(phases), prog.library)


# ------------------------------------------------------------------ profile only


@dataclass(frozen=True)
class ProfileOnly:
    kernels: tuple[KernelRecord, ...]
    details: ProfileDetails | None
    ceilings: Ceilings | None
    outcome: ChildOutcome
    verdict: Crash | Timeout | CompileError | None = None


def profile_program_dir(program_dir: str | os.PathLike, reference: str | os.PathLike | None = None,
                        options: VerifyOptions = VerifyOptions()) -> ProfileOnly:
    """Build and CUPTI-profile a program without the correctness trials (``stitchcuda profile``)."""
    prog = mf.load_program_dir(program_dir)
    spec = resolve_reference(reference, prog.root, prog.manifest)
    validate_reference(spec, prog.manifest, manifest_file=prog.manifest_path, weights_file=prog.weights)
    arch = options.arch or os.environ.get("STITCHCUDA_ARCH") or prog.manifest.arch
    built = build_program(prog, arch)
    if not built.ok or built.library is None:
        ce = CompileError.from_output(built.output)
        return ProfileOnly((), None, None, ChildOutcome("crash", None, None, "build", built.seconds), ce)
    out = run_worker(_job(prog, built.library, spec, options, "profile"), options.limits)
    _raise_input_problems(out)
    pr = (out.result or {}).get("profile") or {}
    return ProfileOnly(tuple(_get(pr, "kernels", tuple[KernelRecord, ...]) or ()), _get(pr, "details", ProfileDetails),
                       _get(pr, "ceilings", Ceilings), out, out.crash or out.timeout)


__all__ = ["VerifyOptions", "Verification", "VerifyEnvironmentError", "verify", "verify_program", "build_program",
           "BuildOutcome", "run_worker", "profile_program_dir", "ProfileOnly"]
