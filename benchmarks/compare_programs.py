"""Two generations of the same programs, side by side on one GPU: same outputs, same speed?

For each reference and policy, the program is built by today's pipeline into OUT/<name>_<policy>/
and a second folder is made beside it holding another ``program.cu`` for the same interface (from
--before: ``<name>_<policy>.cu`` files written by an earlier version of the Coder), with the same
manifest and weights. Both are loaded with :class:`stitchcuda.program.Program`, run on the same
fresh inputs (outputs compared element by element: bit-identical, or the largest difference and
whether it is within the policy's tolerance), and timed in one process: bound runs on one stream,
trials of the two interleaved so that clock and power drift hit both alike, L2 flushed between
trials, CUDA events, medians. Prints a Markdown table; --json appends one line per pair.

    python benchmarks/compare_programs.py --before DIR --problems 1:1,3:44 --models mlp --policies tf32,fp32
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path


def _bench(runs, stream, flush, trials: int) -> list[list[float]]:
    import torch

    times = [[] for _ in runs]
    for r in runs:  # warm-up: builds plans, captures graphs
        for _ in range(3):
            r(stream.cuda_stream)
    torch.cuda.synchronize()
    for t in range(trials):
        order = range(len(runs)) if t % 2 == 0 else reversed(range(len(runs)))
        for k in order:
            flush.zero_()
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            with torch.cuda.stream(stream):
                s.record(stream)
                runs[k](stream.cuda_stream)
                e.record(stream)
            e.synchronize()
            times[k].append(s.elapsed_time(e))
    return times


def prepare(ref: str, name: str, policy: str, before: Path, out: Path) -> tuple[Path, Path]:
    """Both folders of a pair, written but not compiled: today's build, and the earlier source
    beside it with the same manifest (but its own source hash) and weights."""
    import dataclasses

    from stitchcuda import manifest as mf
    from stitchcuda.device import DEFAULT
    from stitchcuda.pipeline import build_program

    old_src = before / f"{name}_{policy}.cu"
    if not old_src.is_file():
        raise FileNotFoundError(f"no earlier program {old_src.name}")
    new_dir = out / f"{name}_{policy}"
    # The earlier programs were planned against the default ceilings: plan against them too.
    build_program(ref, precision=policy, out=new_dir, quiet=True, seed=0, ceilings=DEFAULT, compile=False)
    old_dir = out / f"{name}_{policy}_before"
    old_dir.mkdir(parents=True, exist_ok=True)
    text = old_src.read_text()
    (old_dir / mf.PROGRAM_SOURCE).write_text(text)
    m = mf.Manifest.from_json((new_dir / mf.MANIFEST_FILE).read_text())
    m = dataclasses.replace(m, source_hash=mf.hash_source(text), generator="an earlier stitchcuda Coder")
    (old_dir / mf.MANIFEST_FILE).write_text(m.to_json())
    shutil.copyfile(new_dir / mf.WEIGHTS_FILE, old_dir / mf.WEIGHTS_FILE)
    return new_dir, old_dir


def one(ref: str, policy: str, new_dir: Path, old_dir: Path, trials: int, seed: int) -> dict:
    import torch

    from stitchcuda.precision import get
    from stitchcuda.program import Program

    row = {"reference": ref, "policy": policy}
    progs = [Program.load(new_dir), Program.load(old_dir)]
    dev = torch.device("cuda")
    g = torch.Generator(device="cpu").manual_seed(seed)
    ins = [torch.randn(s.shape, generator=g).to(getattr(torch, s.dtype)).to(dev) if s.dtype.startswith(("float", "bfloat"))
           else torch.randint(0, 2, s.shape, generator=g).to(getattr(torch, s.dtype)).to(dev) for s in progs[0].inputs]
    outs = [[torch.full(s.shape, float("nan"), dtype=getattr(torch, s.dtype), device=dev) for s in p.outputs]
            for p in progs]
    stream = torch.cuda.Stream(dev)
    runs = [p.instance(0).bind(ins, o_, stream=stream.cuda_stream) for p, o_ in zip(progs, outs)]
    for r in runs:
        r(stream.cuda_stream)
    stream.synchronize()
    tol = get(policy).tolerance
    same, worst, within = True, 0.0, True
    for a, b in zip(outs[0], outs[1]):
        if not torch.equal(a, b):
            same = False
            a64, b64 = a.double(), b.double()
            d = (a64 - b64).abs()
            worst = max(worst, float(d.max()))
            within = within and bool((d <= tol + tol * b64.abs()).all()) and not bool(torch.isnan(a64).any())
    flush = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    times = _bench(runs, stream, flush, trials)
    new_ms, old_ms = statistics.median(times[0]), statistics.median(times[1])
    row.update(identical=same, max_abs_diff=worst, within_tolerance=within, new_ms=new_ms, old_ms=old_ms,
               ratio=new_ms / old_ms, spread_new=(min(times[0]), max(times[0])), spread_old=(min(times[1]), max(times[1])))
    for p in progs:
        p.close()
    return row


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, required=True, help="folder of <name>_<policy>.cu from an earlier Coder")
    ap.add_argument("--problems", default="1:1,1:23,1:26,1:40,1:97,2:12,2:41,2:76,2:86,2:99,3:1,3:3,3:43,3:44")
    ap.add_argument("--models", default="mlp,gpt_block,norm_softmax", help="models/<name>.py references")
    ap.add_argument("--policies", default="tf32,fp32")
    ap.add_argument("--out", type=Path, default=Path("runs/compare"))
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)
    jobs = [(f"kernelbench:{p}", "L" + p.replace(":", "_")) for p in args.problems.split(",") if p] + \
           [(str(Path(__file__).resolve().parents[1] / "models" / f"{m}.py"), m) for m in args.models.split(",") if m]
    import os
    from concurrent.futures import ThreadPoolExecutor

    from stitchcuda import build as B
    from stitchcuda import manifest as mf

    pairs, rows = [], []
    for ref, name in jobs:
        for policy in args.policies.split(","):
            try:
                pairs.append((ref, name, policy) + prepare(ref, name, policy, args.before, args.out))
            except Exception as e:  # noqa: BLE001 - one pair's failure is a row
                rows.append({"reference": ref, "policy": policy, "error": f"{type(e).__name__}: {e}"})
    # Compile every program at once (nvcc is single-threaded); the runs below find them built.
    sources = [d / mf.PROGRAM_SOURCE for p in pairs for d in p[3:]]
    t0 = time.monotonic()
    with ThreadPoolExecutor(os.cpu_count() or 4) as pool:
        built = list(pool.map(lambda src: B.build(src.read_text(), arch=None), sources))
    print(f"compiled {sum(b.ok for b in built)}/{len(built)} programs in {time.monotonic() - t0:.0f} s", flush=True)
    print("| reference | policy | outputs | new ms | before ms | new / before |")
    print("|---|---|---|---|---|---|")
    for ref, name, policy, new_dir, old_dir in pairs:
        t0 = time.monotonic()
        try:
            row = one(ref, policy, new_dir, old_dir, args.trials, args.seed)
        except Exception as e:  # noqa: BLE001 - one pair's failure is a row
            row = {"reference": ref, "policy": policy, "error": f"{type(e).__name__}: {e}"}
        row["seconds"] = round(time.monotonic() - t0, 1)
        rows.append(row)
        if args.json:
            with args.json.open("a") as f:
                f.write(json.dumps(row) + "\n")
        if "error" in row:
            print(f"| {name} | {policy} | ERROR {row['error'][:80]} | | | |", flush=True)
            continue
        outs = "identical" if row["identical"] else \
            f"max diff {row['max_abs_diff']:.2g} ({'within' if row['within_tolerance'] else 'OUTSIDE'} tol)"
        print(f"| {name} | {policy} | {outs} | {row['new_ms']:.4f} | {row['old_ms']:.4f} | {row['ratio']:.3f} |",
              flush=True)
    ok = [r for r in rows if "ratio" in r]
    if ok:
        worst = max(ok, key=lambda r: abs(r["ratio"] - 1))
        print(f"\n{len(ok)} pairs; new/before ratio median {statistics.median(r['ratio'] for r in ok):.3f}, "
              f"worst {worst['ratio']:.3f} ({worst['reference']} {worst['policy']}); "
              f"identical outputs {sum(r['identical'] for r in ok)}/{len(ok)}, "
              f"all within tolerance: {all(r['identical'] or r['within_tolerance'] for r in ok)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
