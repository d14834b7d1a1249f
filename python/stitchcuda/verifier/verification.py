"""The Verifier end to end: ``verify(program_dir, reference, precision=...)`` -> a verdict, and the report.

The Verifier's inputs are its own: the precision to judge at is an argument (the manifest's only
when none is given, and the report says which), the seeds are drawn fresh for each verification
(and written to the report only after the run), the weights are drawn from the reference model
by the Verifier. In order, each step timed (the phase timings go into the report):

1. **inputs**: the program folder (manifest, program.cu) and the reference are loaded and checked
   against each other on the CPU. A problem here is the caller's, not the candidate's: it raises
   ``ManifestError`` / ``ProblemError`` naming the file and the problem, and nothing is written.
2. **static**: :func:`.static.check_program`; a rejected candidate is not built.
3. **build**: through the project's one build cache (:mod:`.run.build`), linked with ``-z defs`` and
   the traced names of :mod:`.static.sandbox`; an honest baseline program is built the same way. A compile failure is a ``CompileError``; a link refused only for imports from the host
   process is a rejection; a baseline that does not build either means the machine cannot build.
4. **sandbox**: the built library's imports and system calls (:mod:`.static.sandbox`); a refused
   library is not run.
5. **correctness + timing** in one child process (:mod:`.run.worker`, mode ``verify``), isolated by
   :mod:`.run.child`; the job is a :class:`~.run.job.WorkerJob`.
6. **profile** in a second child (mode ``profile``): CUPTI records of the program.
7. rubric, feedback, report.json / report.md / timeline.png in the program folder.

A crash, illegal address, hang or out-of-memory in a child is a verdict on the candidate; the
parent carries on (it never initialises CUDA itself). What is not the candidate's fault — no GPU,
no compiler, a TMPDIR that does not exist, the harness out of memory — is never a verdict on it:
the Verifier writes what it could judge (an ``Inconclusive`` report) and raises
:class:`VerifyEnvironmentError` carrying it.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from .. import manifest as mf
from .. import serial as serde
from ..errors import MachineError
from ..precision import get as get_policy
from .measure.timing import LoopSettings
from .report.document import VerificationReport, VerificationReportFiles, now_utc, write_report
from .report.feedback import make_feedback
from .report.profile import Ceilings, KernelRecord, TimingTable, summarise
from .report.records import GpuDetails, MemoryUse, PhaseTiming, ProfileDetails, RefOpTime, TimingDetails
from .report.rubric import build_rubric, detect_techniques
from .report.verdict import (CompileError, Crash, DynamicCheck, Inconclusive, Passed, Timeout, VerificationResult,
                             build_result)
from .run.build import NoToolchain, build_baseline, build_candidate, environment_problem
from .run.child import ChildOutcome, Limits, clean_env, run_child, worker_argv
from .run.correctness import CorrectnessResult
from .run.inputs import fresh_seed
from .run.job import WorkerJob
from .run.reference import ProblemError, ReferenceSpec, resolve_reference, validate_reference
from .run.shapes import at_shape, progress_at, range_shapes, shape_label, timing_line
from .static import Finding, check_program, sandbox

#: Exit codes of ``stitchcuda verify`` (README, "Verifying a program").
EXIT_PASSED, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_CANNOT_VERIFY = 0, 1, 2, 3


class VerifyEnvironmentError(MachineError):
    """The machine cannot finish verifying (no CUDA device, no nvcc, no usable TMPDIR): nobody's
    candidate is at fault. ``verification`` holds the partial result (an ``Inconclusive`` verdict
    and the report written) when the inputs could be read."""

    def __init__(self, message: str, verification: "Verification | None" = None):
        super().__init__(message)
        self.verification = verification


@dataclass(frozen=True)
class VerifyOptions:
    trials: int = 5
    time: bool = True
    profile: bool = True
    compile: bool = True  # the torch.compile baselines
    autotune: bool = False  # also torch.compile(mode="max-autotune") at the policy (minutes per reference)
    reference_profile: bool = True
    dynamic: bool = True
    static_gate: bool = True  # do not build a candidate the static rules reject
    precision: str | None = None  # the policy to judge at; None: the manifest's
    seed: int | None = None  # None: drawn fresh (and reported after the run)
    weights_seed: int | None = None  # None: drawn fresh
    varied: int = 4  # varied-distribution trials
    sandbox: bool = True  # judge the built library's imports (and refuse what it may not call)
    limits: Limits = field(default_factory=Limits)
    timing: LoopSettings = field(default_factory=LoopSettings)
    profile_runs: int = 20
    memory_fraction: float = 0.9  # torch's share of the device in the child
    program_memory_cap: int | None = None  # bytes the program may allocate itself; None: half the device; 0: no cap
    arch: str | None = None  # default: $STITCHCUDA_ARCH, else the manifest's
    device: int = 0
    at: tuple[tuple[str, int], ...] = ()  # a dynamic program judged at these sizes only
    between: int = 3  # a dynamic program (no ``at``): sizes drawn between its smallest and largest, each judged
    judged: tuple[tuple[str, str], ...] = ()  # (shape, its timing) passed before this one over the range
    write: bool = True
    command: str = ""
    cupti: bool = True  # False forces the torch.profiler path
    isolate: bool = True  # run the candidate in the native runner (no Python, no PyTorch in its process)
    sanitizer: bool = True  # compute-sanitizer on one small trial (needs the native runner)
    # told each phase as it starts ("build", "correctness: 5 trials, 4 varied", ...): a command's progress
    progress: Callable[[str], None] | None = field(default=None, compare=False, repr=False)


#: Static rules that read the program's structure, which text that does not compile can fool.
_STRUCTURAL_RULES = frozenset({"host-state-global", "host-state-static-local", "abi-exports", "provenance-coverage"})

_CHILD_PHASES = {"setup": "child: reference and program", "correctness": "correctness trials and dynamic checks",
                 "timing": "timing", "reference_profile": "reference profile", "ceilings": "device ceilings",
                 "profile": "CUPTI profile"}


def _say(o: VerifyOptions, what: str) -> None:
    if o.progress is not None:
        o.progress(what)


def _child_progress(o: VerifyOptions) -> Callable[[str], None] | None:
    if o.progress is None:
        return None
    trials = f"{o.trials} trial(s)" + (f", {o.varied} varied" if o.varied else "")
    return lambda phase: o.progress(f"{_CHILD_PHASES.get(phase, phase)}"
                                    + (f" ({trials})" if phase == "correctness" else ""))


@dataclass(frozen=True)
class Verification:
    """Everything one verification produced."""

    result: VerificationResult
    report: VerificationReport
    files: VerificationReportFiles | None
    phases: tuple[PhaseTiming, ...]
    library: Path | None = None
    tuning: dict[str, str] | None = None  # the runtime's choices by timing in the child ({"text", "identity"})

    @property
    def exit_code(self) -> int:
        """0 passed, 1 a verdict against the candidate, 3 inconclusive (README)."""
        if self.result.ok:
            return EXIT_PASSED
        return EXIT_CANNOT_VERIFY if self.result.kind == "inconclusive" else EXIT_FAILED


# ------------------------------------------------------------------ children


def _job(prog: mf.ProgramDir, library: Path, spec: ReferenceSpec, o: VerifyOptions, mode: str, precision: str,
         seed: int, weights_seed: int) -> WorkerJob:
    return WorkerJob(mode=mode, library=str(library.resolve()), manifest=prog.manifest, reference=spec,
                     precision=precision, seed=seed, weights_seed=weights_seed, token=secrets.token_hex(16),
                     trials=o.trials, varied=o.varied, time=o.time, compile=o.compile, autotune=o.autotune,
                     dynamic=o.dynamic,
                     reference_profile=o.reference_profile, memory_fraction=o.memory_fraction,
                     program_memory_cap=o.program_memory_cap, timing=o.timing, profile_runs=o.profile_runs,
                     device=o.device, cupti=o.cupti, isolate=o.isolate, sanitizer=o.sanitizer)


def run_worker(job: WorkerJob, limits: Limits, *, argv: Callable[[], list[str]] = worker_argv,
               on_phase: Callable[[str], None] | None = None) -> ChildOutcome:
    """Run the worker on ``job`` (sent over its stdin) in an empty folder, under ``limits``."""
    return run_child(argv(), stdin=job.to_json(), limits=limits, env=clean_env(), token=job.token, on_phase=on_phase)


def _input_problem(out: ChildOutcome) -> None:
    r = out.result or {}
    if r.get("status") == "input_error" and isinstance(r.get("input_error"), dict):
        e = r["input_error"]
        raise ProblemError(e.get("file", "?"), e.get("problem", "?"))


def _environment_of(out: ChildOutcome) -> str:
    """Why a child could not judge, when it was not the candidate's fault ("" otherwise)."""
    r = out.result or {}
    if r.get("status") == "error":
        return str(r.get("error", "the verification child could not start"))
    if r.get("status") == "inconclusive":
        return str(r.get("inconclusive", "the verification child could not finish"))
    return ""


def _get(data: dict[str, Any] | None, key: str, tp: Any) -> Any:
    if not data or data.get(key) is None:
        return None
    try:
        return serde.from_jsonable(tp, data[key])
    except (TypeError, ValueError, KeyError):
        return None


# ------------------------------------------------------------------ verify


def verify(program_dir: str | os.PathLike, reference: str | os.PathLike | None = None, trials: int = 5,
           time: bool = True, profile: bool = True, precision: str | None = None, **options: Any) -> VerificationResult:
    """Verify one program folder against its reference at ``precision``; write its report; return the
    verdict.

    ``reference``: a KernelBench-format file, ``kernelbench:LEVEL:ID``, or None for the manifest's
    own. ``precision``: the policy whose tolerance (and claim) the program is judged at; None takes
    the manifest's. Other keyword options: the fields of :class:`VerifyOptions`. Raises
    :class:`VerifyEnvironmentError` (with the partial result) when the machine cannot finish."""
    opts = VerifyOptions(trials=trials, time=time, profile=profile, precision=precision, **options)
    return verify_program(program_dir, reference, opts).result


@dataclass
class _Run:
    """What one verification has gathered so far (for the report, whatever the end)."""

    prog: mf.ProgramDir
    options: VerifyOptions
    arch: str
    precision: str
    source: str
    seed: int
    weights_seed: int
    phases: list[PhaseTiming] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    tuning: dict[str, str] | None = None  # the runtime's choices by timing in the child ({"text", "identity"})

    def finish(self, result: VerificationResult, **parts: Any) -> Verification:
        return _finish(self, result, **parts)

    def inconclusive(self, reason: str, **parts: Any) -> None:
        """Write what could be judged and raise (a verdict is never a guess)."""
        result = build_result(findings=self.findings, inconclusive=Inconclusive(reason, tuple(self.ran)),
                              trials=parts.pop("trials", ()), checks=parts.pop("checks", ()))
        v = self.finish(result, **parts)
        if v.result.kind != "inconclusive":  # a definite verdict from what did run (a static rejection)
            raise _Definite(v)
        raise VerifyEnvironmentError(reason, v)


class _Definite(Exception):
    def __init__(self, v: Verification):
        self.v = v


def verify_program(program_dir: str | os.PathLike, reference: str | os.PathLike | None = None,
                   options: VerifyOptions = VerifyOptions()) -> Verification:
    """:func:`verify` with every product: the result, the report, the files, the phase timings.

    A dynamic program (``at`` not given) is judged over its range (:func:`.run.shapes.range_shapes`): at each
    shape before its largest, correctness and the dynamic checks (the sizes named at build to tune
    at timed too), then at its largest with everything a static program gets. The first shape it
    fails at is the verdict and its report; a program right at one shape only is refused."""
    o = options
    manifest = None if o.at else mf.load_program_dir(program_dir).manifest
    if manifest is None or manifest.dynamic is None:
        return _verify_one(program_dir, reference, o)
    if o.seed is None:  # one seed for the draw of the shapes and every shape's trials, reported
        o = dataclasses.replace(o, seed=fresh_seed())
    *smaller, largest = range_shapes(manifest, o.seed, o.between)
    tuned = set(manifest.dynamic.tuned_shapes())
    judged, tunings = [], []
    for shape in smaller:
        timed = shape in tuned  # a shape named at build: timed as the largest is, its library choices kept
        v = _verify_one(program_dir, reference, dataclasses.replace(
            o, at=shape, time=o.time and timed, compile=o.compile and timed, profile=False, autotune=False,
            reference_profile=False, sanitizer=False, write=False, progress=progress_at(o.progress, shape)))
        if not v.result.ok:  # the verdict at the first shape it fails is the program's, and its report
            files = write_report(v.report, Path(program_dir)) if o.write else None
            return dataclasses.replace(v, files=files)
        judged.append((shape_label(shape), timing_line(v.report.timings)))
        tunings.append(v.tuning)
    v = _verify_one(program_dir, reference, dataclasses.replace(o, at=largest, judged=tuple(judged)))
    if o.write and v.result.ok:
        for t in tunings:
            if t and t.get("text"):
                _write_tuning(Path(program_dir), t)
    return v


def _verify_one(program_dir, reference, options: VerifyOptions) -> Verification:
    try:
        return _verify_program(program_dir, reference, options)
    except _Definite as d:
        return d.v


def _verify_program(program_dir, reference, o: VerifyOptions) -> Verification:
    clock = time.monotonic
    t = clock()
    _say(o, "inputs: the folder and the reference")
    prog = mf.load_program_dir(program_dir)  # ManifestError: bad input
    shape_notes = []
    if o.at:
        ranges = ", ".join(f"{d.name} {d.min}..{d.max}" for d in prog.manifest.dynamic.dims) \
            if prog.manifest.dynamic else ""
        prog = at_shape(prog, dict(o.at))
        before = "; ".join(f"{n} ({timing})" if timing else n for n, timing in o.judged)
        shape_notes.append(f"judged at {shape_label(o.at)} of its range ({ranges})"
                           + (f"; passed before at {before} (correctness and dynamic checks, seed {o.seed})"
                              if o.judged else ""))
    manifest = prog.manifest
    spec = resolve_reference(reference, prog.root, manifest)
    input_notes = validate_reference(spec, manifest, manifest_file=prog.manifest_path)
    precision, source = (o.precision, "requested") if o.precision else (manifest.precision, "manifest")
    try:
        precision = get_policy(precision).name
    except ValueError as e:
        raise ProblemError("--precision", str(e)) from None
    run = _Run(prog, o, o.arch or os.environ.get("STITCHCUDA_ARCH") or manifest.arch, precision, source,
               o.seed if o.seed is not None else fresh_seed(),
               o.weights_seed if o.weights_seed is not None else fresh_seed())
    run.notes += shape_notes + input_notes + _input_notes(prog, spec, precision, source)
    run.phases.append(PhaseTiming("inputs", clock() - t))

    t = clock()
    _say(o, "static rules")
    static = check_program(prog.root)
    run.findings += static.findings
    run.phases.append(PhaseTiming("static", clock() - t))
    run.ran.append("static rules")
    if static.rejected and o.static_gate:
        # Rules that read the program's structure (a declaration at file scope, the exported
        # functions, the task functions) can be fooled by text that is not C++: when only those
        # refuse it, a program that does not compile is judged as that (a typo is not cheating).
        # A rule that names a forbidden thing (torch, dlopen, a pointer-keyed cache) stands, unbuilt.
        structural = all(f.rule in _STRUCTURAL_RULES for f in run.findings if f.severity == "reject")
        try:
            built = build_candidate(prog, run.arch) if structural else None
        except NoToolchain:
            built = None
        if built is not None and not built.ok and not sandbox.link_refused_only_imports(built.output):
            run.notes.append("not judged further: it does not compile")
            ce = build_result(compile_error=CompileError.from_output(built.output))
            return run.finish(dataclasses.replace(ce, findings=tuple(run.findings)))
        run.notes.append("not run: the static rules reject it")
        return run.finish(build_result(findings=run.findings))
    problem = environment_problem()
    if problem:
        run.inconclusive(problem)

    t = clock()
    _say(o, f"build ({run.arch})")
    try:
        baseline = build_baseline(run.arch) if o.sandbox else None
        built = build_candidate(prog, run.arch)
    except NoToolchain as e:
        run.phases.append(PhaseTiming("build", clock() - t))
        run.inconclusive(str(e))
    run.phases.append(PhaseTiming("build", clock() - t))
    if baseline is not None and not baseline.ok:
        first = next((ln for ln in baseline.output.splitlines() if "error" in ln.lower()), baseline.output[:200])
        run.inconclusive(f"the honest baseline program does not build here either (the toolchain, not the "
                         f"candidate): {first.strip()}")
    if built.cached:
        run.notes.append("build: the library was already built from this source (cached)")
    if not built.ok:
        if sandbox.link_refused_only_imports(built.output):
            run.findings += sandbox.refused_link(built.output).findings
            run.notes.append("not run: the link refused symbols only the host process could provide")
            return run.finish(build_result(findings=run.findings))
        return run.finish(build_result(findings=run.findings, compile_error=CompileError.from_output(built.output)))
    assert built.library is not None
    run.ran.append("build")

    if baseline is not None and baseline.library is not None:
        t = clock()
        sb = sandbox.check_library(built.library, built.output, sandbox.baseline_of(baseline.library))
        run.findings += sb.findings
        run.notes += list(sb.notes)
        if sb.new_imports:
            run.notes.append("imports beyond the honest baseline (allowed): " + ", ".join(sb.new_imports[:20]))
        run.phases.append(PhaseTiming("sandbox", clock() - t))
        run.ran.append("sandbox")
        if any(f.severity == "reject" for f in sb.findings) and o.static_gate:
            run.notes.append("not run: the built library calls what a program may not")
            return run.finish(build_result(findings=run.findings))

    _say(o, "child: reference and program")
    out = run_worker(_job(prog, built.library, spec, o, "verify", precision, run.seed, run.weights_seed), o.limits,
                     on_phase=_child_progress(o))
    _input_problem(out)
    _child_phases(run.phases, out, rename={"setup": "setup (child start, reference, program create)"})
    r = out.result or {}
    corr: CorrectnessResult | None = _get(r, "correctness", CorrectnessResult)
    timing = r.get("timing") or {}
    run.tuning = r.get("tuning") if isinstance(r.get("tuning"), dict) else None
    table: TimingTable | None = _get(timing, "table", TimingTable)
    tdetails: TimingDetails | None = _get(timing, "details", TimingDetails)
    details = GpuDetails(device=str(r.get("device", "")), torch_version=str(r.get("torch_version", "")),
                         timing=tdetails, reference_ops=tuple(_get(r, "reference_ops", tuple[RefOpTime, ...]) or ()),
                         memory=_get(r, "memory", MemoryUse),
                         correctness_notes=tuple(r.get("correctness_notes", ()) or ()),
                         isolation=str(r.get("isolation", "")))
    checks = list(corr.checks) if corr else []
    checks += list(_get(r, "extra_checks", tuple[DynamicCheck, ...]) or ())
    trials = corr.trials if corr else ()
    why = _environment_of(out)
    if why:
        if corr is not None:
            run.ran.append("correctness")
        run.inconclusive(why, trials=trials, checks=checks, details=details, device=details.device)
    crash, timeout = out.crash, out.timeout
    if out.status == "timeout" and timeout is not None and timeout.stage == "timing" and corr is not None:
        run.notes.append(f"timing did not finish in {timeout.seconds:g} s")
    if tdetails is not None and tdetails.timed_calls is not None:
        tc = tdetails.timed_calls
        checks.append(DynamicCheck("timed_calls", "pass" if tc.passed else "fail", tc.summary()))
    if tdetails is not None and tdetails.wall is not None:
        w = tdetails.wall
        checks.append(DynamicCheck("hidden_work", "pass" if w.passed else "fail", w.detail or (
            f"{w.event_ms:.3g} ms by events, {w.wall_ms - w.overhead_ms:.3g} ms by the host clock around device-wide "
            "synchronisations")))
    if corr is not None and corr.library:
        run.notes.append(f"the runtime's arithmetic as the program asked for it: {corr.library}")
    if tdetails is not None and tdetails.recheck is not None:
        rc = tdetails.recheck
        checks.append(DynamicCheck("speedup_recheck", "pass" if rc.passed else "fail",
                                   f"{rc.event_speedup:.1f}x by events, {rc.wall_speedup:.1f}x by wall clock over "
                                   f"{rc.baseline}" + (f": {rc.detail}" if rc.detail else "")))
    kernels: tuple[KernelRecord, ...] = ()
    ceilings: Ceilings | None = None
    correct = corr is not None and corr.passed and crash is None and timeout is None and \
        not any(c.status == "fail" for c in checks)
    if o.profile and correct:
        pout = run_worker(_job(prog, built.library, spec, o, "profile", precision, run.seed, run.weights_seed),
                          o.limits)
        _input_problem(pout)
        _child_phases(run.phases, pout, rename={"setup": "profile setup (child start, reference, program create)"})
        pr = (pout.result or {}).get("profile") or {}
        kernels = tuple(_get(pr, "kernels", tuple[KernelRecord, ...]) or ())
        details = dataclasses.replace(details, profile=_get(pr, "details", ProfileDetails))
        ceilings = _get(pr, "ceilings", Ceilings)
        if pout.status == "crash":
            crash = pout.crash
        elif pout.status == "timeout":
            timeout = pout.timeout
        checks = _kernel_precision(checks, kernels, prog.manifest, precision, run.notes,
                                   split_bf16_calls=int(pr.get("split_bf16_calls") or 0))
    elif o.profile and not correct:
        run.notes.append("not profiled: the candidate did not pass correctness")
    if corr is not None or crash is not None or timeout is not None:
        result = build_result(findings=run.findings, crash=crash, timeout=timeout, trials=trials, checks=checks,
                              tolerance=corr.tolerance if corr else None,
                              degenerate=corr.degenerate if corr else "")
    else:
        result = build_result(findings=run.findings, crash=Crash("other", "the verification child produced no result"))
    if isinstance(result.verdict, Passed) and corr is not None and corr.warnings:
        result = dataclasses.replace(result, verdict=dataclasses.replace(
            result.verdict, warnings=result.verdict.warnings + corr.warnings))
    return run.finish(result, table=table, kernels=kernels, ceilings=ceilings, details=details, device=details.device)


def _kernel_precision(checks: list[DynamicCheck], kernels: Sequence[KernelRecord], manifest: mf.Manifest,
                      precision: str, notes: list[str], split_bf16_calls: int = 0) -> list[DynamicCheck]:
    """The precision claim against what the libraries ran, by the profile's kernel names
    (:func:`.run.precision_claim.kernel_evidence`): a failure replaces the claim's check. Judged where
    every tensor of the problem is fp32 (a 16-bit problem's library kernels are 16-bit). The bf16
    launches of ``split_bf16_calls`` (the runner's count, SPLIT_BF16_LAUNCHES a call) are excused."""
    from .run.precision_claim import SPLIT_BF16_LAUNCHES, kernel_evidence

    names = [k.name for k in kernels if k.kind == "kernel"]
    if not names:
        return checks
    if any(t.dtype != "float32" for t in (*manifest.inputs, *manifest.outputs, *manifest.weights)):
        notes.append("library kernels not judged against the claim: the problem has tensors other than fp32")
        return checks
    why = kernel_evidence(names, precision, SPLIT_BF16_LAUNCHES * split_bf16_calls)
    if not why:
        return checks
    return [c for c in checks if c.name != "precision_claim"] + [
        DynamicCheck("precision_claim", "fail", why + " (kernel names in the CUPTI profile)")]


def _input_notes(prog: mf.ProgramDir, spec: ReferenceSpec, precision: str, source: str) -> list[str]:
    notes = []
    claimed = prog.manifest.precision
    if source == "requested" and claimed != precision:
        notes.append(f"judged at {precision} (requested); the manifest claims {claimed}")
    elif source == "manifest":
        notes.append(f"judged at {precision}, the manifest's claim (no precision requested)")
    if prog.weights is not None:
        notes.append(f"{prog.weights.name} in the program folder is not used: the Verifier draws the weights from the "
                     "reference model itself")
    if spec.path is not None:
        try:
            Path(spec.path).resolve().relative_to(prog.root.resolve())
            notes.append("the reference was taken from inside the program folder (the manifest's); pass a "
                         "reference explicitly to verify against an independent copy")
        except ValueError:
            pass
    return notes


def _child_phases(phases: list[PhaseTiming], out: ChildOutcome, rename: dict[str, str]) -> None:
    reported = (out.result or {}).get("phases") or {}
    if reported:
        for name, secs in reported.items():
            phases.append(PhaseTiming(rename.get(name, name), float(secs)))
            if name == "correctness":  # its parts by kind of work (run/cost.py), listed under it
                costs = ((out.result or {}).get(name) or {}).get("costs") or []
                phases += [PhaseTiming(f"{name}: {what}", float(t), part_of=name) for what, t in costs]
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


def _finish(run: _Run, result: VerificationResult, *, table: TimingTable | None = None,
            kernels: tuple[KernelRecord, ...] = (), ceilings: Ceilings | None = None, details: GpuDetails | None = None,
            device: str = "") -> Verification:
    prog, o = run.prog, run.options
    manifest = prog.manifest
    source = prog.read_source()
    rubric = build_rubric(source=source, manifest=manifest, findings=result.findings, checks=result.checks,
                          kernels=kernels)
    summary = summarise(kernels, ceilings, run.precision) if kernels else None
    fb = make_feedback(result, profile=summary, timings=table, precision=run.precision,
                       techniques=tuple(detect_techniques(source)))
    report = VerificationReport(program=manifest.name, precision=run.precision, arch=run.arch, result=result,
                                rubric=rubric, timings=table, kernels=kernels, ceilings=ceilings, feedback=fb.text,
                                device=device, created=now_utc(), commit=_commit(), command=o.command,
                                notes=tuple(run.notes), phases=tuple(run.phases), details=details,
                                claimed_precision=manifest.precision, precision_source=run.source, seed=run.seed,
                                weights_seed=run.weights_seed,
                                shapes=(*(n for n, _ in o.judged), shape_label(o.at)) if o.at else ())
    files = write_report(report, prog.root) if o.write else None
    if o.write and result.ok and run.tuning and run.tuning.get("text"):
        _write_tuning(prog.root, run.tuning)
    return Verification(result, report, files, tuple(run.phases), prog.library, run.tuning)


def _write_tuning(folder: Path, tuning: dict[str, str]) -> None:
    """The GEMM algorithms and convolution engines the timed calls chose, merged into the folder's tuning
    file (:mod:`stitchcuda.tuning`): the program's next process, and its wheel, start with them."""
    from ..tuning import identity_of, merge_into

    try:
        merge_into(folder, tuning["text"], identity_of(tuning["identity"]))
    except OSError:
        pass  # an optimisation for later processes: a folder that cannot take it loses only that


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
    validate_reference(spec, prog.manifest, manifest_file=prog.manifest_path)
    arch = options.arch or os.environ.get("STITCHCUDA_ARCH") or prog.manifest.arch
    try:
        built = build_candidate(prog, arch)
    except NoToolchain as e:
        raise VerifyEnvironmentError(str(e)) from None
    if not built.ok or built.library is None:
        ce = CompileError.from_output(built.output)
        return ProfileOnly((), None, None, ChildOutcome("crash", None, None, "build", built.seconds), ce)
    precision = get_policy(options.precision or prog.manifest.precision).name
    seed = options.seed if options.seed is not None else fresh_seed()
    wseed = options.weights_seed if options.weights_seed is not None else fresh_seed()
    out = run_worker(_job(prog, built.library, spec, options, "profile", precision, seed, wseed), options.limits)
    _input_problem(out)
    why = _environment_of(out)
    if why:
        raise VerifyEnvironmentError(why)
    pr = (out.result or {}).get("profile") or {}
    return ProfileOnly(tuple(_get(pr, "kernels", tuple[KernelRecord, ...]) or ()), _get(pr, "details", ProfileDetails),
                       _get(pr, "ceilings", Ceilings), out, out.crash or out.timeout)


__all__ = ["VerifyOptions", "Verification", "VerifyEnvironmentError", "verify", "verify_program", "run_worker",
           "profile_program_dir", "ProfileOnly",
           "EXIT_PASSED", "EXIT_FAILED", "EXIT_BAD_INPUT", "EXIT_CANNOT_VERIFY"]
