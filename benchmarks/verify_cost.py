"""What verification costs: seconds per phase for one program folder.

    python benchmarks/verify_cost.py RUN_DIR [--reference FILE|kernelbench:L:ID] [--trials 5]
                                     [--no-compile] [--no-profile] [--repeat 1] [--json out.json]

Runs the full Verifier (static rules, build, correctness + dynamic checks, timing with the four
baselines, CUPTI profile) on the folder, as ``stitchcuda verify`` does, and prints the time of each
phase, grouped as build / correctness / timing / profile / other, with the verdict, the GPU, the
date and the commit, as a Markdown table ready for BENCHMARKS.md. The first repeat builds; later
repeats find the library already built (the build row then shows the cache check). The report
written into the folder is the last repeat's.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path

GROUPS = {  # phase name prefix -> group
    "build": "build",
    "correctness": "correctness",
    "timing": "timing",
    "reference_profile": "timing",
    "profile": "profile",
    "ceilings": "profile",
}


def group_of(name: str) -> str:
    base = name.split(" (")[0]
    if base.startswith("profile setup"):
        return "profile"
    return GROUPS.get(base, "other")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", help="a program folder (manifest.json, program.cu, weights.safetensors)")
    ap.add_argument("--reference", help="KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--no-profile", action="store_true", help="skip the CUPTI profile")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", help="also write the numbers to this file")
    args = ap.parse_args(argv)

    from stitchcuda.manifest import ManifestError
    from stitchcuda.verifier.run.reference import ProblemError
    from stitchcuda.verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program

    opts = VerifyOptions(trials=args.trials, compile=not args.no_compile, profile=not args.no_profile,
                         command="python benchmarks/verify_cost.py " + " ".join(argv or sys.argv[1:]))
    runs = []
    for i in range(args.repeat):
        t0 = time.monotonic()
        try:
            v = verify_program(args.dir, args.reference, opts)
        except (ManifestError, ProblemError, VerifyEnvironmentError) as e:
            print(f"verify_cost: {e}", file=sys.stderr)
            return 2
        wall = time.monotonic() - t0
        groups: dict[str, float] = {}
        for p in v.phases:
            groups[group_of(p.name)] = groups.get(group_of(p.name), 0.0) + p.seconds
        runs.append({"repeat": i, "wall_s": wall, "groups": groups,
                     "phases": [[p.name, p.seconds] for p in v.phases], "verdict": v.result.verdict.summary(),
                     "device": v.report.device, "commit": v.report.commit})
        print(f"repeat {i}: {wall:.1f} s, {v.result.verdict.summary()}", file=sys.stderr)

    last = runs[-1]
    order = ["build", "correctness", "timing", "profile", "other"]
    print(f"Verification cost of `{args.dir}` on {last['device'] or 'unknown GPU'}, "
          f"{dt.date.today().isoformat()}, commit {last['commit'] or '?'}:\n")
    print("| repeat | " + " | ".join(f"{g} s" for g in order) + " | total s | verdict |")
    print("|" + "---|" * (len(order) + 3))
    for r in runs:
        cells = [f"{r['groups'].get(g, 0.0):.1f}" for g in order]
        print(f"| {r['repeat']} | " + " | ".join(cells) + f" | {r['wall_s']:.1f} | {r['verdict'][:60]} |")
    print("\nPhases of the last repeat:\n")
    print("| phase | seconds |\n|---|---|")
    for name, secs in last["phases"]:
        print(f"| {name} | {secs:.2f} |")
    print(f"\nCommand: `{opts.command}`")
    if args.json:
        Path(args.json).write_text(json.dumps({"dir": args.dir, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
