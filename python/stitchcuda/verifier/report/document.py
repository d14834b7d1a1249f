"""The verification report: report.json (machine), report.md (people), timeline.png (the plot).

Every file is written atomically (temporary file + rename), so a reader never sees half a
report. ``load_report`` reads report.json back into the same dataclasses.
"""

from __future__ import annotations

import datetime as _dt
import json
from dataclasses import dataclass, field
from pathlib import Path

from ...fsutil import atomic_write_text
from ... import serial as serde
from .profile import Ceilings, KernelRecord, ProfileSummary, TimingTable, format_bytes, format_ns, summarise
from .records import GpuDetails, PhaseTiming
from .rubric import Rubric
from .verdict import (DEGENERATE, CompileError, Crash, Inconclusive, Passed, Rejected, Timeout, VerificationResult,
                      WrongAnswer)

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
TIMELINE_PNG = "timeline.png"
SCHEMA = "stitchcuda-report"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class VerificationReport:
    program: str
    precision: str
    arch: str
    result: VerificationResult
    rubric: Rubric | None = None
    timings: TimingTable | None = None
    kernels: tuple[KernelRecord, ...] = ()
    ceilings: Ceilings | None = None
    feedback: str = ""
    device: str = ""
    created: str = ""  # ISO 8601, UTC
    commit: str = ""
    command: str = ""
    notes: tuple[str, ...] = ()
    phases: tuple[PhaseTiming, ...] = ()  # seconds per verification phase (build, correctness, timing, profile)
    details: GpuDetails | None = None  # timing settings, profile attribution, reference top ops, memory
    claimed_precision: str = ""  # the manifest's; ``precision`` is the one judged at
    precision_source: str = ""  # "requested" (an argument of verify / --precision) or "manifest" (none given)
    seed: int | None = None  # of the inputs and every random choice; written only after the run
    weights_seed: int | None = None  # of the reference model the weights were drawn from
    # a dynamic program: the shapes judged, in order ("batch=1, seq=16"); the last is the one this
    # report's trials, timings and profile are of, those before it passed (correctness, dynamic checks)
    shapes: tuple[str, ...] = ()

    def profile(self) -> ProfileSummary:
        return summarise(self.kernels, self.ceilings, self.precision)

    def to_dict(self) -> dict:
        d = serde.to_jsonable(self)
        return {"schema": SCHEMA, "schema_version": SCHEMA_VERSION, **d}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"


@dataclass(frozen=True)
class VerificationReportFiles:
    json: Path
    markdown: Path
    timeline: Path | None
    timeline_renderer: str = ""  # matplotlib | builtin | "" (no kernels to draw)
    notes: tuple[str, ...] = field(default_factory=tuple)


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat()


def write_report(report: VerificationReport, directory: str | Path, *, plot: bool = True) -> VerificationReportFiles:
    """Write report.json, report.md and (when there are kernel records) timeline.png."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    png, renderer, notes = None, "", []
    if plot and report.kernels:
        png, renderer = _timeline(report, directory / TIMELINE_PNG)
        if renderer == "builtin":
            notes.append("timeline drawn by the built-in renderer (matplotlib is not installed)")
    elif plot:
        notes.append("no kernel records: no timeline")
    md = render_markdown(report, timeline=png.name if png else None, notes=tuple(notes))
    # the JSON last: its presence means the whole report is there
    md_path = atomic_write_text(directory / REPORT_MD, md)
    json_path = atomic_write_text(directory / REPORT_JSON, report.to_json())
    return VerificationReportFiles(json_path, md_path, png, renderer, tuple(notes))


def _timeline(report: VerificationReport, path: Path):
    from .timeline import render_timeline_png

    title = f"{report.program} - {report.precision} - {report.device or 'device ?'}"
    return render_timeline_png(report.kernels, path, report.profile(), title)


def load_report(path: str | Path) -> VerificationReport:
    """Read report.json (or the report of a folder) back into a VerificationReport."""
    path = Path(path)
    if path.is_dir():
        path = path / REPORT_JSON
    data = json.loads(path.read_text(encoding="utf-8"))
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a stitchcuda report (schema {data.get('schema')!r})")
    data.pop("schema", None)
    data.pop("schema_version", None)
    return serde.from_jsonable(VerificationReport, data)


# ------------------------------------------------------------------ markdown


def _table(header: list[str], rows: list[list[str]]) -> str:
    def cell(s: object) -> str:
        return str(s).replace("|", "\\|").replace("\n", " ")

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    out += ["| " + " | ".join(cell(c) for c in r) + " |" for r in rows]
    return "\n".join(out)


def _err(x: float | None) -> str:
    if x is None:
        return ""
    if x != x:
        return "nan"
    return f"{x:.3g}"


def render_markdown(report: VerificationReport, *, timeline: str | None = None, notes: tuple[str, ...] = ()) -> str:
    r = report
    v = r.result.verdict
    lines = [f"# Verification report: {r.program}", ""]
    rest = v.summary().partition(": ")[2]
    head = f"**{v.VERDICT}**"
    if isinstance(v, Passed) and v.degenerate:
        head += f" ({DEGENERATE})"
        rest = v.summary().partition("): ")[2]
    prec = r.precision
    if r.precision_source:
        prec += f" ({r.precision_source}" + (f"; the manifest claims {r.claimed_precision}"
                                             if r.claimed_precision and r.claimed_precision != r.precision else "") + ")"
    meta = [["verdict", head + (f": {rest}" if rest else "")], ["precision", prec], ["arch", r.arch]]
    if r.seed is not None:
        meta.append(["seeds", f"inputs {r.seed}, weights {r.weights_seed}"])
    for k, val in (("device", r.device), ("date", r.created), ("commit", r.commit), ("command", f"`{r.command}`"
                                                                                               if r.command else "")):
        if val:
            meta.append([k, val])
    lines += [_table(["", ""], meta), ""]
    lines += _verdict_section(r.result)
    lines += _correctness_section(r.result)
    lines += _timing_section(r)
    lines += _rubric_section(r.rubric)
    lines += _findings_section(r.result)
    lines += _kernel_section(r)
    lines += _details_section(r)
    lines += ["## Kernel timeline", ""]
    if timeline:
        lines += [f"![kernel timeline]({timeline})", ""]
    else:
        lines += ["No timeline: " + ("; ".join(notes) if notes else "not drawn") + ".", ""]
    for n in notes:
        if timeline:
            lines += [f"_{n}_", ""]
    if r.feedback:
        lines += ["## Feedback to the Coder", "", "```", r.feedback, "```", ""]
    if r.phases:
        total = sum(p.seconds for p in r.phases if not p.part_of)
        lines += ["## Verification cost", "",
                  _table(["phase", "seconds"], [[f"· {p.name}" if p.part_of else p.name, f"{p.seconds:.2f}"]
                                                for p in r.phases] + [["total", f"{total:.2f}"]]), ""]
    if r.notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in r.notes] + [""]
    return "\n".join(lines)


def _verdict_section(res: VerificationResult) -> list[str]:
    v = res.verdict
    out = ["## Verdict", ""]
    if isinstance(v, CompileError):
        out += ["```", v.for_prompt(4000, limit=10), "```"]
    elif isinstance(v, Rejected):
        out += [f"- {reason}" for reason in v.reasons]
    elif isinstance(v, (WrongAnswer, Crash, Timeout, Passed, Inconclusive)):
        out += [v.summary()]
        if isinstance(v, Passed) and v.warnings:
            out += [""] + [f"- warning: {w}" for w in v.warnings]
    out.append("")
    return out


def _correctness_section(res: VerificationResult) -> list[str]:
    out = ["## Correctness", ""]
    if not res.trials:
        return out + ["No trials were run.", ""]
    rows = []
    for t in res.trials:
        for o in t.outputs:
            tol = f"{o.tolerance:.0e}" + (f" (atol {o.atol:.1e})" if o.atol is not None and o.atol < o.tolerance else "")
            rows.append([str(t.index) + (f" ({t.label})" if t.label else ""), o.name, _err(o.max_abs_err),
                         _err(o.mean_abs_err), _err(o.max_abs_err_f64) if o.max_abs_err_f64 is not None else "n/a",
                         "[" + ", ".join(map(str, o.where)) + "]" if o.where else "", tol, str(o.nan_count),
                         ("pass" if o.passed else "**FAIL**") + (f" ({o.judged})" if o.judged != "elementwise" else "")])
    out += [_table(["trial", "output", "max abs err", "mean abs err", "max abs err (f64 ref)", "worst at", "tol",
                    "NaN", "result"], rows), ""]
    out += ["Errors against the reference run in PyTorch fp32 eager (TF32 off), the KernelBench convention: "
            "`allclose` with atol = rtol = tol of the policy judged at, atol scaled down to tol x RMS for an output "
            "whose RMS is below 1. The reference is computed in float64 (where it fits) only for an output that "
            "fails against fp32. Labelled trials are the varied-distribution trials, the repeated calls on the "
            "same buffers and the single-element sensitivity trials.", ""]
    return out


def _timing_section(r: VerificationReport) -> list[str]:
    out = ["## Timing", ""]
    t = r.timings
    if t is None:
        return out + ["Not timed.", ""]
    rows = [["this program", f"{t.program.median_ms:.4g}", f"{t.program.iqr_ms:.2g}", str(t.program.n), "1.00x"]]
    for name, b in t.baselines():
        label = name.replace("at policy", f"at {r.precision}")
        if b is None:
            rows.append([label, "not measured", "", "", ""])
        else:
            s = t.speedup(b)
            rows.append([label, f"{b.median_ms:.4g}", f"{b.iqr_ms:.2g}", str(b.n), f"{s:.2f}x" if s else ""])
    out += [_table(["", "median ms", "IQR ms", "n", "speedup of this program"], rows), ""]
    out += ["Speedup = baseline median / program median, measured in one process run. Compare against the "
            "matched-precision rows: against eager fp32 alone a TF32/bf16 program mostly measures the "
            "precision switch.", ""]
    return out


def _rubric_section(rb: Rubric | None) -> list[str]:
    out = ["## Rubric", ""]
    if rb is None:
        return out + ["Not scored.", ""]
    rows = []
    for name, dim in (("anti-hacking", rb.anti_hacking), ("CUDA engineering", rb.cuda_engineering),
                      ("operator coverage", rb.operator_coverage), ("skill compliance", rb.skill_compliance)):
        score = "n/a" if dim.score is None else f"{dim.score:.2f}"
        rows.append([name, score, "; ".join(dim.reasons)])
    out += [_table(["dimension", "score (0-1)", "reasons"], rows), ""]
    techs = [[t.name, "yes" if t.detected else "no", "yes" if t.applicable else "no",
              "; ".join(t.evidence[:2])] for t in rb.cuda_engineering.techniques]
    out += [_table(["technique", "used", "applies", "evidence"], techs), ""]
    if rb.cuda_engineering.kernel_evidence:
        out += ["CUPTI: " + "; ".join(rb.cuda_engineering.kernel_evidence), ""]
    checks = rb.anti_hacking.checks
    if checks:
        out += [_table(["dynamic check", "status", "detail"], [[c.name, c.status, c.detail] for c in checks]), ""]
    if rb.skill_compliance.moved:
        out += [_table(["kernel", "before", "after"],
                       [[d.name, format_ns(d.before_ns), format_ns(d.after_ns)] for d in rb.skill_compliance.moved]),
                ""]
    return out


def _details_section(r: VerificationReport) -> list[str]:
    d = r.details
    if d is None:
        return []
    out: list[str] = []
    if d.isolation:
        out += [f"The candidate ran {d.isolation}.", ""]
    if d.timing is not None:
        t = d.timing
        out += ["## Timing method", "",
                f"CUDA events on {t.stream}; L2 flushed before every trial by a {format_bytes(t.l2_flush_bytes)} "
                f"cudaMemsetAsync; {t.warmup_calls} warm-up calls; at least {t.min_trials} trials and "
                f"{t.min_seconds:g} s, at most {t.max_seconds:g} s per row."
                + (f" Speedup check against {t.matched_baseline}." if t.matched_baseline else ""), ""]
        if t.recheck is not None:
            c = t.recheck
            out += [f"Speedup over 10x re-checked by host wall clock with a device synchronise per call: "
                    f"{c.event_speedup:.1f}x by events, {c.wall_speedup:.1f}x by wall clock (program "
                    f"{c.program_wall_ms:.4g} ms wall vs {c.program_event_ms:.4g} ms events, overhead "
                    f"{c.overhead_ms:.3g} ms); outputs {'correct' if c.outputs_ok else 'WRONG'}: "
                    f"**{'holds' if c.passed else 'FLAGGED'}**" + (f" ({c.detail})" if c.detail else "") + ".", ""]
        if t.wall is not None:
            w = t.wall
            out += [f"Event time against the host clock around device-wide synchronisations ({w.calls} calls): "
                    f"{w.event_ms:.4g} ms by events, {w.wall_ms:.4g} ms by the clock, {w.overhead_ms:.3g} ms of it the "
                    f"synchronisations': **{'agree' if w.passed else 'WORK HIDDEN'}**"
                    + (f" ({w.detail})" if w.detail else "") + ".", ""]
        if t.timed_calls is not None:
            tc = t.timed_calls
            draws = f"; {tc.wrong} wrong with the same inputs in fresh buffers too (a wrong answer on that draw: " \
                    f"{tc.wrong_detail})" if tc.wrong else ""
            out += [f"Timed calls judged: {tc.checked} of {tc.calls}, spread over the phase, the last ({tc.last_checked}) "
                    f"included; {tc.failed} wrong{draws}.", ""]
        out += [f"- {n}" for n in t.notes] + ([""] if t.notes else [])
    p = d.profile
    if p is not None:
        out += ["## Time per task", "", f"From {p.source}, {p.runs} profiled runs."
                + ("" if p.source == "cupti" else " (cupti-python is not installed: kernel records come from "
                                                  "torch.profiler; grid/block/registers may be missing.)"), ""]
        if p.tasks:
            rows = [[t.task, t.strategy, str(len(t.kernels)), format_ns(t.per_run_ns), f"{t.share:.0%}",
                     f"{t.achieved_bytes_s / 1e9:.1f}" if t.bytes else "",
                     f"{t.achieved_flops_s / 1e12:.2f}" if t.flops else "", t.bound] for t in p.tasks]
            out += [_table(["task", "strategy", "kernels", "per run", "share", "GB/s", "TFLOP/s", "bound"], rows), ""]
        if p.unattributed:
            out += ["Kernels no task claimed: " + ", ".join(f"`{n[:60]}`" for n in p.unattributed[:8]), ""]
        if p.gaps is not None:
            g = p.gaps
            out += [f"Per run: {format_ns(g.span_ns)} span, {format_ns(g.busy_ns)} busy, {format_ns(g.idle_ns)} idle "
                    f"between kernels (largest gap {format_ns(g.max_gap_ns)}, {g.gaps_over_5us:g} gaps over 5 us).", ""]
        if p.launches is not None:
            lc = p.launches
            out += [f"Launch accounting: {lc.kernels} kernel records, "
                    + (f"{lc.launches} launch calls" if lc.launches is not None else "launch calls not recorded")
                    + (f", {lc.graph_launches} graph launches ({lc.graph_kernels} kernels)" if lc.graph_launches else "")
                    + (f", {lc.dropped_records} records dropped" if lc.dropped_records else "")
                    + f": **{'ok' if lc.ok else 'MISMATCH'}**" + (f" ({lc.detail})" if lc.detail else "") + ".", ""]
        if p.graph is not None:
            gc = p.graph
            out += [f"CUDA graph: kernel time {format_ns(gc.kernel_ns_per_run)} per run vs event time "
                    f"{format_ns(gc.event_ns_per_run)} ({gc.ratio:.1%}): {'ok' if gc.ok else 'off by more than 5%'}.",
                    ""]
        out += [f"- {n}" for n in p.notes] + ([""] if p.notes else [])
    if d.reference_ops:
        rows = [[o.name[:60], str(o.calls), f"{o.self_device_us:.1f}", f"{o.total_device_us:.1f}", f"{o.share:.0%}"]
                for o in d.reference_ops]
        out += ["## Reference profile (PyTorch, top ops by CUDA time)", "",
                _table(["op", "calls", "self CUDA us", "total CUDA us", "share"], rows), ""]
    if d.memory is not None:
        m = d.memory
        out += [f"Memory: the program allocated {format_bytes(m.program_bytes)} itself; the harness peaked at "
                f"{format_bytes(m.torch_peak_bytes)}" + (f"; cap {format_bytes(m.cap_bytes)}" if m.cap_bytes else "")
                + ".", ""]
    if d.correctness_notes:
        out += ["Correctness notes:", ""] + [f"- {n}" for n in d.correctness_notes] + [""]
    return out


def _findings_section(res: VerificationResult) -> list[str]:
    out = ["## Static findings", ""]
    if not res.findings:
        return out + ["None.", ""]
    rows = [[f.rule, f.severity, f.location, f.message, f"`{f.excerpt}`" if f.excerpt else ""] for f in res.findings]
    return out + [_table(["rule", "severity", "where", "message", "line"], rows), ""]


def _kernel_section(r: VerificationReport) -> list[str]:
    out = ["## Kernels", ""]
    if not r.kernels:
        return out + ["No kernel records (CUPTI was not run).", ""]
    prof = r.profile()
    out += [f"{prof.launches} launches, {format_ns(prof.busy_ns)} busy over a {format_ns(prof.span_ns)} span"
            + (f"; ceilings: {r.ceilings.name}, {r.ceilings.bandwidth / 1e12:.2f} TB/s" if r.ceilings else "")
            + ".", ""]
    rows = []
    for k in prof.kernels:
        rows.append([k.name if len(k.name) <= 60 else k.name[:57] + "...", str(k.calls), format_ns(k.total_ns),
                     format_ns(k.mean_ns), f"{k.share:.0%}", "x".join(map(str, k.grid)), "x".join(map(str, k.block)),
                     str(k.registers), format_bytes(k.shared_mem) if k.shared_mem else "0",
                     f"{k.achieved_bytes_s / 1e9:.1f}" if k.bytes else "",
                     f"{k.achieved_flops_s / 1e12:.2f}" if k.flops else "", k.describe_bound()])
    out += [_table(["kernel", "calls", "total", "mean", "share", "grid", "block", "regs", "smem", "GB/s", "TFLOP/s",
                    "bound"], rows), ""]
    return out


__all__ = ["VerificationReport", "VerificationReportFiles", "write_report", "load_report", "render_markdown", "now_utc",
           "REPORT_JSON", "REPORT_MD", "TIMELINE_PNG"]
