"""An fp32 program's attention in split TF32 beside the same program as `build` plans it.

For each reference: captured once at fp32, then two programs — the plan `build` makes (the exact
SIMT attention kernel, or SGEMM + softmax + SGEMM where the cost model unfuses it) and the plan with
every attention node asked for the ``split_tf32`` strategy (three TF32 products each on tensor
cores, about fp32's accuracy: what PyTorch's memory-efficient fp32 attention computes). Each is
judged by the Verifier as `stitchcuda verify` judges (trials, dynamic checks, the precision claim,
timing against eager and torch.compile fp32 in one process), and one row per program is printed:
ms, torch.compile fp32's ms, the speedup over it and the verdict.

    python benchmarks/attention_split.py models/zoo/llama.py models/zoo/whisper_encoder.py \
        --out /tmp/b_split > /tmp/b_split/table.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from stitchcuda import plan as P
from stitchcuda.pipeline import capture_problem


def attention_nodes(problem) -> list[str]:
    """The nodes that take an attention strategy (softmax of the written-out pattern, or SDPA)."""
    return [n for n, opts in problem.choices().strategies if opts == P.STRATEGIES["attention"]]


def judge(directory: Path, trials: int):
    from stitchcuda.verifier.verification import VerifyOptions, verify_program

    v = verify_program(directory, None, VerifyOptions(trials=trials, profile=False, sanitizer=False,
                                                      command="benchmarks/attention_split.py"))
    r = v.report
    t = r.timings
    ms = t.program.median_ms if t is not None else None
    row = (t.compile_fp32 or t.compile_policy) if t is not None else None  # at fp32: the policy's rows
    base = row.median_ms if row is not None else None
    return r.result.ok, r.result.verdict.summary(), ms, base


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("references", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True, help="the programs' folders")
    ap.add_argument("--trials", type=int, default=3)
    ns = ap.parse_args(argv)
    print("| model | attention | ms | torch.compile fp32 ms | speedup | verdict |")
    print("|---|---|---|---|---|---|")
    for ref in ns.references:
        problem = capture_problem(ref, precision="fp32")
        nodes = attention_nodes(problem)
        if not nodes:
            print(f"| {problem.name} | none found | | | | |", flush=True)
            continue
        ways = [("as build plans it", None),
                ("split TF32", P.Constraints.of(strategy={n: "split_tf32" for n in nodes}))]
        for label, constraints in ways:
            out = ns.out / f"{problem.name}_{'split' if constraints else 'build'}"
            built = problem.write(problem.plan(constraints), out)
            if not built.ok:
                print(f"| {problem.name} | {label} | compile error | | | {built.build.message[:80]} |", flush=True)
                continue
            ok, summary, ms, base = judge(out, ns.trials)
            speed = f"{base / ms:.2f}x" if ms and base else ""
            cell = lambda v: f"{v:.3f}" if v else ""  # noqa: E731 - (not timed: a failed program)
            print(f"| {problem.name} | {label} ({len(nodes)} nodes) | {cell(ms)} | {cell(base)} | {speed} | "
                  f"{'passed' if ok else 'FAILED'}: {summary[:120]} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
