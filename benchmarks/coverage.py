"""Coverage sweep over KernelBench: capture + plan + code + nvcc for every problem of
../shared/kernelbench/all.jsonl, per level, with what stops the rest.

    python benchmarks/coverage.py [--policy fp32] [--workers 2] [--no-compile] [--out benchmarks/coverage.md]

Needs no GPU (nvcc compiles for sm_90). Writes the table and the failures grouped by what stops
them to ``--out`` (and prints them); the per-problem records go beside it as JSON. The CPU test
``tests/test_coverage.py`` runs the same sweep without nvcc (one compile per new task kind).
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="fp32")
    ap.add_argument("--workers", type=int, default=2, help="nvcc processes at a time")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "coverage.md"))
    args = ap.parse_args(argv)

    import warnings

    warnings.filterwarnings("ignore")
    from tests.test_coverage import compile_outcomes, summary, sweep
    from tests.test_coverage_cases import ALL_SET, all_rows

    rows = list(all_rows().values())
    if not rows:
        print(f"KernelBench all.jsonl not found at {ALL_SET}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    outcomes = sweep(rows, args.policy)
    t_front = time.monotonic() - t0
    if not args.no_compile:
        with tempfile.TemporaryDirectory() as cache:
            compile_outcomes(outcomes, cache, args.workers)
    total = time.monotonic() - t0
    text = summary(outcomes)
    print(text)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    what = "capture + plan + code" + ("" if args.no_compile else " + nvcc (sm_90)")
    head = [f"# Coverage over KernelBench ({len(rows)} problems of all.jsonl)", "",
            f"{datetime.date.today().isoformat()}, commit {commit}, policy {args.policy}: {what}; "
            f"`python benchmarks/coverage.py{' --no-compile' if args.no_compile else ''}` on a machine without a "
            f"GPU (capture and planning {t_front:.0f} s, {total:.0f} s in all).", "",
            "A problem counts when every stage succeeds (nvcc included, unless said otherwise). Correctness on the",
            "GPU is another measurement: `benchmarks/verify_all.py`.", "", "```"]
    Path(args.out).write_text("\n".join(head) + "\n" + text + "\n```\n")
    records = [{"level": o.level, "problem_id": o.pid, "name": o.name, "stage": o.stage,
                "blockers": list(o.blockers), "seconds": round(o.seconds, 2), "notes": list(o.notes)}
               for o in outcomes]
    Path(args.out).with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    print(f"written to {args.out} ({total:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
