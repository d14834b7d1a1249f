"""The performance set's results beside each problem's roofline floor, as a Markdown table.

Reads a ``stitchcuda bench`` results folder (``results.jsonl``) and, for each problem, its floor:
the larger of (reference FLOPs / dense FLOP/s at the policy) and (fewest bytes / bandwidth), the
fewest bytes being every input and weight read once and every output written once (the problem
captured again here, on the CPU, nothing drawn). Prints one row per problem of the suite, in the
suite's order, those without a result included, then the geometric means over the timed ones.

    python benchmarks/perf_table.py RESULTS_DIR --suite shared/kernelbench/perf.jsonl \
        [--bandwidth 2.85e12] [--peak 394e12]

The defaults are the H100 ceilings ``stitchcuda bench`` measured (MEASURING.md): 2.85 TB/s copy
bandwidth, 394 TFLOP/s TF32 dense.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
from pathlib import Path

BASELINES = (("eager_fp32", "eager fp32"), ("eager_policy", "eager policy"),
             ("compile_fp32", "compile fp32"), ("compile_policy", "compile policy"))


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


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--suite", type=Path, required=True)
    ap.add_argument("--bandwidth", type=float, default=2.85e12)
    ap.add_argument("--peak", type=float, default=394e12)
    a = ap.parse_args(argv)
    rows = {}
    for line in (a.results / "results.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            rows[(r["level"], r["problem_id"])] = r
    head = ["problem", "status", "ms", "floor ms", "x floor"] + [label for _, label in BASELINES]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    ratios: dict[str, list[float]] = {k: [] for k, _ in BASELINES}
    gaps = []
    for line in a.suite.read_text().splitlines():
        if not line.strip():
            continue
        p = json.loads(line)
        key = (p["level"], p["problem_id"])
        label = f"{p['level']}:{p['problem_id']} {p['name'].split('_', 1)[1][:34]}"
        r = rows.get(key)
        if r is None:
            print(f"| {label} | not run | | | |" + " |" * len(BASELINES))
            continue
        ms = (r.get("ms") or {})
        prog = ms.get("program")
        floor_s = None
        try:
            nbytes = fewest_bytes(p["source"], p["name"], r.get("precision", "tf32"))
            floor_s = max((r.get("flops") or 0) / a.peak, nbytes / a.bandwidth)
        except Exception as e:  # noqa: BLE001 - a floor that cannot be counted is left blank, said why
            print(f"{label}: no floor ({type(e).__name__}: {e})", file=sys.stderr)
        cells = [label, r["status"], f"{prog:.3f}" if prog else "", f"{floor_s * 1e3:.3f}" if floor_s else "",
                 f"{prog / (floor_s * 1e3):.1f}" if prog and floor_s else ""]
        if prog and floor_s:
            gaps.append(prog / (floor_s * 1e3))
        for k, _ in BASELINES:
            base = ms.get(k)
            s = base / prog if base and prog else None
            if s is not None:
                ratios[k].append(s)
            cells.append(f"{s:.2f}x" if s is not None else "")
        print("| " + " | ".join(cells) + " |")
    g = geomean(gaps)
    print("| **geometric mean** | | | | " + (f"{g:.1f}" if g else "") + " | "
          + " | ".join(f"**{geomean(v):.2f}x** ({len(v)})" if v else "" for v in ratios.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
