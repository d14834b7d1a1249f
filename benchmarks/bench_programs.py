"""Generated programs against PyTorch, per problem: build (no LLM), verify, time.

For each problem and policy the program is built into --out, verified by the Verifier (5
fresh-seed trials, poisoned outputs, inputs checked unchanged, dynamic checks) and timed by the
Verifier's harness in one child process per candidate: the program (bound run) and PyTorch eager
fp32, eager with the policy's precision allowed, torch.compile fp32 and torch.compile at the
policy — CUDA events, L2 flushed between trials, medians. Writes JSON lines to --json and prints
a table with the geometric means the targets are stated in.

    python benchmarks/bench_programs.py --problems 3:1,3:3,3:43,3:44 --policies tf32,fp32 --json out.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
import traceback
from pathlib import Path

DEFAULT = "1:1,1:23,1:26,1:40,1:97,2:12,2:41,2:76,2:86,2:99,3:1,3:3,3:43,3:44"


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def speedup_summary(rows) -> str:
    """The geometric mean of baseline ms / ours ms for each baseline, over ``rows``, in one line."""
    parts = []
    for key in ("eager_fp32_ms", "eager_policy_ms", "compile_fp32_ms", "compile_policy_ms"):
        g = geomean([x[key] / x["ours_ms"] for x in rows if x.get(key) and x.get("ours_ms")])
        parts.append(f"{key[:-3]} {g:.2f}x")
    return "  ".join(parts)


def one(level: int, pid: int, policy: str, out_root: Path, trials: int, compile_baselines: bool) -> dict:
    from stitchcuda.pipeline import build_program
    from stitchcuda.verifier.verification import VerifyOptions, verify_program

    ref = f"kernelbench:{level}:{pid}"
    row = {"problem": ref, "policy": policy}
    t0 = time.monotonic()
    try:
        outcome = build_program(ref, precision=policy, out=out_root / f"l{level}_{pid}_{policy}", quiet=True)
        row["build_s"] = round(time.monotonic() - t0, 2)
        if not outcome.ok:
            row["error"] = build_error(outcome)
            return row
        d = Path(outcome.directory)
        opts = VerifyOptions(trials=trials, time=True, profile=False, reference_profile=False,
                             compile=compile_baselines, command="benchmarks/bench_programs.py")
        v = verify_program(d, ref, opts)
    except Exception as e:  # noqa: BLE001 - one problem's failure is a row, not the end of the run
        row["error"] = f"{type(e).__name__}: {e}"
        row["trace"] = traceback.format_exc()[-2000:]
        return row
    return verification_row(row, v)


def build_error(outcome) -> str:
    """A failed build_program outcome in one line, with the tail of nvcc's output."""
    b = outcome.build
    return "build failed: " + (b.message + " " + (b.compile.output[-1500:] if b and b.compile else "") if b else "")


def verification_row(row: dict, v) -> dict:
    """``row`` with the verdict, phase times and median ms (ours and every baseline) of ``v``."""
    row["verdict"] = v.result.kind
    row["summary"] = v.result.verdict.summary()
    row["phases"] = {p.name: round(p.seconds, 2) for p in v.phases}
    t = v.report.timings
    if t is not None:
        row["ours_ms"] = t.program.median_ms
        for key in ("eager_fp32", "eager_policy", "compile_fp32", "compile_policy"):
            b = getattr(t, key)
            row[key + "_ms"] = b.median_ms if b is not None else None
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=DEFAULT, help="LEVEL:ID,... from the KernelBench dev set")
    ap.add_argument("--policies", default="tf32,fp32")
    ap.add_argument("--out", type=Path, default=Path("runs/bench"))
    ap.add_argument("--json", type=Path, default=Path("bench_programs.jsonl"))
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for item in args.problems.split(","):
        level, pid = (int(x) for x in item.split(":"))
        for policy in args.policies.split(","):
            row = one(level, pid, policy, args.out, args.trials, not args.no_compile)
            rows.append(row)
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if "error" in row:
                print(f"{row['problem']} {policy}: ERROR {row['error']}", flush=True)
                continue
            def r(key):
                v = row.get(key)
                return f"{row['ours_ms'] and v / row['ours_ms']:.2f}x" if v else "-"
            print(f"{row['problem']:16s} {policy:5s} {row['verdict']:12s} ours {row.get('ours_ms', float('nan')):.4f} ms | "
                  f"eager fp32 {r('eager_fp32_ms')}  eager {policy} {r('eager_policy_ms')}  "
                  f"compile fp32 {r('compile_fp32_ms')}  compile {policy} {r('compile_policy_ms')} | "
                  f"build {row.get('build_s')} s", flush=True)
    print("\ngeometric means of speedup (baseline ms / ours ms), passed problems only:")
    for level in (1, 2, 3):
        for policy in args.policies.split(","):
            sel = [x for x in rows if x.get("verdict") == "passed" and x["policy"] == policy
                   and x["problem"].split(":")[1] == str(level)]
            if not sel:
                continue
            print(f"  level {level} {policy} (n={len(sel)}): " + speedup_summary(sel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
