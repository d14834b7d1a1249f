"""What verification costs: seconds per phase for one program folder, or for five problems of different
sizes, now and at an earlier commit.

    python benchmarks/verify_cost.py RUN_DIR [--reference FILE|kernelbench:L:ID] [--trials 5]
                                     [--no-compile] [--no-profile] [--repeat 1] [--json out.json]
    python benchmarks/verify_cost.py --five [--before REV] [--no-compile] [--no-profile] [--json out.json]

The first form runs the full Verifier (static rules, build, correctness + dynamic checks, the
sanitizer's trial, timing with the four baselines, CUPTI profile) on the folder, as ``stitchcuda
verify`` does, and prints the time of each phase, grouped as build / correctness / sanitizer /
timing / profile / other, with the verdict, the GPU, the date and the commit, as a Markdown table
ready for BENCHMARKS.md. The first repeat builds; later repeats find the library already built (the
build row then shows the cache check). The report written into the folder is the last repeat's.

``--five`` measures five problems of different sizes (:data:`FIVE`: a 64x256 linear + relu, the MLP,
a residual convolution block, a GPT block, a 2 GiB RMS norm); the three from ``models/`` are built
first with this checkout's ``stitchcuda build``. With ``--before REV`` every problem is verified a
second time by the Verifier of commit REV (its ``python/`` tree exported to a temporary folder, the
native runtime of this install beside it, run in a process of its own), and the table puts the
phases side by side: what a change to the Verifier costs, per phase, in one command. Needs a GPU.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

GROUPS = {  # phase name prefix -> group
    "build": "build",
    "correctness": "correctness",
    "sanitizer": "sanitizer",
    "timing": "timing",
    "reference_profile": "timing",
    "profile": "profile",
    "ceilings": "profile",
}
ORDER = ["build", "correctness", "sanitizer", "timing", "profile", "other"]

#: (label, what to verify: a program folder or a models/ reference to build, the precision to build at)
FIVE = (
    ("linear + relu, 64x256 (tests/adversarial/correct)", "tests/adversarial/correct", None),
    ("MLP (models/mlp.py)", "models/mlp.py", "fp32"),
    ("residual conv block (models/resnet_block.py)", "models/resnet_block.py", "tf32"),
    ("GPT block (models/gpt_block.py)", "models/gpt_block.py", "tf32"),
    ("RMS norm over 2 GiB (tests/adversarial/large_honest)", "tests/adversarial/large_honest", None),
)


def group_of(name: str) -> str:
    base = name.split(" (")[0]
    if base.startswith("profile setup"):
        return "profile"
    return GROUPS.get(base, "other")


def cost(folder: str, reference: str | None, trials: int, compile_: bool, profile: bool, repeat: int,
         command: str) -> list[dict]:
    """Verify ``folder`` ``repeat`` times; the phases of each run, grouped."""
    from stitchcuda.manifest import ManifestError
    from stitchcuda.verifier import ProblemError, VerifyEnvironmentError, VerifyOptions, verify_program

    opts = VerifyOptions(trials=trials, compile=compile_, profile=profile, command=command)
    runs = []
    for i in range(repeat):
        t0 = time.monotonic()
        try:
            v = verify_program(folder, reference, opts)
        except (ManifestError, ProblemError) as e:
            raise SystemExit(f"verify_cost: {e}")
        except VerifyEnvironmentError as e:
            if e.verification is None:
                raise SystemExit(f"verify_cost: {e}")
            v = e.verification
        wall = time.monotonic() - t0
        groups: dict[str, float] = {}
        for p in v.phases:
            if not p.part_of:  # (a phase's parts are in it already)
                groups[group_of(p.name)] = groups.get(group_of(p.name), 0.0) + p.seconds
        runs.append({"repeat": i, "wall_s": wall, "groups": groups,
                     "phases": [[p.name, p.seconds] for p in v.phases], "verdict": v.result.verdict.summary(),
                     "device": v.report.device, "commit": v.report.commit})
        print(f"repeat {i}: {wall:.1f} s, {v.result.verdict.summary()}", file=sys.stderr)
    return runs


def one_folder(args: argparse.Namespace, argv: list[str] | None) -> int:
    command = "python benchmarks/verify_cost.py " + " ".join(argv or sys.argv[1:])
    runs = cost(args.dir, args.reference, args.trials, not args.no_compile, not args.no_profile, args.repeat,
                command)
    if args.quiet_table:
        print(json.dumps({"dir": args.dir, "runs": runs}))
        return 0
    last = runs[-1]
    print(f"Verification cost of `{args.dir}` on {last['device'] or 'unknown GPU'}, "
          f"{dt.date.today().isoformat()}, commit {last['commit'] or '?'}:\n")
    print("| repeat | " + " | ".join(f"{g} s" for g in ORDER) + " | total s | verdict |")
    print("|" + "---|" * (len(ORDER) + 3))
    for r in runs:
        cells = [f"{r['groups'].get(g, 0.0):.1f}" for g in ORDER]
        print(f"| {r['repeat']} | " + " | ".join(cells) + f" | {r['wall_s']:.1f} | {r['verdict'][:60]} |")
    print("\nPhases of the last repeat:\n")
    print("| phase | seconds |\n|---|---|")
    for name, secs in last["phases"]:
        print(f"| {name} | {secs:.2f} |")
    print(f"\nCommand: `{command}`")
    if args.json:
        Path(args.json).write_text(json.dumps({"dir": args.dir, "runs": runs}, indent=1) + "\n")
    return 0


# ------------------------------------------------------------------ five problems, now and before


def _folders(work: Path) -> list[tuple[str, Path]]:
    """The five program folders: copied (hand-written ones) or built now (models/)."""
    from stitchcuda.pipeline import build_program

    out = []
    for label, what, policy in FIVE:
        src = REPO / what
        dst = work / src.stem
        if policy is None:
            dst.mkdir(parents=True)
            for f in ("program.cu", "manifest.json"):
                shutil.copy(src / f, dst / f)
            data = json.loads((dst / "manifest.json").read_text())
            ref = data["reference"].get("path")
            if ref and not Path(ref).is_absolute():
                data["reference"]["path"] = str((src / ref).resolve())
            (dst / "manifest.json").write_text(json.dumps(data, indent=2))
        else:
            print(f"building {what} ({policy}) ...", file=sys.stderr, flush=True)
            b = build_program(str(src), precision=policy, out=dst, quiet=True)
            if not b.ok:
                raise SystemExit(f"verify_cost: {what} does not build: {b}")
        out.append((label, dst))
    return out


def _earlier_tree(rev: str, work: Path) -> Path:
    """``python/`` of commit ``rev``, with this install's native runtime (binding, libraries, headers)
    linked in: the Verifier of then, on the runtime of now."""
    import stitchcuda

    root = work / f"at-{rev}"
    root.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "python"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    pkg = Path(stitchcuda.__file__).resolve().parent
    dst = root / "python" / "stitchcuda"
    for p in pkg.iterdir():
        if p.name.startswith("_rt") and p.suffix == ".so" or p.name in ("lib", "include", "examples", "runner"):
            target = dst / p.name
            if target.exists() or target.is_symlink():
                if target.is_dir() and not target.is_symlink():
                    shutil.rmtree(target)
                else:
                    target.unlink()
            target.symlink_to(p.resolve())
    return root / "python"


def _measure_with(tree: Path | None, folder: Path, args: argparse.Namespace) -> dict:
    """One verification of ``folder`` in a process of its own, by this checkout's Verifier or the one in
    ``tree``."""
    cmd = [sys.executable, str(Path(__file__).resolve()), str(folder), "--quiet-table"]
    cmd += ["--no-compile"] if args.no_compile else []
    cmd += ["--no-profile"] if args.no_profile else []
    env = dict(os.environ)
    if tree is not None:  # first on the path: its stitchcuda is the one imported (and its worker's)
        env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
        env["STITCHCUDA_COMMIT"] = args.before
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO), timeout=args.timeout)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"error": (p.stderr or p.stdout)[-600:]}
    return json.loads(lines[-1])["runs"][-1]


def five(args: argparse.Namespace, argv: list[str] | None) -> int:
    command = "python benchmarks/verify_cost.py " + " ".join(argv if argv is not None else sys.argv[1:])
    rows = []
    with tempfile.TemporaryDirectory(prefix="stitchcuda-cost-") as tmp:
        work = Path(tmp)
        folders = _folders(work)
        earlier = _earlier_tree(args.before, work) if args.before else None
        for label, folder in folders:
            print(f"{label}: now ...", file=sys.stderr, flush=True)
            now = _measure_with(None, folder, args)
            then = None
            if earlier is not None:
                print(f"{label}: at {args.before} ...", file=sys.stderr, flush=True)
                then = _measure_with(earlier, folder, args)
            rows.append({"problem": label, "now": now, "before": then})
    device = next((r["now"].get("device") for r in rows if r["now"].get("device")), "") or "unknown GPU"
    commit = next((r["now"].get("commit") for r in rows if r["now"].get("commit")), "") or "?"
    print(f"Verification cost per phase, {device}, {dt.date.today().isoformat()}, commit {commit}"
          + (f" against {args.before}" if args.before else "") + f": `{command}`\n")
    head = ["problem", "Verifier"] + [f"{g} s" for g in ORDER] + ["total s", "verdict"]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        for who, run in (("now", r["now"]), (f"at {args.before}", r["before"])):
            if run is None:
                continue
            if "error" in run:
                print(f"| {r['problem']} | {who} | " + " | ".join("" for _ in ORDER) + f" | | ERROR "
                      f"{run['error'][-120:].replace('|', '/').splitlines()[-1] if run['error'] else ''} |")
                continue
            cells = [f"{run['groups'].get(g, 0.0):.1f}" for g in ORDER]
            print(f"| {r['problem']} | {who} | " + " | ".join(cells) + f" | {run['wall_s']:.1f} | "
                  f"{run['verdict'][:70]} |")
    if args.json:
        Path(args.json).write_text(json.dumps({"before": args.before, "rows": rows}, indent=1) + "\n")
    return 0 if all("error" not in (r["now"] or {}) for r in rows) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dir", nargs="?", help="a program folder (manifest.json, program.cu)")
    ap.add_argument("--reference", help="KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    ap.add_argument("--trials", type=int, default=5)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    ap.add_argument("--no-profile", action="store_true", help="skip the CUPTI profile")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--five", action="store_true", help="five problems of different sizes (module docstring)")
    ap.add_argument("--before", help="with --five: also verify each with the Verifier of this commit")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds for one verification's process")
    ap.add_argument("--json", help="also write the numbers to this file")
    ap.add_argument("--quiet-table", action="store_true", help=argparse.SUPPRESS)  # one JSON line (--five's child)
    args = ap.parse_args(argv)
    if args.five:
        return five(args, argv)
    if not args.dir:
        ap.error("a program folder, or --five")
    return one_folder(args, argv)


if __name__ == "__main__":
    sys.exit(main())
