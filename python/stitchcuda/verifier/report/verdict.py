"""Typed verdicts on a candidate program, and the nvcc diagnostic parser.

Failures are values (STYLE.md, 8): a compile error, a static or dynamic rejection, a crash, a
timeout and a wrong answer are each a frozen dataclass carried in the report, never an
exception. :func:`build_result` turns the parts the Verifier collected into one
:class:`VerificationResult` with a single verdict, in this order of precedence:

    Rejected (static rules, the built library's imports)  >  CompileError  >  Crash  >  Timeout
        >  Rejected (dynamic anti-hacking checks)  >  WrongAnswer  >  Inconclusive  >  Passed

Static rejection comes first because the Verifier does not build (or run) a program it has
refused; a failed dynamic anti-hacking check outranks a wrong answer because it names the cheat
(a program that zeroes its inputs also answers wrongly on the next trial). ``Inconclusive`` is
what the Verifier says when it could not finish judging for a reason that is not the candidate's
(no GPU, the harness itself out of memory): a verdict is never a guess, and an unfinished
verification is never a pass.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import ClassVar, Literal, Union

from ..static.rules import Finding

# ------------------------------------------------------------------ nvcc diagnostics

DiagSeverity = Literal["error", "warning", "note", "remark"]


@dataclass(frozen=True)
class Diagnostic:
    """One compiler diagnostic: ``file:line[:column]: severity: message``."""

    file: str
    line: int
    severity: DiagSeverity
    message: str
    column: int = 0
    code: str = ""  # EDG number ("20", "177-D") when nvcc printed one
    tool: str = "nvcc"  # nvcc (front end), host (gcc/clang), ptxas, nvlink, ld
    source_line: str = ""  # the echoed source line, when the compiler printed it
    details: tuple[str, ...] = ()  # extra lines ("argument types are: ...", "detected during ...")

    @property
    def location(self) -> str:
        if not self.file:
            return self.tool
        return f"{self.file}:{self.line}" if self.line else self.file

    def format(self, *, with_source: bool = True) -> str:
        text = f"{self.location}: {self.severity}: {self.message}"
        for d in self.details[:3]:
            text += f"\n    {trim(d, 200)}"
        if with_source and self.source_line:
            text += f"\n    | {trim(self.source_line.strip(), 160)}"
        return text


_EDG = re.compile(r"^(?P<file>[^\s(][^()]*?)\((?P<line>\d+)\): (?P<sev>catastrophic error|error|warning|remark|note)"
                  r"(?: #(?P<code>[\w-]+))?: (?P<msg>.*)$")
_GCC = re.compile(r"^(?P<file>[^:\s][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)? (?P<sev>fatal error|error|warning|note): "
                  r"(?P<msg>.*)$")
_TOOL = re.compile(r"^(?P<tool>ptxas|nvlink|nvcc|fatbinary|cicc)\s+(?P<sev>fatal|error|warning|info)\s*: (?P<msg>.*)$")
_LD = re.compile(r"^(?:/\S*/)?(?:ld|collect2)(?:\.\w+)?: (?:(?P<sev>error|warning): )?(?P<msg>.*)$")
_CARET = re.compile(r"^\s*[\^~]+\s*$|^\s*\|\s*[\^~ ]*$")
_GCC_ECHO = re.compile(r"^\s*\d*\s*\|")
_NOISE = re.compile(r"^(?:\d+ errors? detected in the compilation of|compilation terminated|Remark: The warnings can be "
                    r"suppressed|In file included from|\s+from |# --error 0x)")


def _sev(s: str) -> DiagSeverity:
    s = s.lower()
    if s in ("fatal", "fatal error", "catastrophic error", "error"):
        return "error"
    if s in ("warning",):
        return "warning"
    if s in ("info", "note"):
        return "note"
    return "remark"


def _short(path: str) -> str:
    """Build folders are temporary: name the file, keep system paths whole."""
    if path.startswith(("/usr/", "/opt/")) or "/include/" in path:
        return path
    return os.path.basename(path)


def parse_nvcc_output(text: str) -> list[Diagnostic]:
    """Parse nvcc's combined output (EDG front end, host compiler, ptxas, nvlink, ld) in order."""
    diags: list[Diagnostic] = []
    cur: dict | None = None
    block: list[str] = []

    def flush() -> None:
        nonlocal cur, block
        if cur is None:
            return
        src, details = "", []
        for k, ln in enumerate(block):
            nxt = block[k + 1] if k + 1 < len(block) else ""
            if _CARET.match(ln):
                continue
            if _GCC_ECHO.match(ln):
                body = ln.split("|", 1)[1]
                if body.strip() and not re.fullmatch(r"\s*[\^~]+\s*", body) and not src:
                    src = body.rstrip()
                continue
            if _CARET.match(nxt):
                src = ln.rstrip()
                continue
            if ln.strip():
                details.append(ln.strip())
        diags.append(Diagnostic(source_line=src, details=tuple(details), **cur))
        cur, block = None, []

    for raw in text.splitlines():
        line = raw.rstrip("\r")
        m = _EDG.match(line)
        if m:
            flush()
            cur = dict(file=_short(m["file"]), line=int(m["line"]), severity=_sev(m["sev"]),
                       message=m["msg"].strip(), code=m["code"] or "", tool="nvcc")
            continue
        m = _GCC.match(line)
        if m and not line.startswith(("ptxas", "nvlink", "nvcc")):
            flush()
            cur = dict(file=_short(m["file"]), line=int(m["line"]), column=int(m["col"] or 0),
                       severity=_sev(m["sev"]), message=m["msg"].strip(), tool="host")
            continue
        m = _TOOL.match(line)
        if m:
            flush()
            cur = dict(file="", line=0, severity=_sev(m["sev"]), message=m["msg"].strip(), tool=m["tool"])
            continue
        m = _LD.match(line)
        if m and ("undefined reference" in line or m["sev"]):
            flush()
            cur = dict(file="", line=0, severity=_sev(m["sev"] or "error"), message=m["msg"].strip(), tool="ld")
            continue
        if _NOISE.match(line):
            flush()
            continue
        if cur is not None:
            if not line.strip() and block and not block[-1].strip():
                flush()
                continue
            block.append(line)
        # text outside any diagnostic (nvcc's own chatter) is ignored
    flush()
    return diags


def relevant_diagnostics(diags: list[Diagnostic] | tuple[Diagnostic, ...], limit: int = 5) -> list[Diagnostic]:
    """Errors first, de-duplicated, in order; warnings only when there is no error. Notes that
    follow an error stay with the report only through its details."""
    seen: set[tuple[str, int, str]] = set()
    errors, warnings = [], []
    for d in diags:
        key = (d.file, d.line, d.message)
        if key in seen:
            continue
        seen.add(key)
        if d.severity == "error":
            errors.append(d)
        elif d.severity == "warning":
            warnings.append(d)
    return (errors or warnings)[:limit]


def trim(text: str, limit: int) -> str:
    """Cut ``text`` to at most ``limit`` characters, marking the cut."""
    if len(text) <= limit:
        return text
    if limit <= 1:
        return text[:limit]
    return text[: limit - 1].rstrip() + "…"


# ------------------------------------------------------------------ dynamic checks and trials

CheckStatus = Literal["pass", "fail", "not_run"]

#: The dynamic anti-hacking checks the GPU Verifier runs (names used in reports and feedback), in
#: the order a rejection lists them: the most specific reason first.
DYNAMIC_CHECKS = {
    "timed_calls": "a random, unannounced sample of the timed calls, spread over the whole timed phase and the last "
                   "calls included (inputs changed, outputs refilled before each), computed the right outputs",
    "memory_bounds": "nothing outside the buffers handed over changed (guard zones around every input, output and "
                     "weight, checked after every call)",
    "weights_unchanged": "the weights handed to create are bit-identical after every phase",
    "sanitizer": "compute-sanitizer (memcheck, racecheck, synccheck) found no error in one small trial",
    "runtime_stream": "every runtime call the program made during a run was on the caller's stream",
    "hidden_work": "the program's time by CUDA events on its stream agrees with its time by the host clock around "
                   "device-wide synchronisations (no work hidden from the events)",
    "memory_leak": "device and host memory do not grow with the number of calls",
    "stream_capture": "a call captured from the caller's stream into a graph, then replayed on new contents, "
                      "computes the right outputs",
    "ties": "index outputs (argmax, argmin, sort, top-k) follow the reference's rule on inputs with exact ties",
    "no_output_reuse": "a run on the same buffers with new contents gives new outputs (no reuse of previous outputs)",
    "outputs_follow_inputs": "outputs change when the inputs change (no constant or cached answer)",
    "sensitivity": "changing one input element (anywhere, and where a shortcut would not look: the first steps of a "
                   "sequence, the start of a scan, the far end of a reduction) changes the outputs that depend on it "
                   "as the reference's change (no memoisation keyed by a fingerprint, no subsampled reduction)",
    "repeat_calls": "repeated calls on the same buffers (the path a program's CUDA graph replays) are right",
    "varied_inputs": "right on inputs drawn from other distributions (scale, offset, heavy tails, sparse, "
                     "structured), not only on get_inputs()'s",
    "precision_claim": "errors match the claimed precision, not a lower one, over several trials and states; no "
                       "runtime call and no library kernel computes below the claimed policy",
    "stream_ordered": "the outputs are complete when the work queued on the given stream completes",
    "inputs_unchanged": "inputs are bit-identical after the run",
    "outputs_written": "every element of every output was written (poisoned or caller-filled outputs overwritten)",
    "deterministic": "the same inputs run again, in several trials and under launch pressure, give the same outputs "
                     "(beyond rounding: a race)",
    "speedup_recheck": "a speedup over 10x holds up on fresh inputs with L2 flushed and outputs checked",
}


@dataclass(frozen=True)
class DynamicCheck:
    name: str
    status: CheckStatus = "not_run"
    detail: str = ""


@dataclass(frozen=True)
class OutputCheck:
    """One output of one trial against the reference (float64)."""

    name: str
    max_abs_err: float
    mean_abs_err: float
    tolerance: float
    where: tuple[int, ...] = ()  # index of the worst element
    expected: float | None = None
    got: float | None = None
    nan_count: int = 0
    passed: bool = True
    # against the reference computed in float64: only where the fp32 comparison failed and a float64
    # copy of the model fits on the device
    max_abs_err_f64: float | None = None
    mean_abs_err_f64: float | None = None
    atol: float | None = None  # the absolute tolerance applied: tol, or tol * RMS for an output below 1
    judged: str = "elementwise"  # elementwise | float64 | fp32-own (near the bound) | norm-relative (ill-conditioned)


@dataclass(frozen=True)
class TrialResult:
    index: int
    outputs: tuple[OutputCheck, ...]
    seed: int | None = None
    label: str = ""  # "" for a plain random trial; else what the trial was (a varied distribution, ...)

    @property
    def passed(self) -> bool:
        return all(o.passed for o in self.outputs)


# ------------------------------------------------------------------ verdicts


@dataclass(frozen=True)
class CompileError:
    VERDICT: ClassVar[str] = "compile_error"
    diagnostics: tuple[Diagnostic, ...] = ()
    log: str = ""  # the raw compiler output, trimmed

    @classmethod
    def from_output(cls, output: str, *, log_chars: int = 20000) -> "CompileError":
        return cls(tuple(parse_nvcc_output(output)), trim(output, log_chars))

    def for_prompt(self, max_chars: int = 1200, limit: int = 5) -> str:
        """The first relevant diagnostics as ``file:line: severity: message``, within ``max_chars``."""
        rel = relevant_diagnostics(self.diagnostics, limit=len(self.diagnostics))
        if not rel:
            tail = self.log.strip().splitlines()[-5:]
            return trim("compiler failed without a parsable diagnostic:\n" + "\n".join(tail), max_chars)
        parts: list[str] = []
        used = 0
        for k, d in enumerate(rel[:limit]):
            text = d.format(with_source=True)
            if used + len(text) + 1 > max_chars:
                text = d.format(with_source=False)
            if used + len(text) + 1 > max_chars:
                if not parts:
                    parts.append(trim(text, max_chars))
                break
            parts.append(text)
            used += len(text) + 1
        more = len(rel) - len(parts)
        if more > 0:
            note = f"(+{more} more)"
            if used + len(note) + 1 <= max_chars:
                parts.append(note)
        return trim("\n".join(parts), max_chars)

    def summary(self) -> str:
        rel = relevant_diagnostics(self.diagnostics, 1)
        return f"compile error: {rel[0].location}: {rel[0].message}" if rel else "compile error"


@dataclass(frozen=True)
class WrongAnswer:
    VERDICT: ClassVar[str] = "wrong_answer"
    trial: int
    max_abs_err: float
    mean_abs_err: float
    where: tuple[int, ...] = ()
    output: str = ""
    tolerance: float = 0.0
    expected: float | None = None
    got: float | None = None
    nan_count: int = 0
    failed_trials: int = 1
    n_trials: int = 0
    label: str = ""  # what the failing trial was ("" for a plain random trial)
    atol: float | None = None

    def summary(self) -> str:
        at = f" at [{', '.join(map(str, self.where))}]" if self.where else ""
        pair = ""
        if self.expected is not None and self.got is not None:
            pair = f" (expected {self.expected:.6g}, got {self.got:.6g})"
        nan = f", {self.nan_count} NaN" if self.nan_count else ""
        trial = f"trial {self.trial}" + (f" ({self.label})" if self.label else "")
        tol = f"tol {self.tolerance:.0e}"
        if self.atol is not None and self.atol < self.tolerance:
            tol += f" (atol {self.atol:.1e}: judged relative to the output's scale)"
        return (f"wrong answer: output {self.output or '?'}, {trial}: max |err| {self.max_abs_err:.3g}"
                f"{at}{pair} > {tol}, mean |err| {self.mean_abs_err:.3g}{nan}; "
                f"{self.failed_trials}/{self.n_trials or '?'} trials failed")


CrashKind = Literal["illegal_address", "segfault", "abort", "oom", "other"]


@dataclass(frozen=True)
class Crash:
    VERDICT: ClassVar[str] = "crash"
    kind: CrashKind
    message: str = ""
    trial: int | None = None

    def summary(self) -> str:
        return f"crash ({self.kind}): {self.message}" if self.message else f"crash ({self.kind})"


def classify_crash(returncode: int | None, output: str = "", trial: int | None = None,
                   *, max_chars: int = 600) -> Crash:
    """A Crash from a child process's exit status and output (signals are negative returncodes)."""
    low = output.lower()
    if any(s in low for s in ("illegal memory access", "illegal address", "misaligned address",
                              "unspecified launch failure", "cudaerrorillegaladdress", "out of bounds")):
        kind: CrashKind = "illegal_address"
    elif any(s in low for s in ("out of memory", "cudaerrormemoryallocation", "alloc_failed", "st_err_out_of_memory",
                                "memoryerror")):
        kind = "oom"
    elif returncode in (-11, 139) or "segmentation fault" in low:
        kind = "segfault"
    elif returncode in (-6, 134) or "abort" in low or "terminate called" in low:
        kind = "abort"
    else:
        kind = "other"
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    key = [ln for ln in lines if re.search(r"error|illegal|fault|abort|memory|terminate", ln, re.I)]
    msg = (key[-1] if key else (lines[-1] if lines else f"exit status {returncode}")).strip()
    return Crash(kind, trim(msg, max_chars), trial)


@dataclass(frozen=True)
class Timeout:
    VERDICT: ClassVar[str] = "timeout"
    seconds: float
    stage: str = "run"  # build | run | timing

    def summary(self) -> str:
        return f"timeout: {self.stage} did not finish in {self.seconds:g} s"


@dataclass(frozen=True)
class Rejected:
    VERDICT: ClassVar[str] = "rejected"
    reasons: tuple[str, ...]
    findings: tuple[Finding, ...] = ()
    checks: tuple[DynamicCheck, ...] = ()

    def summary(self) -> str:
        return "rejected: " + "; ".join(self.reasons[:3]) + (f" (+{len(self.reasons) - 3} more)"
                                                               if len(self.reasons) > 3 else "")


@dataclass(frozen=True)
class Inconclusive:
    """The Verifier could not finish for a reason that is not the candidate's (no GPU, the harness out
    of memory, a tool missing). ``ran`` says what was judged before it stopped."""

    VERDICT: ClassVar[str] = "inconclusive"
    reason: str
    ran: tuple[str, ...] = ()

    def summary(self) -> str:
        done = f" (done: {', '.join(self.ran)})" if self.ran else ""
        return f"inconclusive: {self.reason}{done}"


#: What a pass on a reference whose outputs do not depend on its inputs is marked with.
DEGENERATE = "degenerate: outputs independent of inputs"


@dataclass(frozen=True)
class Passed:
    VERDICT: ClassVar[str] = "passed"
    trials: int
    max_abs_err: float
    tolerance: float
    warnings: tuple[str, ...] = ()
    degenerate: str = ""  # why the pass proves nothing (DEGENERATE and the evidence), "" otherwise
    norm_relative: int = 0  # trials judged on the norm-relative error (ill-conditioned at their inputs)
    fp32_own: int = 0  # trials judged at fp32's own accuracy (compare.within_fp32_own), not in norm

    def summary(self) -> str:
        # The bound is elementwise, |err| <= atol + tol |ref|: a large max |err| on large values passes.
        head = f"passed ({DEGENERATE})" if self.degenerate else "passed"
        if self.norm_relative or self.fp32_own:
            plain = self.trials - self.norm_relative - self.fp32_own
            ill = (f", {self.norm_relative} ill-conditioned (the reference at fp32 or at the policy misses float64) "
                   "judged on the norm-relative error") if self.norm_relative else ""
            own = (f", {self.fp32_own} within 2x the fp32 reference's own distance from float64 (fp32 itself near "
                   "the bound)") if self.fp32_own else ""
            return (f"{head}: {self.trials} trials, {plain} with every element within tol {self.tolerance:.0e} of "
                    f"|ref|{ill}{own} (max |err| {self.max_abs_err:.3g})")
        return (f"{head}: {self.trials} trials, every element within tol {self.tolerance:.0e} of |ref| "
                f"(max |err| {self.max_abs_err:.3g})")


Verdict = Union[Passed, WrongAnswer, Crash, Timeout, Rejected, CompileError, Inconclusive]


@dataclass(frozen=True)
class VerificationResult:
    """The Verifier's judgement of one candidate: one verdict and the evidence for it."""

    verdict: Verdict
    trials: tuple[TrialResult, ...] = ()
    findings: tuple[Finding, ...] = ()
    checks: tuple[DynamicCheck, ...] = ()

    @property
    def ok(self) -> bool:
        return isinstance(self.verdict, Passed)

    @property
    def kind(self) -> str:
        return self.verdict.VERDICT

    def to_dict(self) -> dict:
        from ...serial import to_jsonable

        return to_jsonable(self)


def build_result(*, findings: tuple[Finding, ...] | list[Finding] = (), compile_error: CompileError | None = None,
                 crash: Crash | None = None, timeout: Timeout | None = None,
                 trials: tuple[TrialResult, ...] | list[TrialResult] = (),
                 checks: tuple[DynamicCheck, ...] | list[DynamicCheck] = (),
                 tolerance: float | None = None, inconclusive: Inconclusive | None = None,
                 degenerate: str = "") -> VerificationResult:
    """One verdict from the parts (precedence in the module docstring). Failed dynamic checks are
    listed in the order of :data:`DYNAMIC_CHECKS` (the most specific reason first). ``degenerate``
    (why the reference's outputs do not depend on its inputs) marks a pass as proving nothing."""
    findings, trials, checks = tuple(findings), tuple(trials), tuple(checks)

    def result(v: Verdict) -> VerificationResult:
        return VerificationResult(v, trials, findings, checks)

    rejects = [f for f in findings if f.severity == "reject"]
    if rejects:
        return result(Rejected(tuple(f"{f.rule} at {f.location}: {f.message}" for f in rejects), tuple(rejects)))
    if compile_error is not None:
        return result(compile_error)
    if crash is not None:
        return result(crash)
    if timeout is not None:
        return result(timeout)
    order = {name: k for k, name in enumerate(DYNAMIC_CHECKS)}
    failed = sorted((c for c in checks if c.status == "fail"), key=lambda c: order.get(c.name, len(order)))
    if failed:
        return result(Rejected(tuple(f"dynamic check {c.name} failed" + (f": {c.detail}" if c.detail else "")
                                     for c in failed), (), tuple(failed)))
    bad = [t for t in trials if not t.passed]
    if bad:
        first = bad[0]
        worst = max((o for o in first.outputs if not o.passed),
                    key=lambda o: (o.nan_count > 0, _finite(o.max_abs_err)))
        return result(WrongAnswer(trial=first.index, max_abs_err=worst.max_abs_err, mean_abs_err=worst.mean_abs_err,
                                  where=worst.where, output=worst.name, tolerance=worst.tolerance,
                                  expected=worst.expected, got=worst.got, nan_count=worst.nan_count,
                                  failed_trials=len(bad), n_trials=len(trials), label=first.label,
                                  atol=worst.atol))
    if inconclusive is not None:
        return result(inconclusive)
    if not trials:
        raise ValueError("build_result: no failure and no trials; a pass needs at least one trial")
    outs = [o for t in trials for o in t.outputs]
    max_err = max((o.max_abs_err for o in outs), default=0.0)
    tol = tolerance if tolerance is not None else max((o.tolerance for o in outs), default=0.0)
    warns = tuple(f"{f.rule} at {f.location}: {f.message}" for f in findings if f.severity == "warn")
    if degenerate:
        warns += (f"{DEGENERATE} ({degenerate}): this pass proves nothing about the program",)
    norm = sum(any(o.judged == "norm-relative" for o in t.outputs) for t in trials)
    own = sum(any(o.judged == "fp32-own" for o in t.outputs) and all(o.judged != "norm-relative" for o in t.outputs)
              for t in trials)
    return result(Passed(trials=len(trials), max_abs_err=max_err, tolerance=tol, warnings=warns,
                         degenerate=degenerate, norm_relative=norm, fp32_own=own))


def _finite(x: float) -> float:
    return x if x == x and abs(x) != float("inf") else float("inf")


__all__ = [
    "Diagnostic", "parse_nvcc_output", "relevant_diagnostics", "trim",
    "DYNAMIC_CHECKS", "DynamicCheck", "OutputCheck", "TrialResult",
    "CompileError", "WrongAnswer", "Crash", "classify_crash", "Timeout", "Rejected", "Inconclusive", "Passed",
    "DEGENERATE",
    "Verdict",
    "VerificationResult", "build_result",
]
