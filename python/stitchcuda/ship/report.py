"""A suite's report: metrics from the result lines, ``report.md`` and ``report.html``, and plots.

Metrics (KernelBench's, for each baseline the Verifier times — eager fp32, eager at the
program's policy, ``torch.compile`` at the policy, and ``torch.compile`` fp32 when timed):

* correctness rate: problems whose verdict is a pass, over all problems of the suite;
* ``fast_p``: problems that are correct **and** faster than the baseline by more than ``p``
  (speedup > p), over all problems — a wrong or missing program is never fast;
* the geometric mean of the speedup over the correct problems timed against that baseline.

Where the time went: each stage (build, verification, timing, the loop's candidates) summed over the
problems from their results' ``stages``, the longest first.

Plots (matplotlib, the ``bench`` extra; without it the tables are written and a note says so):
the speedup distribution per baseline, the fast_p curve over thresholds, and each program on
the roofline of the device it ran on (arithmetic intensity = reference FLOPs / the fewest bytes a
run moves; achieved = FLOPs / measured time).

Each problem's roofline floor (``floor_ms``) stands beside its time in the problems table, with the
time over it, and their geometric mean in the summary: how far from the hardware, not only from
the baselines.
"""

from __future__ import annotations

import base64
import html
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..fsutil import atomic_write_text

#: (key in a result's "ms", label)
BASELINES = (("eager_fp32", "eager fp32"), ("eager_policy", "eager at policy"),
             ("compile_policy", "torch.compile at policy"), ("compile_fp32", "torch.compile fp32"),
             ("compile_autotune", "torch.compile max-autotune at policy"))
#: Baselines a suite shows only where some result has them (asked for, or timed at all)
OPTIONAL = ("compile_fp32", "compile_autotune")
THRESHOLDS = (0.0, 0.5, 0.8, 1.0, 1.5, 2.0)
PLOTS = ("speedups.png", "fast_p.png", "roofline.png")


def speedup(r: dict, baseline: str) -> float | None:
    ms = r.get("ms") or {}
    prog, base = ms.get("program"), ms.get(baseline)
    if not prog or not base or prog <= 0:
        return None
    return base / prog


def floor_ms(r: dict, bandwidth: float | None = None, peak: float | None = None) -> float | None:
    """A result's roofline floor in ms: the larger of its reference FLOPs at the policy's dense rate
    and its fewest bytes (``io_bytes``: inputs and weights read once, outputs written once) at the
    copy bandwidth, both from the ceilings it was timed under unless given; None without them."""
    c = r.get("ceilings") or {}
    bandwidth, peak = bandwidth or c.get("bandwidth"), peak or c.get("peak")
    if not r.get("io_bytes") or not bandwidth or not peak:
        return None
    return max((r.get("flops") or 0) / peak, r["io_bytes"] / bandwidth) * 1e3


def over_floor(r: dict) -> float | None:
    """A correct result's time over its floor (1.0: at the hardware's limit); None without either."""
    prog, floor = (r.get("ms") or {}).get("program"), floor_ms(r)
    return prog / floor if correct(r) and prog and floor else None


def correct(r: dict) -> bool:
    return r.get("status") == "passed"


def fast_p(results: Sequence[dict], baseline: str, p: float) -> float:
    if not results:
        return 0.0
    return sum(1 for r in results if correct(r) and (speedup(r, baseline) or 0.0) > p) / len(results)


def geomean(xs: Sequence[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


@dataclass(frozen=True)
class BaselineStats:
    key: str
    label: str
    timed: int                  # correct problems with a time for this baseline
    geomean: float | None
    fast: dict[float, float]    # p -> fast_p


@dataclass(frozen=True)
class SuiteMetrics:
    total: int
    correct: int
    by_status: dict[str, int]
    baselines: tuple[BaselineStats, ...]
    notes: tuple[str, ...] = field(default_factory=tuple)
    over_floor: float | None = None  # geometric mean of the correct programs' time over their floor
    floored: int = 0                 # the correct programs with a time and a floor

    @property
    def correctness(self) -> float:
        return self.correct / self.total if self.total else 0.0


def metrics(results: Sequence[dict], precision: str = "") -> SuiteMetrics:
    by_status: dict[str, int] = {}
    for r in results:
        by_status[r.get("status", "?")] = by_status.get(r.get("status", "?"), 0) + 1
    stats = []
    for key, label in BASELINES:
        sp = [speedup(r, key) for r in results if correct(r)]
        sp = [s for s in sp if s is not None]
        if not sp and key in OPTIONAL:
            continue
        stats.append(BaselineStats(key, label.replace("at policy", f"at {precision}") if precision else label,
                                   len(sp), geomean(sp), {p: fast_p(results, key, p) for p in THRESHOLDS}))
    gaps = [g for g in map(over_floor, results) if g]
    return SuiteMetrics(len(results), sum(1 for r in results if correct(r)), by_status, tuple(stats),
                        over_floor=geomean(gaps), floored=len(gaps))


# ---------------------------------------------------------------------- plots


def _matplotlib():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def draw_plots(results: Sequence[dict], m: SuiteMetrics, folder: Path, title: str) -> tuple[list[Path], str]:
    """The three plots as PNG files in ``folder``; ([], note) without matplotlib."""
    plt = _matplotlib()
    if plt is None:
        return [], "plots skipped: matplotlib is not installed (pip install 'stitchcuda[bench]')"
    out = []
    colors = ("#4c72b0", "#dd8452", "#55a868", "#c44e52")

    fig, ax = plt.subplots(figsize=(7, 3.8))
    data, labels = [], []
    for b in m.baselines:
        sp = [speedup(r, b.key) for r in results if correct(r)]
        sp = [s for s in sp if s is not None]
        if sp:
            data.append([math.log2(s) for s in sp])
            labels.append(f"{b.label}\n(geomean {b.geomean:.2f}x, n={len(sp)})")
    if data:
        try:
            parts = ax.violinplot(data, orientation="horizontal", showmedians=True)
        except (TypeError, AttributeError):  # matplotlib before 3.10
            parts = ax.violinplot(data, vert=False, showmedians=True)
        for i, body in enumerate(parts["bodies"]):
            body.set_facecolor(colors[i % len(colors)])
        for i, d in enumerate(data):
            ax.scatter(d, [i + 1] * len(d), s=12, color="black", zorder=3)
        ax.set_yticks(range(1, len(labels) + 1), labels, fontsize=8)
    ax.axvline(0, color="gray", lw=1, ls="--")
    ticks = [-3, -2, -1, 0, 1, 2, 3, 4]
    ax.set_xticks(ticks, [f"{2 ** t:g}x" for t in ticks])
    ax.set_xlabel("speedup over the baseline (log scale; right of the dashed line: faster)")
    ax.set_title(f"{title}: speedup distribution (correct programs)", fontsize=10)
    fig.tight_layout()
    out.append(_save(fig, folder / PLOTS[0], plt))

    fig, ax = plt.subplots(figsize=(7, 3.8))
    top = max([2.0] + [s for r in results for b in m.baselines if (s := speedup(r, b.key)) is not None])
    ps = [i * min(top, 8.0) / 200 for i in range(201)]
    for i, b in enumerate(m.baselines):
        ax.plot(ps, [fast_p(results, b.key, p) for p in ps], label=b.label, color=colors[i % len(colors)])
    ax.axvline(1.0, color="gray", lw=1, ls="--")
    ax.set_xlabel("threshold p (speedup over the baseline)")
    ax.set_ylabel("fast_p (share of all problems)")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{title}: fast_p (correct and faster than p)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.append(_save(fig, folder / PLOTS[1], plt))

    # (results written before io_bytes was recorded: the cost model's bytes)
    points = [(r, r["flops"] / (r.get("io_bytes") or r["bytes"]), r["flops"] / (r["ms"]["program"] / 1e3))
              for r in results if correct(r) and r.get("flops") and (r.get("io_bytes") or r.get("bytes"))
              and (r.get("ms") or {}).get("program")]
    ceil = next((r["ceilings"] for r in results if r.get("ceilings")), None)
    if points:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        xs = [p[1] for p in points]
        lo, hi = min(xs + [0.1]) / 2, max(xs + [100.0]) * 2
        if ceil:
            grid = [lo * (hi / lo) ** (i / 100) for i in range(101)]
            ax.plot(grid, [min(ceil["bandwidth"] * x, ceil["peak"]) for x in grid], color="black", lw=1.2,
                    label=f"{ceil.get('name', 'device')}: {ceil['bandwidth'] / 1e12:.1f} TB/s, "
                          f"{ceil['peak'] / 1e12:.0f} TFLOP/s")
        ax.scatter(xs, [p[2] for p in points], color=colors[0], zorder=3)
        for i, (r, x, y) in enumerate(sorted(points, key=lambda p: (p[1], p[2]))):
            # The problem's short id (L2_76), placed above and below in turn: neighbours overlap less.
            short = "_".join(r["id"].split("_")[:2])
            ax.annotate(short, (x, y), fontsize=7, xytext=(4, 5 if i % 2 else -10), textcoords="offset points")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("arithmetic intensity (FLOP / byte, cost model)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_title(f"{title}: programs on the roofline", fontsize=10)
        ax.legend(fontsize=7, loc="lower right")
        fig.tight_layout()
        out.append(_save(fig, folder / PLOTS[2], plt))
    return out, "" if points else "roofline skipped: no correct program with a time, FLOPs and bytes"


def _save(fig, path: Path, plt) -> Path:
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=130)
    plt.close(fig)
    tmp.replace(path)
    return path


# ---------------------------------------------------------------------- markdown and html


def _fmt(x: float | None, unit: str = "x") -> str:
    return "" if x is None else f"{x:.2f}{unit}"


def _tables(results: Sequence[dict], m: SuiteMetrics) -> tuple[list, list, list, list]:
    """(summary header+rows, baseline header+rows, per-problem header+rows)."""
    summary = [["problems", str(m.total)], ["correct", f"{m.correct} ({m.correctness:.0%})"]]
    summary += [[f"status {k}", str(v)] for k, v in sorted(m.by_status.items())]
    degenerate = sum(1 for r in results if r.get("degenerate"))
    summary += [["degenerate: outputs independent of inputs", str(degenerate)]] if degenerate else []
    summary += [["time over the roofline floor (geomean)", f"{m.over_floor:.2f}x ({m.floored})"]] if m.floored else []
    bh = ["baseline", "geomean speedup", "timed"] + [f"fast_{p:g}" for p in THRESHOLDS]
    brows = [[b.label, _fmt(b.geomean), str(b.timed)] + [f"{b.fast[p]:.0%}" for p in THRESHOLDS] for b in m.baselines]
    ph = ["problem", "status", "program ms", "floor ms", "x floor"] + [b.label for b in m.baselines] + ["seconds", "detail"]
    prows = []
    for r in sorted(results, key=lambda r: r.get("id", "")):
        ms, floor = (r.get("ms") or {}).get("program"), floor_ms(r)
        prows.append([r.get("id", "?"), r.get("status", "?"), f"{ms:.4g}" if ms else "",
                      f"{floor:.4g}" if floor else "", _fmt(over_floor(r), "")]
                     + [_fmt(speedup(r, b.key)) for b in m.baselines]
                     + [f"{r.get('seconds', 0):.0f}", (r.get("summary") or "")[:120]])
    return summary, [bh, brows], [ph, prows], []


def _levels(results: Sequence[dict], m: SuiteMetrics) -> tuple[list[str], list[list[str]]]:
    """Per KernelBench level (a result's ``level``), where a suite spans more than one: problems,
    correct, and each baseline's geometric-mean speedup over that level's timed problems (targets
    are often set per level). Empty otherwise."""
    levels = sorted({r["level"] for r in results if isinstance(r.get("level"), int)})
    if len(levels) < 2:
        return [], []
    head = ["level", "problems", "correct"] + [b.label for b in m.baselines]
    rows = []
    for lv in levels:
        rs = [r for r in results if r.get("level") == lv]
        cells = [str(lv), str(len(rs)), str(sum(1 for r in rs if correct(r)))]
        for b in m.baselines:
            sp = [s for r in rs if correct(r) and (s := speedup(r, b.key)) is not None]
            cells.append(f"{_fmt(geomean(sp))} ({len(sp)})" if sp else "")
        rows.append(cells)
    return head, rows


#: A listed section of a report: its heading and items, each (problem id, what is said of it, sub-items).
Section = tuple[str, list[tuple[str, str, list[str]]]]


def _failures(results: Sequence[dict]) -> Section:
    """Each problem that did not pass, its whole verdict and the Verifier's notes on it (what the
    table's detail column cuts short)."""
    failed = [r for r in sorted(results, key=lambda r: r.get("id", "")) if r.get("status") != "passed"]
    return "Why problems did not pass", [(r.get("id", "?"), f" ({r.get('status', '?')}): {r.get('summary') or 'no summary'}",
                                          list(r.get("notes") or ())) for r in failed]


def _repairs(results: Sequence[dict]) -> Section:
    """Each problem the loop repaired: what ``build``'s program got wrong, what was changed (the
    tasks raised), and what PyTorch itself gets at the policy on the same inputs: where it too is
    over the tolerance, a baseline allowed the policy is timed on an answer that would not verify."""
    items = []
    for r in sorted(results, key=lambda r: r.get("id", "")):
        rp = r.get("repaired")
        if r.get("status") != "passed" or not rp:
            continue
        how = (f"{len(rp['raised'])} of {rp.get('suspects', '?')} rounding tasks raised to fp32"
               if rp.get("raised") else f"candidate {rp.get('candidate', '?')} ({rp.get('by', '?')})")
        items.append((r.get("id", "?"), f": {how}; `build` gave: {rp.get('from', '?')}",
                      [rp["policy_note"]] if rp.get("policy_note") else []))
    return "Repaired by the loop", items


#: Stages a report lists, the longest first (the rest are summed in one row).
STAGES_SHOWN = 12


def _time_spent(results: Sequence[dict]) -> tuple[list[str], list[list[str]]]:
    """Where a suite's time went: each stage's seconds summed over the problems (their result's
    ``stages``), its share of all of them, and how many problems spent time in it; empty when no
    result says."""
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for r in results:
        for k, v in (r.get("stages") or {}).items():
            total[k] = total.get(k, 0.0) + float(v)
            count[k] = count.get(k, 0) + 1
    whole = sum(total.values())
    if whole <= 0:
        return [], []
    order = sorted(total, key=lambda k: -total[k])
    rows = [[k, f"{total[k]:.0f}", f"{total[k] / whole:.0%}", str(count[k])] for k in order[:STAGES_SHOWN]]
    rest = order[STAGES_SHOWN:]
    if rest:
        left = sum(total[k] for k in rest)
        rows.append([f"{len(rest)} other stages", f"{left:.0f}", f"{left / whole:.0%}", ""])
    return ["stage", "seconds (all problems)", "share", "problems"], rows


def _md_section(sec: Section) -> list[str]:
    heading, items = sec
    if not items:
        return []
    lines = [f"## {heading}", ""]
    for pid, said, subs in items:
        lines.append(f"- **{pid}**{said}")
        lines += [f"  - {n}" for n in subs]
    return lines + [""]


def _html_section(sec: Section) -> list[str]:
    heading, items = sec
    if not items:
        return []
    out = [f"<h2>{html.escape(heading)}</h2><ul>"]
    for pid, said, subs in items:
        out.append(f"<li><b>{html.escape(pid)}</b>{html.escape(said)}"
                   + (f"<ul>{''.join(f'<li>{html.escape(n)}</li>' for n in subs)}</ul>" if subs else "") + "</li>")
    return out + ["</ul>"]


def _md_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")  # noqa: E731
    return "\n".join(["| " + " | ".join(map(esc, header)) + " |", "|" + "|".join("---" for _ in header) + "|"]
                     + ["| " + " | ".join(map(esc, r)) + " |" for r in rows])


def render_markdown(results: Sequence[dict], m: SuiteMetrics, meta: dict[str, Any], plots: Sequence[Path],
                    notes: Sequence[str]) -> str:
    summary, (bh, brows), (ph, prows), _ = _tables(results, m)
    lines = [f"# Suite report: {meta.get('suite', '?')}", ""]
    lines += [_md_table(["", ""], [[k, str(v)] for k, v in meta.items() if v not in (None, "")] + summary), ""]
    lines += ["## Speedups", "", _md_table(bh, brows), "",
              "fast_p: share of all problems that are correct and more than p times faster than the baseline.", ""]
    lh, lrows = _levels(results, m)
    if lrows:
        lines += ["### Per level (geometric mean, problems timed)", "", _md_table(lh, lrows), ""]
    for p in plots:
        lines += [f"![{p.stem}]({p.name})", ""]
    lines += ["## Problems", "", _md_table(ph, prows), ""]
    lines += _md_section(_failures(results)) + _md_section(_repairs(results))
    th, trows = _time_spent(results)
    if trows:
        lines += ["## Where the time went", "", _md_table(th, trows), ""]
    if notes:
        lines += ["## Notes", ""] + [f"- {n}" for n in notes] + [""]
    return "\n".join(lines)


_CSS = """body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.6em 0 1.4em}td,th{padding:.25em .7em;border-bottom:1px solid #ddd;
text-align:left}th{background:#f4f4f4}td.n{text-align:right;font-variant-numeric:tabular-nums}
.passed{color:#1a7f37;font-weight:600}.fail{color:#b42318;font-weight:600}.other{color:#8a6d00}
img{max-width:100%;border:1px solid #eee;margin:.4em 0}.cards{display:flex;gap:1em;flex-wrap:wrap}
.card{border:1px solid #ddd;border-radius:8px;padding:.6em 1em;min-width:9em}.card b{font-size:1.5em;display:block}"""


def _html_table(header: list[str], rows: list[list[str]], status_col: int | None = None) -> str:
    def cell(i: int, v: str) -> str:
        v = str(v)
        cls = ""
        if status_col is not None and i == status_col:
            cls = "passed" if v == "passed" else ("fail" if v in ("wrong_answer", "failed", "error", "crash",
                                                                   "compile_error", "timeout") else "other")
        elif v.endswith("x") or v.endswith("%") or v.replace(".", "", 1).isdigit():
            cls = "n"
        return f'<td class="{cls}">{html.escape(v)}</td>' if cls else f"<td>{html.escape(v)}</td>"

    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(cell(i, v) for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render_html(results: Sequence[dict], m: SuiteMetrics, meta: dict[str, Any], plots: Sequence[Path],
                notes: Sequence[str]) -> str:
    summary, (bh, brows), (ph, prows), _ = _tables(results, m)
    title = html.escape(f"Suite report: {meta.get('suite', '?')}")
    cards = [("problems", str(m.total)), ("correct", f"{m.correctness:.0%}")]
    cards += [(f"geomean vs {b.label}", _fmt(b.geomean) or "-") for b in m.baselines[:3]]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{title}</title><style>{_CSS}</style>"
             f"</head><body><h1>{title}</h1>",
             "<div class='cards'>" + "".join(f"<div class='card'><b>{html.escape(v)}</b>{html.escape(k)}</div>"
                                             for k, v in cards) + "</div>",
             _html_table(["", ""], [[k, str(v)] for k, v in meta.items() if v not in (None, "")] + summary),
             "<h2>Speedups</h2>", _html_table(bh, brows),
             "<p>fast_p: share of all problems that are correct and more than p times faster than the baseline.</p>"]
    lh, lrows = _levels(results, m)
    if lrows:
        parts += ["<h3>Per level (geometric mean, problems timed)</h3>", _html_table(lh, lrows)]
    for p in plots:
        data = base64.b64encode(p.read_bytes()).decode()
        parts.append(f"<img alt='{html.escape(p.stem)}' src='data:image/png;base64,{data}'>")
    parts += ["<h2>Problems</h2>", _html_table(ph, prows, status_col=1)]
    for section in (_failures(results), _repairs(results)):
        parts += _html_section(section)
    th, trows = _time_spent(results)
    if trows:
        parts += ["<h2>Where the time went</h2>", _html_table(th, trows)]
    if notes:
        parts += ["<h2>Notes</h2><ul>"] + [f"<li>{html.escape(n)}</li>" for n in notes] + ["</ul>"]
    parts.append("</body></html>")
    return "\n".join(parts)


@dataclass(frozen=True)
class SuiteReportFiles:
    """What :func:`write_reports` wrote for a suite: report.md, report.html, the plots, and notes
    (a plot that could not be drawn, and why)."""

    markdown: Path
    html: Path
    plots: tuple[Path, ...]
    notes: tuple[str, ...]


def write_reports(results: Sequence[dict], folder: Path, meta: dict[str, Any],
                  precision: str = "") -> SuiteReportFiles:
    """report.md, report.html and the plots in ``folder`` (each written atomically)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    m = metrics(results, precision)
    plots, note = draw_plots(results, m, folder, str(meta.get("suite", "suite")))
    notes = [note] if note else []
    md = atomic_write_text(folder / "report.md", render_markdown(results, m, meta, plots, notes))
    page = atomic_write_text(folder / "report.html", render_html(results, m, meta, plots, notes))
    return SuiteReportFiles(md, page, tuple(plots), tuple(notes))


__all__ = ["BASELINES", "THRESHOLDS", "speedup", "correct", "fast_p", "geomean", "metrics", "SuiteMetrics",
           "BaselineStats", "draw_plots", "render_markdown", "render_html", "write_reports", "SuiteReportFiles"]
