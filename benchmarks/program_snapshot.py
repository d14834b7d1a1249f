"""Every program the Coder writes, as text: a snapshot to diff a refactor against.

Captures every problem of KernelBench's ``all.jsonl`` (read at run time) and every reference in
``models/`` on the meta device, plans it under each policy and writes the ``program.cu`` it
codes to ``OUT/<name>_<policy>.cu`` and the plan to ``.plan.json`` (or ``OUT/<name>_<policy>.err``: the first line of what
stopped it). ``--compare BEFORE`` then lists the files that differ from an earlier snapshot.
A refactor that says "nothing changed" shows it here: the same text for every program.

    python benchmarks/program_snapshot.py --out /tmp/before [--policies fp32,tf32,bf16] [--workers 2]
    python benchmarks/program_snapshot.py --out /tmp/after --compare /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("STITCHCUDA_SHARED") or REPO.parent / "shared")


def _problems() -> list[tuple[str, str]]:
    """(name, source) of every reference: all.jsonl's problems, then models/."""
    out = []
    path = SHARED / "kernelbench" / "all.jsonl"
    if path.is_file():
        for line in path.read_text().splitlines():
            if line.strip():
                r = json.loads(line)
                out.append((f"L{r['level']}_{r['problem_id']:03d}", r["source"]))
    for p in sorted((REPO / "models").glob("*.py")):
        out.append((f"model_{p.stem}", p.read_text()))
    return out


def _one(job: tuple[str, str, tuple[str, ...], str]) -> tuple[str, int, int, float]:
    name, source, policies, out = job
    import warnings

    warnings.filterwarnings("ignore")
    import torch

    torch.set_num_threads(1)
    from stitchcuda import code as C
    from stitchcuda import frontend
    from stitchcuda import plan as P

    t0 = time.monotonic()
    ok = err = 0
    try:
        ref = frontend.load_reference(source, name=name)
        cap = frontend.capture_reference(ref, device="meta", seed=0, state="lift")
    except Exception as e:  # noqa: BLE001 - a problem that does not capture is written down as such
        for pol in policies:
            Path(out, f"{name}_{pol}.err").write_text(f"capture: {type(e).__name__}: {str(e).strip()[:300]}\n")
        return name, 0, len(policies), time.monotonic() - t0
    for pol in policies:
        try:
            plan = P.plan(cap.graph, pol)
            src = C.code(plan, cap.graph, None, arch="sm_90")
            Path(out, f"{name}_{pol}.cu").write_text(src.program_cu)
            Path(out, f"{name}_{pol}.plan.json").write_text(plan.to_json())
            ok += 1
        except Exception as e:  # noqa: BLE001
            Path(out, f"{name}_{pol}.err").write_text(f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:300]}\n")
            err += 1
    return name, ok, err, time.monotonic() - t0


def compare(before: Path, after: Path) -> int:
    a = {p.name: p for p in before.iterdir()}
    b = {p.name: p for p in after.iterdir()}
    only_a, only_b = sorted(set(a) - set(b)), sorted(set(b) - set(a))
    differ = sorted(n for n in set(a) & set(b) if a[n].read_bytes() != b[n].read_bytes())
    for label, names in (("only before", only_a), ("only after", only_b), ("differ", differ)):
        for n in names:
            print(f"{label}: {n}")
    print(f"{len(set(a) & set(b)) - len(differ)} same, {len(differ)} differ, {len(only_a)} only before, "
          f"{len(only_b)} only after")
    return 1 if (only_a or only_b or differ) else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--policies", default="fp32,tf32,bf16")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--only", default="", help="comma-separated name prefixes (L1_023,model_mlp)")
    ap.add_argument("--compare", default="", help="an earlier snapshot to diff against")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    policies = tuple(p for p in args.policies.split(",") if p)
    probs = _problems()
    if args.only:
        keep = tuple(args.only.split(","))
        probs = [p for p in probs if p[0].startswith(keep)]
    t0 = time.monotonic()
    jobs = [(n, s, policies, str(out)) for n, s in probs]
    with ProcessPoolExecutor(args.workers) as pool:
        for name, ok, err, dt in pool.map(_one, jobs, chunksize=1):
            if err:
                print(f"{name}: {ok} coded, {err} stopped ({dt:.1f} s)", flush=True)
    print(f"{len(probs)} references x {len(policies)} policies in {time.monotonic() - t0:.0f} s -> {out}")
    return compare(Path(args.compare), out) if args.compare else 0


if __name__ == "__main__":
    sys.exit(main())
