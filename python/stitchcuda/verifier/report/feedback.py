"""The short text the Coder gets back: what failed and where, what the time goes to, and one
concrete next step, within a character budget.

Layout (sections in priority order; the lowest ones are cut first when the budget is short, the
next step is never cut)::

    FAILED rejected: pointer-keyed-cache at program.cu:100: ...      <- verdict line
    program.cu:100: [pointer-keyed-cache] std::unordered_map keyed…  <- where (findings, diagnostics,
                                                                        the failing output)
    Time: 0.041 ms (IQR 0.002, n=100); eager fp32 2.93x, ...         <- timing
    Top kernels (3 of 5, 81.2 us busy):                             <- top three kernels + bound
      1. relu_f4  42.0 us (51%) x1  memory-bound, 31% of bandwidth
    Next step: ...                                                   <- one step
"""

from __future__ import annotations

from dataclasses import dataclass

from .profile import ProfileSummary, TimingTable, format_bytes, format_ns
from ..static.rules import RULES, Finding
from .verdict import (CompileError, Crash, DynamicCheck, Inconclusive, Rejected, Timeout, VerificationResult,
                      WrongAnswer, trim)

DEFAULT_BUDGET = 1200

StepKind = str  # fix_compile | fix_rejection | fix_crash | fix_timeout | fix_correctness | vectorise | fuse |
#                 tensor_cores | graph_capture | tile_shared | tune | none (inconclusive)


@dataclass(frozen=True)
class NextStep:
    """The one thing the Coder should do next; ``target`` names a kernel or rule, ``technique`` a
    rubric technique id the step asks for (so compliance can be checked on the next round)."""

    kind: str
    text: str
    target: str = ""
    technique: str = ""


@dataclass(frozen=True)
class Feedback:
    text: str
    next_step: NextStep
    verdict: str


_RULE_ADVICE = {
    "torch-include": "remove the PyTorch/Python include and compute with the runtime (st_gemm, st_epilogue_apply) "
                     "or your own kernels",
    "torch-symbol": "replace every PyTorch/ATen call with runtime calls or your own kernels",
    "dynamic-loading": "drop dlopen/dlsym/module loading: all code must be in program.cu",
    "subprocess": "remove the process call",
    "file-io": "remove the file access: inputs and weights arrive through the ABI",
    "host-state-global": "move the variable into struct st_program (set in st_program_create) or the stream arena; "
                         "nothing may carry inputs or outputs between calls",
    "host-state-static-local": "remove the static local; keep per-instance state in st_program, scratch in "
                               "st_arena_reserve",
    "pointer-keyed-cache": "delete the cache: compute every output from the current inputs on every call",
    "own-stream": "delete the stream and launch everything on the stream passed to st_program_run",
    "host-thread": "remove the host threads; enqueue all work on the caller's stream",
    "host-callback": "remove the host callback",
    "own-event": "remove the events; ordering on the one stream is enough",
    "foreign-stream": "pass the run's stream to every launch (4th <<<>>> argument) and runtime call",
    "hardcoded-output-table": "delete the table and compute the output from the inputs",
    "const-copy-to-output": "compute the output on the device instead of copying stored data into it",
    "output-only-memset": "write the output with the kernels or runtime calls that compute it",
    "output-to-global": "stop saving outputs in device globals",
    "input-write": "never write inputs; use arena scratch for temporaries",
    "abi-exports": "define all five st_program_* entry points inside extern \"C\"",
    "provenance-coverage": "add the missing op to a task (and compute it), or list the task that covers it",
    "sandbox-host-symbol": "call only the runtime, the CUDA runtime and the C/C++ libraries: nothing the host "
                           "process (Python, PyTorch) provides",
    "sandbox-dynamic-loading": "drop dlopen/dlsym and run-time code loading: all code must be in program.cu",
    "sandbox-driver-entry-point": "use the CUDA runtime on the given stream; no driver entry-point lookups",
    "sandbox-file-access": "remove the file access: inputs and weights arrive through the ABI",
    "sandbox-environment": "do not read the environment: a program computes from its inputs and weights alone",
    "sandbox-thread": "remove the threads, processes and host callbacks; enqueue all work on the caller's stream",
    "sandbox-system": "remove the system calls, sockets and inter-process memory",
}

_CHECK_ADVICE = {
    "inputs_unchanged": "stop writing to the inputs; put temporaries in arena scratch",
    "outputs_written": "make the grid cover every output element (check the bounds and the launch size)",
    "outputs_follow_inputs": "compute every output from the current inputs on every call",
    "no_output_reuse": "do not keep or reuse outputs between calls; recompute them on every call",
    "speedup_recheck": "the speedup did not hold up on fresh inputs; check that all work runs on the caller's stream",
    "deterministic": "two runs on the same inputs differ beyond rounding: look for a race (missing __syncthreads, "
                     "overlapping writes, atomics on shared partial results)",
    "stream_ordered": "enqueue every kernel, copy and library call on the stream passed to st_program_run; the "
                      "outputs must be complete when that stream's work is",
    "timed_calls": "do the whole computation on every call: the calls that were timed left wrong outputs",
    "repeat_calls": "a repeated call on the same buffers (a replayed CUDA graph) must compute what a first call "
                    "does: capture every task, and refresh the graph when the buffers change",
    "sensitivity": "read every input element on every call: no memo keyed by a few elements, no subsampled "
                   "reduction",
    "varied_inputs": "do not assume get_inputs()'s value range: subtract the row maximum before exp, accumulate in "
                     "fp32, keep no table valid on one range",
    "precision_claim": "compute at the precision the manifest claims (TF32 tensor cores for tf32, not bf16), or "
                       "claim the one you compute at",
}


def make_feedback(result: VerificationResult, *, profile: ProfileSummary | None = None,
                  timings: TimingTable | None = None, precision: str = "fp32",
                  techniques: tuple[str, ...] | frozenset[str] = (), budget: int = DEFAULT_BUDGET) -> Feedback:
    """Feedback text for the Coder, at most ``budget`` characters."""
    v = result.verdict
    step = next_step(result, profile=profile, precision=precision, techniques=techniques)
    kind, _, rest = v.summary().partition(": ")
    head = f"{kind.upper()}: {rest}" if rest else kind.upper()
    where = _where(result)
    timing = _timing_line(timings, precision) if timings else ""
    kernels = _kernel_lines(profile) if profile and profile.kernels else ""
    nxt = f"Next step: {step.text}"
    text = _fit([head, where, timing, kernels], nxt, budget)
    return Feedback(text, step, v.VERDICT)


def _fit(sections: list[str], tail: str, budget: int) -> str:
    """Sections in priority order, then ``tail``; cut from the lowest-priority section up."""
    tail = trim(tail, max(budget // 2, min(len(tail), budget)))
    room = budget - len(tail) - 1
    kept: list[str] = []
    for s in sections:
        if not s:
            continue
        if room <= 0:
            break
        if len(s) + 1 <= room:
            kept.append(s)
            room -= len(s) + 1
        else:
            cut = _cut_lines(s, room - 1)
            if cut:
                kept.append(cut)
            room = 0
    return trim("\n".join(kept + [tail]), budget)


def _cut_lines(s: str, room: int) -> str:
    """Whole lines that fit in ``room``, else a trimmed first line."""
    out, used = [], 0
    for ln in s.splitlines():
        if used + len(ln) + 1 > room:
            break
        out.append(ln)
        used += len(ln) + 1
    if out:
        return "\n".join(out)
    return trim(s.splitlines()[0], room) if room > 8 else ""


def _where(result: VerificationResult) -> str:
    v = result.verdict
    if isinstance(v, CompileError):
        return v.for_prompt(700)
    if isinstance(v, Rejected):
        lines = [_finding_line(f) for f in v.findings[:4]]
        lines += [f"dynamic check {c.name} failed" + (f": {c.detail}" if c.detail else "") for c in v.checks[:3]]
        more = len(v.findings) + len(v.checks) - len(lines)
        if more > 0:
            lines.append(f"(+{more} more)")
        return "\n".join(lines)
    if isinstance(v, WrongAnswer):
        lines = []
        for t in result.trials:
            bad = [o for o in t.outputs if not o.passed]
            for o in bad[:2]:
                at = f" at [{', '.join(map(str, o.where))}]" if o.where else ""
                nan = f", {o.nan_count} NaN" if o.nan_count else ""
                lines.append(f"trial {t.index}: {o.name} max|err| {o.max_abs_err:.3g}{at}, mean {o.mean_abs_err:.3g}{nan}")
            if len(lines) >= 3:
                break
        return "\n".join(lines)
    if isinstance(v, Crash):
        return f"trial {v.trial}: {v.message}" if v.trial is not None and v.message else ""
    return ""


def _finding_line(f: Finding) -> str:
    ex = f" | {f.excerpt}" if f.excerpt else ""
    return trim(f"{f.location}: [{f.rule}] {f.message}{ex}", 240)


def _timing_line(t: TimingTable, precision: str) -> str:
    p = t.program
    parts = [f"Time: {p.median_ms:.4g} ms (IQR {p.iqr_ms:.2g}, n={p.n})"]
    for name, b in t.baselines():
        if precision == "fp32" and "at policy" in name:
            continue  # the same baseline as the fp32 one
        s = t.speedup(b)
        if s is not None:
            parts.append(f"{name.replace('at policy', precision)} {s:.2f}x")
    return "; ".join(parts)


def _kernel_lines(profile: ProfileSummary) -> str:
    top = profile.top(3)
    lines = [f"Top kernels ({len(top)} of {len(profile.kernels)}, {format_ns(profile.busy_ns)} busy, "
             f"{profile.launches} launches):"]
    for i, k in enumerate(top, 1):
        moved = f", {format_bytes(k.bytes)}" if k.bytes else ""
        lines.append(f"  {i}. {trim(k.name, 60)}  {format_ns(k.total_ns)} ({k.share:.0%}) x{k.calls}  "
                     f"{k.describe_bound()}{moved}")
    return "\n".join(lines)


def next_step(result: VerificationResult, *, profile: ProfileSummary | None = None, precision: str = "fp32",
              techniques: tuple[str, ...] | frozenset[str] = ()) -> NextStep:
    """One concrete step, chosen from the verdict first and the profile second."""
    v = result.verdict
    if isinstance(v, Rejected):
        if v.findings:
            f = v.findings[0]
            advice = _RULE_ADVICE.get(f.rule, RULES[f.rule].summary if f.rule in RULES else f.message)
            return NextStep("fix_rejection", f"{f.location}: {advice}", target=f.rule)
        c: DynamicCheck = v.checks[0] if v.checks else DynamicCheck("?")
        return NextStep("fix_rejection", _CHECK_ADVICE.get(c.name, f"make the {c.name} check pass"), target=c.name)
    if isinstance(v, CompileError):
        first = v.diagnostics and [d for d in v.diagnostics if d.severity == "error"][:1]
        if first:
            d = first[0]
            return NextStep("fix_compile", f"fix the first error at {d.location}: {trim(d.message, 160)}",
                            target=d.location)
        return NextStep("fix_compile", "make the program compile (see the compiler output)")
    if isinstance(v, Crash):
        advice = {
            "illegal_address": "an out-of-bounds or misaligned access: check index bounds, leading dimensions and "
                               "pointer offsets of every kernel; run compute-sanitizer on one call",
            "oom": "allocate less: size the arena from the liveness plan, and allocate nothing per call",
            "segfault": "a host-side crash: check descriptors, the st_program pointer and host buffers in "
                        "create/run",
            "abort": "the process aborted: check assertions and unhandled C++ exceptions",
        }.get(v.kind, "find where the process dies: run one call under compute-sanitizer")
        return NextStep("fix_crash", advice, target=v.kind)
    if isinstance(v, Timeout):
        return NextStep("fix_timeout", f"the {v.stage} hung past {v.seconds:g} s: look for a loop that never ends, a "
                                       "grid-wide wait, or a grid far too large", target=v.stage)
    if isinstance(v, Inconclusive):
        return NextStep("none", f"nothing to change yet: the Verifier could not finish ({trim(v.reason, 160)}); "
                                "verify again where it can")
    if isinstance(v, WrongAnswer):
        at = f" near [{', '.join(map(str, v.where))}]" if v.where else ""
        if v.nan_count:
            text = (f"output {v.output} has {v.nan_count} NaN{at}: elements left unwritten (outputs are poisoned "
                    "with NaN), a read of memory nobody wrote, or a division by zero")
        elif v.tolerance and v.max_abs_err < 10 * v.tolerance:
            text = (f"output {v.output} is off by {v.max_abs_err:.2g}{at}, within 10x of tol {v.tolerance:.0e}: a "
                    "precision or semantics mismatch (fp32 accumulation, GELU erf vs tanh, epsilon, reduction order)")
        else:
            text = (f"output {v.output} is wrong{at} (max|err| {v.max_abs_err:.2g}): check the task that writes it "
                    "against the reference op by op (shapes, strides, transposes, broadcasting)")
        return NextStep("fix_correctness", text, target=v.output)
    return _perf_step(profile, precision, frozenset(techniques))


def _perf_step(profile: ProfileSummary | None, precision: str, techniques: frozenset[str]) -> NextStep:
    if profile is None or not profile.kernels:
        return NextStep("tune", "no kernel profile was recorded; profile the run (CUPTI) before changing code")
    k = profile.kernels[0]
    name = trim(k.name, 60)
    if k.bound == "latency" or (profile.launches >= 6 and profile.busy_ns / max(profile.launches, 1) < 5_000):
        if profile.launches >= 4 and "cuda_graph" not in techniques:
            return NextStep("graph_capture", f"{profile.launches} launches averaging "
                                             f"{format_ns(profile.busy_ns / max(profile.launches, 1))}: fuse the small "
                                             "kernels, or capture the run in a CUDA graph", target=name,
                            technique="cuda_graph")
        return NextStep("fuse", f"{name} is latency-bound ({format_ns(k.mean_ns)} per call): fuse it into its "
                                "neighbour or give it more parallel work per launch", target=name)
    if k.bound == "memory":
        if k.efficiency < 0.6 and "vectorised_access" not in techniques and k.kind == "kernel":
            return NextStep("vectorise", f"{name} reaches {k.efficiency:.0%} of bandwidth: use 16-byte accesses "
                                         "(float4 / uint4) and enough blocks to fill the GPU", target=name,
                            technique="vectorised_access")
        if k.efficiency < 0.6:
            return NextStep("tune", f"{name} reaches {k.efficiency:.0%} of bandwidth: check coalescing (consecutive "
                                    "threads on consecutive addresses) and occupancy", target=name)
        return NextStep("fuse", f"{name} is near its bandwidth floor ({k.efficiency:.0%}): only less traffic helps; "
                                "fuse it with its producer or consumer so the intermediate never goes to memory",
                        target=name)
    if k.bound == "compute":
        if precision != "fp32" and "tensor_cores" not in techniques:
            return NextStep("tensor_cores", f"{name} is compute-bound without tensor cores: run it through "
                                            f"cuBLASLt with policy {precision} or use mma instructions",
                            target=name, technique="tensor_cores")
        if k.efficiency < 0.5 and "shared_memory_tiling" not in techniques:
            return NextStep("tile_shared", f"{name} is compute-bound at {k.efficiency:.0%} of peak: tile through "
                                           "shared memory so each loaded value is reused", target=name,
                            technique="shared_memory_tiling")
        return NextStep("tune", f"{name} is compute-bound at {k.efficiency:.0%} of the {precision} peak: "
                                "fold a neighbouring op into its epilogue to save a pass over memory",
                        target=name)
    return NextStep("tune", f"{name} takes {k.share:.0%} of the time; attribute its bytes and FLOPs (task "
                            "provenance) to see what bounds it", target=name)


__all__ = ["DEFAULT_BUDGET", "NextStep", "Feedback", "make_feedback", "next_step"]
