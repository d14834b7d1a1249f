"""Correctness over a whole KernelBench set (GPU): build every problem, verify it, no timing.

    python benchmarks/verify_all.py [--set ../shared/kernelbench/all.jsonl] [--precision tf32]
        [--out runs/verify-all-tf32] [--work DIR] [--budget-s 540] [--workers 12] [--only 1:50,2:2]

Resumable: every finished problem is a line of ``<out>/results.jsonl`` and a rerun skips them, so
the set can be covered over several runs of at most ten minutes (``--budget-s``: no problem is
started after that many seconds; the ones in flight finish). Only ``results.jsonl`` needs to be
kept between runs: the references and programs go under ``--work`` (default: ``--out``). Programs are built (capture, plan,
code, nvcc for this GPU) in ``--workers`` processes while the ones built are verified, ``--verifiers``
at a time, by the Verifier in its child process: fresh-seed trials (``--trials``), outputs poisoned,
inputs checked unchanged, the dynamic checks; no timing, no profile, no torch.compile baseline.
Prints (and writes to ``<out>/summary.md``) the correct rate per level over the whole set (a
problem not run yet counts as not correct, and is said), the failures grouped by cause (each
failure's report.md / report.json under ``<out>/reports``) and where the correctness phases' time
went.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time
import traceback
from collections import defaultdict
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _first(text: str) -> str:
    text = (text or "").strip()
    return (text.splitlines()[0] if text else "")[:600]


def build_one(row: dict, out: str, precision: str) -> dict:
    """Write the problem's reference into ``out`` and build it; a failure is a value."""
    import warnings

    warnings.filterwarnings("ignore")
    from stitchcuda import frontend
    from stitchcuda.pipeline import build_program

    key = f"{row['level']}:{row['problem_id']}"
    rec = {"problem": key, "level": row["level"], "name": row["name"], "precision": precision}
    ref = Path(out) / "references" / f"l{row['level']}_{row['problem_id']}.py"
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(row["source"])
    rec["reference"] = str(ref)
    t0 = time.monotonic()
    try:
        outcome = build_program(str(ref), precision=precision, out=Path(out) / "programs" / ref.stem, quiet=True)
    except frontend.UnsupportedOpError as e:
        rec.update(stage="capture", cause="unsupported: " + ", ".join(sorted({u.op for u in e.ops})))
    except Exception as e:  # noqa: BLE001 - a problem's failure is a record
        rec.update(stage="build", cause=f"{type(e).__name__}: {_first(str(e))}")
    else:
        if outcome.ok:
            rec.update(stage="built", directory=str(outcome.directory))
        else:
            b = outcome.build
            err = next((ln for ln in (b.compile.output if b and b.compile else "").splitlines() if "error" in ln),
                       b.message if b else "not built")
            rec.update(stage="build", cause="nvcc: " + _first(err))
    rec["build_s"] = round(time.monotonic() - t0, 1)
    return rec


def verify_one(rec: dict, trials: int, sanitizer: bool = True, reports: str = "") -> dict:
    """Verify a built program; a failure's report.md and report.json are copied under ``reports``
    (so that they come back with results.jsonl from a machine whose work folder does not)."""
    import shutil

    from stitchcuda.verifier.verification import VerifyOptions, verify_program

    t0 = time.monotonic()
    try:
        opts = VerifyOptions(trials=trials, time=False, profile=False, reference_profile=False, compile=False,
                             sanitizer=sanitizer, command="benchmarks/verify_all.py")
        v = verify_program(Path(rec["directory"]), rec["reference"], opts)
        rec["verdict"] = v.result.kind
        rec["phases"] = {p.name.split(" (")[0]: round(p.seconds, 1) for p in v.phases}
        san = next((c.detail for c in v.result.checks if c.name == "sanitizer"), "")
        if san:
            rec["sanitizer_detail"] = san[:300]  # which tools ran, how long each took
        rec["stage"] = "verified"
        if v.result.kind != "passed":
            rec["cause"] = f"{v.result.kind}: {_first(v.result.verdict.summary())}"
            if reports and v.files:
                keep = Path(reports) / Path(rec["directory"]).name
                keep.mkdir(parents=True, exist_ok=True)
                for f in (v.files.json, v.files.markdown):
                    shutil.copy2(f, keep / Path(f).name)
                rec["report"] = str(keep / "report.md")
        # the device full of the other Verifiers' work (several at once): the machine's turn, not the problem's
        if v.result.kind == "inconclusive" and "ran out of device memory" in rec["cause"]:
            rec["environment"] = True
    except Exception as e:  # noqa: BLE001
        rec.update(stage="verify", cause=f"{type(e).__name__}: {_first(str(e))}",
                   trace=traceback.format_exc()[-1500:], environment="Environment" in type(e).__name__)
    rec["verify_s"] = round(time.monotonic() - t0, 1)
    return rec


def out_of_memory(rec: dict) -> bool:
    """Whether a verification ended for want of device memory (the program's allocation, the
    Verifier's, or its verdict of inconclusive): beside other Verifiers, the GPU's turn, not the
    problem's."""
    cause = rec.get("cause", "")
    return "out of memory" in cause or "(oom)" in cause or "cudaErrorMemoryAllocation" in cause \
        or "ran out of device memory" in cause


def schedule(todo: list[dict], build, verify, record, *, workers: int, verifiers: int, in_budget) -> None:
    """Build ``todo`` (``build(row)``: a future of the build's record) and verify what builds
    (``verify(rec)``: a future of the verification's record), ``record`` each outcome. Builds wait
    while the Verifier is behind: a backlog of built programs would be verified past the budget (or
    lost to the caller's limit); nothing is started once ``in_budget()`` is false. With several
    Verifiers side by side, a program that ran out of device memory is verified again at the end,
    one at a time with the GPU to itself (six problems of 2 GiB per input do not fit at once); one
    whose turn the budget does not reach is not recorded (a rerun tries it)."""
    building: set = set()
    verifying: dict = {}  # future -> (the built program's record, verified alone)
    queue = list(todo)
    alone: list[dict] = []
    sharing = verifiers > 1
    while queue or building or verifying or alone:
        while queue and len(building) < workers and len(verifying) < 2 * max(1, verifiers) + 2 and in_budget():
            building.add(build(queue.pop(0)))
        if alone and not queue and not building and not verifying and in_budget():
            print(f"{alone[0]['problem']:7s} verified again, alone on the GPU", flush=True)
            rec = alone.pop(0)
            verifying[verify(rec)] = (rec, True)
        if not building and not verifying:
            if alone:
                print("not recorded, out of budget before their turn alone: "
                      + " ".join(r["problem"] for r in alone), flush=True)
            break
        finished, _ = wait(building | set(verifying), return_when=FIRST_COMPLETED)
        for fut in finished:
            stage = "build" if fut in building else "verify"
            built, by_itself = verifying.pop(fut) if stage == "verify" else (None, False)
            building.discard(fut)
            try:
                rec = fut.result()
            except Exception as e:  # noqa: BLE001 - a crashed worker: the problem is not recorded
                print(f"{stage} worker failed: {type(e).__name__}: {e}", flush=True)
                continue
            if stage == "build" and rec["stage"] == "built":
                verifying[verify(rec)] = (rec, not sharing)
            elif stage == "verify" and not by_itself and out_of_memory(rec):
                print(f"{rec['problem']:7s} out of device memory beside other Verifiers: again alone at the end "
                      f"({rec.get('cause', '')[:90]})", flush=True)
                alone.append(built)
            else:
                record(rec)


def own_memory_readable() -> bool:
    """Whether the Verifier's memory checks read the runner process's own device memory here
    (stitchcuda.verifier.measure.gpu_processes): then Verifiers may share the GPU; else each would
    read the others' trials (three side by side failed 11 of 55 correct programs as leaking)."""
    import torch

    from stitchcuda.verifier.measure import gpu_processes

    if not torch.cuda.is_available():
        return False
    torch.ones(1, device="cuda")  # a context of this process's own, for NVML to list
    return gpu_processes.visible(gpu_processes.device_uuid(torch.cuda.current_device()))


def summary(rows: list[dict], done: dict[str, dict]) -> str:
    lines = []
    by_level: dict[int, list[dict]] = defaultdict(list)
    for r in rows:
        by_level[r["level"]].append(r)
    for level in sorted(by_level):
        keys = [f"{r['level']}:{r['problem_id']}" for r in by_level[level]]
        ran = [done[k] for k in keys if k in done]
        ok = sum(d.get("verdict") == "passed" for d in ran)
        lines.append(f"level {level}: {ok}/{len(keys)} correct ({100 * ok / len(keys):.0f} %)"
                     + (f"; {len(keys) - len(ran)} not run yet" if len(ran) < len(keys) else ""))
    commits = defaultdict(int)
    for d in done.values():
        commits[f"{d.get('commit') or '?'}{'' if d.get('sanitizer', True) else ' (no sanitizer)'}"] += 1
    lines.append("verified at: " + ", ".join(f"{c} ({n})" for c, n in sorted(commits.items())))
    groups: dict[str, list[str]] = defaultdict(list)
    for k, d in done.items():
        if d.get("verdict") != "passed":
            groups[d.get("cause", d.get("stage", "?"))].append(k)
    failed = sorted((k for k, d in done.items() if d.get("verdict") != "passed"),
                    key=lambda s: tuple(map(int, s.split(":"))))
    if failed:  # bench's problem ids for all.jsonl rows are L<level>_<problem_id>_<name>
        flags = " ".join(f"--only L{k.split(':')[0]}_{k.split(':')[1]}_" for k in failed)
        lines.append(f"not passed ({len(failed)}): {','.join(failed)}; the loop on them: stitchcuda bench SET "
                     f"--precision P --optimize {flags}")
    parts: dict[str, float] = defaultdict(float)  # the correctness phase by kind of work, where recorded
    for d in done.values():
        for name, secs in (d.get("phases") or {}).items():
            if name.startswith("correctness: "):
                parts[name.split(": ", 1)[1]] += secs
    if parts:
        lines.append("the correctness phases' time: " + ", ".join(f"{k} {v:.0f} s" for k, v in
                                                                 sorted(parts.items(), key=lambda kv: -kv[1])))
    if groups:
        lines.append("failures by cause:")
        for cause, ks in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
            lines.append(f"  {len(ks):3d}  {cause}  ({' '.join(sorted(ks, key=lambda s: tuple(map(int, s.split(':')))))})")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--set", type=Path, default=REPO.parent / "shared" / "kernelbench" / "all.jsonl")
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--out", type=Path, default=None, help="default runs/verify-<set>-<precision>")
    ap.add_argument("--work", type=Path, default=None, help="references and programs (default: --out)")
    ap.add_argument("--budget-s", type=float, default=540.0, help="start no problem after this many seconds")
    ap.add_argument("--workers", type=int, default=max(1, (os.cpu_count() or 2) - 2), help="build processes")
    ap.add_argument("--verifiers", type=int, default=1,
                    help="programs in the Verifier at once (each in its own process); where NVML does not name "
                         "this machine's processes, the memory checks read the whole device and the Verifier "
                         "children take the GPU in turns (hostlock.gpu_alone): 3 verifiers sharing an H200 "
                         "unlocked failed 11 of 55 correct programs as leaking. A program that runs out of device "
                         "memory beside the others is verified again at the end, alone")
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--no-sanitizer", action="store_true",
                    help="skip compute-sanitizer, as `stitchcuda bench --no-sanitizer` does: on an H200 it took "
                         "44-97 s of the 50-120 s verifications of library-heavy problems (1:16, 3:4, 3:7, 3:15, 3:18)")
    ap.add_argument("--only", default="", help="LEVEL:ID,... (default: every problem of the set)")
    args = ap.parse_args(argv)
    t_start = time.monotonic()
    out = args.out or Path("runs") / f"verify-{args.set.stem}-{args.precision}"
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    done: dict[str, dict] = {}
    if results.is_file():
        for line in results.read_text().splitlines():
            if line.strip():
                d = json.loads(line)
                done[d["problem"]] = d
    rows = [json.loads(x) for x in args.set.read_text().splitlines() if x.strip()]
    only = {s.strip() for s in args.only.split(",") if s.strip()}
    todo = [r for r in rows if f"{r['level']}:{r['problem_id']}" not in done
            and (not only or f"{r['level']}:{r['problem_id']}" in only)]
    print(f"{len(done)} problems done before, {len(todo)} to go; building with {args.workers} processes", flush=True)

    def record(rec: dict) -> None:
        if rec.get("environment"):  # the machine's fault, not the problem's: a rerun tries it again
            print(f"{rec['problem']:7s} not recorded: {rec['cause']}", flush=True)
            return
        rec["commit"] = commit
        rec["sanitizer"] = not args.no_sanitizer
        done[rec["problem"]] = rec
        with results.open("a") as f:
            f.write(json.dumps(rec) + "\n")
        print(f"{rec['problem']:7s} {rec.get('verdict') or rec['stage']:10s} {rec.get('cause', '')[:110]} "
              f"(build {rec.get('build_s')} s, verify {rec.get('verify_s', '-')} s)", flush=True)

    if args.verifiers > 1 and not own_memory_readable():
        import tempfile

        from stitchcuda import hostlock

        os.environ.setdefault(hostlock.GPU_ENV, str(Path(tempfile.gettempdir()) / "stitchcuda-verify-all-gpu.lock"))
        print(f"{args.verifiers} verifiers take the GPU in turns: NVML does not name this machine's processes, so "
              "the memory checks read the whole device", flush=True)
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    # spawn: the builders and verifiers must not inherit this process's state (CUDA, threads)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(args.workers, mp_context=spawn) as builders, \
            ProcessPoolExecutor(max(1, args.verifiers), mp_context=spawn) as verifiers:
        schedule(todo, lambda row: builders.submit(build_one, row, str(args.work or out), args.precision),
                 lambda rec: verifiers.submit(verify_one, rec, args.trials, not args.no_sanitizer,
                                              str(out / "reports")),
                 record, workers=args.workers, verifiers=args.verifiers,
                 in_budget=lambda: time.monotonic() - t_start < args.budget_s)
    text = summary(rows, done)
    (out / "summary.md").write_text(f"# {args.set.name} under {args.precision} (benchmarks/verify_all.py)\n\n"
                                    f"```\n{text}\n```\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
