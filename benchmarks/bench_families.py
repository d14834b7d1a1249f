"""The model families of models/ (convolution nets, a vision transformer, a state-space block)
against PyTorch at matched precision: build (no LLM), verify, time.

Each model is built at each policy into --out and judged by the Verifier's own harness in one
child process per candidate (fresh-seed trials, poisoned outputs, inputs checked unchanged), then
timed with CUDA events, L2 flushed between trials, medians: the program, PyTorch eager and
torch.compile at fp32 and at the policy (TF32 on for tf32, autocast for bf16 / fp16). The
speedup that counts is against ``compile_policy`` (same precision, PyTorch's best).

``--set NAME=VALUE`` replaces a module-level size in every model that assigns it (for timing at
larger sizes than the test sizes models/ ships with; the modified reference is written beside
the program, so the run can be repeated), e.g. ``--set batch_size=64``.

    python benchmarks/bench_families.py --models resnet_block,depthwise_separable,vgg_stack,conv3d_net,patch_vit \\
        --policies tf32 --set batch_size=32 --json families.jsonl
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import traceback
from pathlib import Path

from bench_programs import build_error, speedup_summary, verification_row  # the same rows as the dev-set benchmark

REPO = Path(__file__).resolve().parents[1]
FAMILIES = "resnet_block,depthwise_separable,vgg_stack,conv3d_net,patch_vit,ssm_scan,pool_norm_block"


def reference_file(model: str, sizes: dict[str, str], out_root: Path) -> Path:
    """models/<model>.py, or a copy with the module-level ``sizes`` replaced (those it assigns)."""
    path = REPO / "models" / f"{model}.py"
    if not sizes:
        return path
    text = path.read_text()
    for name, value in sizes.items():
        text = re.sub(rf"^{re.escape(name)}\s*=.*$", f"{name} = {value}", text, flags=re.M)
    tag = "_".join(f"{k}{v}" for k, v in sorted(sizes.items()))
    dst = out_root / "references" / f"{model}_{re.sub(r'[^A-Za-z0-9_]', '', tag)}.py"
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(text)
    return dst


def one(model: str, ref: Path, policy: str, out_root: Path, trials: int, compile_baselines: bool) -> dict:
    from stitchcuda.pipeline import build_program
    from stitchcuda.verifier.verification import VerifyOptions, verify_program

    row = {"model": model, "reference": str(ref), "policy": policy}
    t0 = time.monotonic()
    try:
        outcome = build_program(str(ref), precision=policy, out=out_root / f"{ref.stem}_{policy}", quiet=True)
        row["build_s"] = round(time.monotonic() - t0, 2)
        if not outcome.ok:
            row["error"] = build_error(outcome)
            return row
        row["tasks"] = len(outcome.plan.run_tasks)
        row["strategies"] = sorted({t.strategy for t in outcome.plan.run_tasks})
        opts = VerifyOptions(trials=trials, time=True, profile=False, reference_profile=False, varied=0,
                             compile=compile_baselines, command="benchmarks/bench_families.py")
        v = verify_program(Path(outcome.directory), str(ref), opts)
    except Exception as e:  # noqa: BLE001 - one model's failure is a row, not the end of the run
        row["error"] = f"{type(e).__name__}: {e}"
        row["trace"] = traceback.format_exc()[-2000:]
        return row
    return verification_row(row, v)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=FAMILIES, help="names of models/*.py, comma-separated")
    ap.add_argument("--policies", default="tf32,fp32")
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="replace a module-level size in every model that assigns it (repeatable)")
    ap.add_argument("--out", type=Path, default=Path("runs/families"))
    ap.add_argument("--json", type=Path, default=Path("bench_families.jsonl"))
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    args = ap.parse_args(argv)
    sizes = dict(s.split("=", 1) for s in args.set)
    args.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models.split(","):
        ref = reference_file(model, sizes, args.out)
        for policy in args.policies.split(","):
            row = one(model, ref, policy, args.out, args.trials, not args.no_compile)
            row["sizes"] = sizes
            rows.append(row)
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
            if "error" in row:
                print(f"{model} {policy}: ERROR {row['error']}", flush=True)
                continue

            def r(key):
                v = row.get(key)
                return f"{v / row['ours_ms']:.2f}x" if v and row.get("ours_ms") else "-"

            print(f"{model:20s} {policy:5s} {row['verdict']:10s} ours {row.get('ours_ms', float('nan')):.4f} ms "
                  f"({row.get('tasks')} tasks) | eager fp32 {r('eager_fp32_ms')}  eager {policy} "
                  f"{r('eager_policy_ms')}  compile fp32 {r('compile_fp32_ms')}  compile {policy} "
                  f"{r('compile_policy_ms')} | build {row.get('build_s')} s", flush=True)
    print("\ngeometric means of speedup (baseline ms / ours ms), passed models only:")
    for policy in args.policies.split(","):
        sel = [x for x in rows if x.get("verdict") == "passed" and x["policy"] == policy]
        if not sel:
            continue
        print(f"  {policy} (n={len(sel)}): " + speedup_summary(sel))
    return 0


if __name__ == "__main__":
    sys.exit(main())
