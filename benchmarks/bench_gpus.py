"""Does ``stitchcuda bench`` scale with GPUs? The same suite, once per worker count, each run cold.

    python benchmarks/bench_gpus.py ../shared/kernelbench/dev.jsonl --gpus 1 2 --out bench/scaling \
        --only L1_ --only L2_ --trials 2 --no-compile
    python benchmarks/bench_gpus.py models/zoo --gpus 1 --per-gpu 1 2 --want 1.2 --precision tf32 \
        --no-profile --no-sanitizer --trials 3        # workers sharing one GPU (bench --per-gpu)

With ``--per-gpu`` the runs are every (GPUs, workers per GPU) pair, compared first against last. Its
figures must not move either: each problem's speed against torch.compile at the policy, run beside
run, is printed (median and largest change), since workers that share a GPU must not disturb each
other's timing (``hostlock.gpu_alone``).

Each run gets its own empty results folder and its own empty build cache (a warm cache would
make the second run faster for the wrong reason), then the wall times are compared: the check
passes when the run with the most GPUs is at least ``--want`` (default 1.8) times faster per added
GPU pair than the run with one. Prints one line per run and the ratio; exit code 1 when it fails.
The verdicts of the runs must agree (a faster run that fails more problems does not count).

A finished run keeps its wall time in ``<out>/gpus-N/wall.json`` and is not run again unless
``--fresh``, so the runs can be split over several commands (``--gpus 1``, then ``--gpus 1 2``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("suite")
    ap.add_argument("--gpus", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--per-gpu", type=int, nargs="+", default=[1], help="workers on each GPU (bench --per-gpu)")
    ap.add_argument("--out", default="bench/scaling")
    ap.add_argument("--want", type=float, default=1.8, help="required speedup of the last run over the first (default 1.8)")
    ap.add_argument("--precision", default="fp32")
    ap.add_argument("--fresh", action="store_true", help="run again even where a finished run is recorded")
    args, rest = ap.parse_known_args()  # the rest goes to stitchcuda bench (--only, --limit, --trials ...)
    out = Path(args.out)
    walls, statuses, speeds = {}, {}, {}
    runs = [(g, w) for g in args.gpus for w in args.per_gpu]
    for n in runs:  # (GPUs, workers on each)
        tag = f"{n[0]}" if n[1] == 1 else f"{n[0]}-per-{n[1]}"
        folder, cache = out / f"gpus-{tag}", out / f"cache-{tag}"
        if (folder / "wall.json").is_file() and not args.fresh:
            walls[n] = json.loads((folder / "wall.json").read_text())["seconds"]
            res = [json.loads(ln) for ln in (folder / "results.jsonl").read_text().splitlines()]
            statuses[n], speeds[n] = {x["id"]: x["status"] for x in res}, _speeds(res)
            print(f"{_name(n)}: {walls[n]:.0f} s wall (recorded earlier), {len(res)} problems")
            continue
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(cache, ignore_errors=True)
        cmd = [sys.executable, "-m", "stitchcuda.cli", "bench", args.suite, "--gpus", str(n[0]), "--per-gpu", str(n[1]),
               "--out", str(folder), "--precision", args.precision, "--json", *rest]
        t0 = time.monotonic()
        r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "STITCHCUDA_CACHE": str(cache)})
        walls[n] = time.monotonic() - t0
        if r.returncode != 0:
            print(r.stderr[-2000:], file=sys.stderr)
            return 2
        summary = json.loads(r.stdout)
        res = [json.loads(ln) for ln in (folder / "results.jsonl").read_text().splitlines()]
        statuses[n], speeds[n] = {x["id"]: x["status"] for x in res}, _speeds(res)
        (folder / "wall.json").write_text(json.dumps({"seconds": walls[n], "gpus": n[0], "per_gpu": n[1]}) + "\n")
        print(f"{_name(n)}: {walls[n]:.0f} s wall, {summary['total']} problems, {summary['correct']} correct; "
              f"GPUs used: {sorted({x.get('gpu') for x in res})}")
    if len(walls) < 2:
        return 0
    one, most = runs[0], runs[-1]
    ratio = walls[one] / walls[most]
    agree = statuses[one] == statuses[most]
    print(f"speedup of {_name(most)} over {_name(one)}: {ratio:.2f}x (want >= {args.want:.2f}x); "
          f"verdicts {'agree' if agree else 'DIFFER: ' + str({k: (statuses[one].get(k), v) for k, v in statuses[most].items() if statuses[one].get(k) != v})}")
    both = sorted(set(speeds[one]) & set(speeds[most]))
    if both:
        moved = sorted(abs(speeds[most][k] / speeds[one][k] - 1) for k in both)
        worst = max(both, key=lambda k: abs(speeds[most][k] / speeds[one][k] - 1))
        print(f"speed against torch.compile at the policy, {len(both)} problems in both: median change "
              f"{100 * moved[len(moved) // 2]:.1f} %, largest {100 * moved[-1]:.1f} % ({worst}: "
              f"{speeds[one][worst]:.2f}x, then {speeds[most][worst]:.2f}x)")
    return 0 if ratio >= args.want and agree else 1


def _name(run: tuple[int, int]) -> str:
    return f"--gpus {run[0]}" + (f" --per-gpu {run[1]}" if run[1] != 1 else "")


def _speeds(res: list[dict]) -> dict[str, float]:
    """Each passed problem's speed against torch.compile at the policy (its ms over ours)."""
    return {x["id"]: x["ms"]["compile_policy"] / x["ms"]["program"] for x in res
            if x.get("status") == "passed" and (x.get("ms") or {}).get("compile_policy") and x["ms"].get("program")}


if __name__ == "__main__":
    sys.exit(main())
