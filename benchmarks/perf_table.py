"""The performance set's results beside each problem's roofline floor, as a Markdown table.

Reads a ``stitchcuda bench`` results folder (``results.jsonl``) and, for each problem, its floor
(``stitchcuda.ship.report.floor_ms``): the larger of (reference FLOPs / dense FLOP/s at the policy)
and (fewest bytes / bandwidth), the fewest bytes being every input and weight read once and every
output written once (the result's ``io_bytes``; for results from before the suite recorded it, the
problem captured again here, on the CPU, nothing drawn). Prints one row per problem of the suite, in the
suite's order, those without a result included, then the geometric means over the verified ones (a
program that did not verify is given no time: its speed is no figure).

    python benchmarks/perf_table.py RESULTS_DIR --suite shared/kernelbench/perf.txt \
        [--bandwidth 2.85e12] [--peak 394e12]

A suite is a .jsonl of problems, or a .txt of LEVEL:ID (the performance set, perf.txt) whose
problems are read from ``all.jsonl`` beside it; ``--make-suite OUT.jsonl`` writes that .jsonl (the
suite ``stitchcuda bench`` takes) and exits.

The ceilings are those each result was timed under (``stitchcuda bench`` measures the device's copy
bandwidth and records its dense rate at the policy), unless given; without either, the H100's
(MEASURING.md): 2.85 TB/s copy bandwidth, 394 TFLOP/s TF32 dense.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

BASELINES = (("eager_fp32", "eager fp32"), ("eager_policy", "eager policy"),
             ("compile_fp32", "compile fp32"), ("compile_policy", "compile policy"),
             ("compile_autotune", "max-autotune policy"))


def suite_problems(suite: Path) -> list[dict]:
    """The problems of a .jsonl suite, or of a .txt list of LEVEL:ID (from all.jsonl beside it)."""
    if suite.suffix != ".txt":
        return [json.loads(line) for line in suite.read_text().splitlines() if line.strip()]
    every = {}
    for line in (suite.parent / "all.jsonl").read_text().splitlines():
        if line.strip():
            p = json.loads(line)
            every[(p["level"], p["problem_id"])] = p
    ids = [tok for line in suite.read_text().splitlines() if not line.lstrip().startswith("#")
           for tok in line.split()]
    return [every[(int(i.split(":")[0]), int(i.split(":")[1]))] for i in ids]


def fewest_bytes(source: str, name: str, precision: str) -> int:
    from stitchcuda.dtypes import SIZES
    from stitchcuda.pipeline import capture_problem

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reference.py"
        path.write_text(source)
        cap = capture_problem(str(path), precision=precision, name=name, weights=False, compiling=False)
    g = cap.graph
    specs = list(g.inputs) + list(g.weights) + [g.spec(name) for name in dict.fromkeys(g.outputs)]
    return sum(math.prod(t.shape) * SIZES[t.dtype] for t in specs)


def geomean(xs: list[float]) -> float | None:  # (not the package's: --make-suite runs before it is installed)
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path, nargs="?")
    ap.add_argument("--suite", type=Path, required=True)
    ap.add_argument("--make-suite", type=Path, help="write the suite as a .jsonl here and exit")
    ap.add_argument("--bandwidth", type=float, default=None,
                    help="bytes/s (default: the ceilings each result was timed under, else 2.85e12)")
    ap.add_argument("--peak", type=float, default=None,
                    help="FLOP/s at the policy (default: as --bandwidth, else 394e12)")
    a = ap.parse_args(argv)
    problems = suite_problems(a.suite)
    if a.make_suite:
        a.make_suite.write_text("".join(json.dumps(p) + "\n" for p in problems))
        print(f"{len(problems)} problems written to {a.make_suite}")
        return 0
    if a.results is None:
        ap.error("a results folder is needed (or --make-suite)")
    rows = {}
    for line in (a.results / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[(r["level"], r["problem_id"])] = r
    head = ["problem", "status", "ms", "floor ms", "x floor"] + [label for _, label in BASELINES]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratios: dict[str, list[float]] = {k: [] for k, _ in BASELINES}
    by_level: dict[int, dict[str, list[float]]] = {}  # the issues' targets are per level
    gaps = []
    for p in problems:
        key = (p["level"], p["problem_id"])
        label = f"{p['level']}:{p['problem_id']} {p['name'].split('_', 1)[1][:34]}"
        r = rows.get(key)
        if r is None:
            print(f"| {label} | not run | | | |" + " |" * len(BASELINES))
            continue
        from stitchcuda.ship.report import correct, speedup  # (the suite report's: one definition)

        # a program that did not verify has no speed: its times are left out of the row and the means
        prog = (r.get("ms") or {}).get("program") if correct(r) else None
        floor_s = None
        ceil = r.get("ceilings") or {}
        bandwidth = a.bandwidth or ceil.get("bandwidth") or 2.85e12
        peak = a.peak or ceil.get("peak") or 394e12
        try:
            from stitchcuda.ship.report import floor_ms  # (the suite report's floor: one definition)

            if not r.get("io_bytes"):  # a result from before the suite recorded it
                r = {**r, "io_bytes": fewest_bytes(p["source"], p["name"], r.get("precision", "tf32"))}
            floor_s = floor_ms(r, bandwidth, peak) / 1e3
        except Exception as e:  # noqa: BLE001 - a floor that cannot be counted is left blank, said why
            print(f"{label}: no floor ({type(e).__name__}: {e})", file=sys.stderr)
        cells = [label, r["status"], f"{prog:.3f}" if prog else "", f"{floor_s * 1e3:.3f}" if floor_s else "",
                 f"{prog / (floor_s * 1e3):.1f}" if prog and floor_s else ""]
        if prog and floor_s:
            gaps.append(prog / (floor_s * 1e3))
        for k, _ in BASELINES:
            s = speedup(r, k) if prog else None
            if s is not None:
                ratios[k].append(s)
                by_level.setdefault(p["level"], {b: [] for b, _ in BASELINES})[k].append(s)
            cells.append(f"{s:.2f}x" if s is not None else "")
        print("| " + " | ".join(cells) + " |")
    g = geomean(gaps)
    print("| **geometric mean** | | | | " + (f"{g:.1f}" if g else "") + " | "
          + " | ".join(f"**{geomean(v):.2f}x** ({len(v)})" if v else "" for v in ratios.values()) + " |")
    for level, lr in sorted(by_level.items()):
        print(f"| level {level} | | | | | " + " | ".join(f"{geomean(v):.2f}x ({len(v)})" if v else "" for v in lr.values())
              + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
