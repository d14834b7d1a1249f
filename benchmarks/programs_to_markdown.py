"""Render bench_programs.py JSON lines as the Markdown table and geometric means of BENCHMARKS.md.
Later lines for the same (problem, policy) replace earlier ones."""

from __future__ import annotations

import json
import math
import sys


def geomean(xs):
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def main(paths: list[str]) -> None:
    rows = {}
    for p in paths:
        for line in open(p):
            r = json.loads(line)
            rows[(r["problem"], r["policy"])] = r
    keys = ["eager_fp32_ms", "eager_policy_ms", "compile_fp32_ms", "compile_policy_ms"]
    print("| problem | policy | verdict | ours ms | eager fp32 | eager at policy | compile fp32 | compile at policy |")
    print("|---|---|---|---|---|---|---|---|")
    order = sorted(rows, key=lambda k: (int(k[0].split(":")[1]), int(k[0].split(":")[2]), k[1]))
    for k in order:
        r = rows[k]
        if "ours_ms" not in r:
            why = r.get("summary") or r.get("error", "")
            print(f"| {k[0][12:]} | {k[1]} | {r.get('verdict', 'error')} | – | {why[:90]} | | | |")
            continue
        cells = [f"{r[x]:.3f} ms ({r[x] / r['ours_ms']:.2f}×)" if r.get(x) else "–" for x in keys]
        print(f"| {k[0][12:]} | {k[1]} | {r['verdict']} | {r['ours_ms']:.3f} | " + " | ".join(cells) + " |")
    print("\nGeometric mean of speedups (baseline / ours), passed problems:\n")
    print("| level | policy | n | vs eager fp32 | vs eager at policy | vs compile fp32 | vs compile at policy |")
    print("|---|---|---|---|---|---|---|")
    for level in ("1", "2", "3"):
        for policy in ("fp32", "tf32"):
            sel = [r for (p, pol), r in rows.items() if pol == policy and p.split(":")[1] == level
                   and r.get("verdict") == "passed" and r.get("ours_ms")]
            if sel:
                g = [geomean([r[x] / r["ours_ms"] for r in sel if r.get(x)]) for x in keys]
                print(f"| {level} | {policy} | {len(sel)} | " + " | ".join(f"{v:.2f}×" for v in g) + " |")


if __name__ == "__main__":
    main(sys.argv[1:])
