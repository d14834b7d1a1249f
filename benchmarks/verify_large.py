"""What verification costs, phase by phase, on the largest problems of a KernelBench set (GPU).

    python benchmarks/verify_large.py [--set PATH/all.jsonl] [--top 5] [--only L:ID,...] [--json out.json]

The problems are ranked by the bytes of one set of inputs, outputs and weights (shapes from the
meta device; a recurrent model's outputs, which the meta device takes minutes to trace, are
counted as zero: they are small). For each of the ``--top`` largest:

1. ``stitchcuda build`` (the planner and the template Coder, fp32). If it builds, the program is
   verified (correctness and the dynamic checks; ``--time`` adds timing) in the Verifier's child
   process, and the phases of its report are the measurement.
2. If it does not build (an op no template covers), the Verifier's correctness procedure runs on
   the reference side alone, in this process: the same draws, trials, comparisons and dynamic
   checks, with PyTorch's own forward standing in for a program (``ReferenceRunner``). This
   measures what verification costs in time and device memory whatever the program; it is not a
   verdict on any program, and the table says which rows are which.

Each problem runs in a process of its own (``--one``), so that no problem's device memory (a
tensor held by an exception's traceback, PyTorch's cache) is there when the next one starts; the
child prints its row as JSON. The peak device memory of a row is PyTorch's peak allocation in the
process that verified (the Verifier's child for a built program, plus the program's own memory),
with the device's total beside it.

It prints a Markdown table (problem, GiB of inputs + outputs + weights, how, seconds per phase,
correctness seconds, peak device memory, verdict, the notes saying which checks kept copies on
the host) and exits 1 when any problem ran out of memory or spent more than 30 s in its
correctness phase.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback
import types
from pathlib import Path

CORRECTNESS_LIMIT_S = 30.0
RECURRENT = ("LSTM", "GRU", "RNN")


def problem_sizes(path: Path, only: set[tuple[int, int]] | None = None) -> list[dict]:
    """Every problem of a KernelBench JSONL file (or those of ``only``) with the bytes of its inputs,
    outputs and weights, largest first."""
    import torch

    rows = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if only is not None and (rec["level"], rec["problem_id"]) not in only:
            continue
        mod = types.ModuleType("reference")
        row = {"level": rec["level"], "id": rec["problem_id"], "name": rec["name"], "bytes": -1}
        try:
            with torch.device("meta"):
                exec(rec["source"], mod.__dict__)  # noqa: S102 - the project's own KernelBench set
                ins = [t for t in mod.get_inputs() if isinstance(t, torch.Tensor)]
                model = mod.Model(*mod.get_init_inputs())
                w = sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])
                out = 0
                if not any(r in rec["name"] for r in RECURRENT):
                    res = model(*mod.get_inputs())
                    outs = [res] if isinstance(res, torch.Tensor) else [o for o in res if isinstance(o, torch.Tensor)]
                    out = sum(t.numel() * t.element_size() for t in outs)
            row["bytes"] = sum(t.numel() * t.element_size() for t in ins) + out + w
        except Exception as e:  # noqa: BLE001 - a problem the meta device cannot trace is ranked last
            row["error"] = f"{type(e).__name__}: {e}"[:200]
        rows.append(row)
    return sorted(rows, key=lambda r: -r["bytes"])


class ReferenceRunner:
    """PyTorch's forward in place of a program, on one stream: for measuring the Verifier's own cost.
    Implements ``correctness.Runner``."""

    def __init__(self, problem, stream):
        import torch

        self.problem, self.stream, self.device = problem, stream, problem.device
        self.template = problem.draw(0)
        self.template.program = []
        self._torch = torch

    def context(self):
        return self._torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def run(self, inputs, outputs):
        from stitchcuda.precision import fp32_exact
        from stitchcuda.verifier.run.reference import flatten_outputs as _flatten

        torch = self._torch
        with self.context(), torch.no_grad(), fp32_exact():
            outs = _flatten(self.problem.model(*self.problem.model_args(self.template, list(inputs))))
            for o, r in zip(outputs, outs):
                o.copy_(r)

    def sync(self):
        if self.stream is not None:
            ev = self._torch.cuda.Event()
            ev.record(self.stream)
            ev.synchronize()

    def sync_device(self):
        if self.stream is not None:
            self._torch.cuda.synchronize(self.device)

    def hold(self):
        if self.stream is not None:
            with self.context():
                self._torch.cuda._sleep(200_000_000)

    def ordered(self, fn):
        with self.context():
            fn()


def reference_side(ref: str, seed: int, device: str = "cuda:0") -> dict:
    """The correctness procedure with the reference standing in for the program, in this process."""
    import torch

    from stitchcuda import manifest as mf
    from stitchcuda.verifier.run.correctness import check_correctness
    from stitchcuda.verifier.run.harness import ReferenceHarness as Problem
    from stitchcuda.verifier.run.reference import flatten_outputs as _flatten, load_module, resolve_reference, \
        split_args as _split_args

    spec = resolve_reference(ref, Path.cwd())
    t0 = time.monotonic()
    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    # a manifest from the reference itself: its inputs and outputs, no weights (the model keeps its own)
    module = load_module(spec)
    torch.manual_seed(0)
    with torch.device("meta"):
        args = module.module.get_inputs()
        outs = _flatten(module.Model(*module.module.get_init_inputs())(*args))
    idx = _split_args(spec, list(args), "get_inputs()")

    def dt_(t) -> str:
        return str(t.dtype).replace("torch.", "")

    m = mf.Manifest.from_dict({
        "format": "stitchcuda-program", "version": 1, "name": spec.name, "abi_version": 1, "precision": "fp32",
        "arch": "sm_90", "source_hash": "0" * 64, "reference": {"path": "reference.py"},
        "inputs": [{"name": f"in{k}", "dtype": dt_(args[i]), "shape": list(args[i].shape)} for k, i in enumerate(idx)],
        "outputs": [{"name": f"out{k}", "dtype": dt_(o), "shape": list(o.shape)} for k, o in enumerate(outs)]})
    del outs, args
    problem = Problem(spec, m, device, weights_seed=seed)
    setup = time.monotonic() - t0
    stream = torch.cuda.Stream() if cuda else None
    t1 = time.monotonic()
    res = check_correctness(ReferenceRunner(problem, stream), problem, precision="fp32", seed=seed)
    correctness = time.monotonic() - t1
    return {"how": "reference side (PyTorch's forward as the program)", "phases": {"setup": setup,
                                                                                    "correctness": correctness},
            "correctness_s": correctness, "peak_gib": torch.cuda.max_memory_allocated() / 2**30 if cuda else 0.0,
            "verdict": "passed" if res.passed else "FAILED: " + "; ".join(
                c.detail[:80] for c in res.checks if c.status == "fail")[:200], "calls": res.calls,
            "notes": list(res.notes)}


def built_program(ref: str, seed: int, out: Path, timed: bool) -> dict | None:
    """Build with the planner; None when it does not build. Else verify and report its phases."""
    from stitchcuda.pipeline import build_program
    from stitchcuda.verifier.verification import VerifyEnvironmentError, VerifyOptions, verify_program

    try:
        b = build_program(ref, precision="fp32", out=out, quiet=True)
    except Exception as e:  # noqa: BLE001 - an op no template covers: measure the reference side instead
        print(f"  not built: {type(e).__name__}: {str(e)[:200]}", file=sys.stderr)
        return None
    if not b.ok or b.build is None:
        print(f"  not built: {b.build.message if b.build else 'not compiled'}", file=sys.stderr)
        return None
    opts = VerifyOptions(time=timed, profile=False, compile=False, reference_profile=False, seed=seed,
                         weights_seed=seed)
    try:
        v = verify_program(b.directory, ref, opts)
    except VerifyEnvironmentError as e:
        v = e.verification
    phases = {p.name.split(" (")[0]: p.seconds for p in v.phases}
    mem = v.report.details.memory if v.report.details else None
    return {"how": "built program", "phases": phases, "correctness_s": phases.get("correctness", 0.0),
            "peak_gib": (mem.torch_peak_bytes + mem.program_bytes) / 2**30 if mem else float("nan"),
            "verdict": v.result.verdict.summary()[:200],
            "notes": list(v.report.details.correctness_notes) if v.report.details else []}


def measure(ref: str, seed: int, out: Path, timed: bool, reference_only: bool) -> dict:
    """One problem, in this process: built and verified, else the reference side."""
    try:
        row = None if reference_only else built_program(ref, seed, out, timed)
        row = row or reference_side(ref, seed)
    except Exception as e:  # noqa: BLE001 - an out-of-memory is a finding, reported in the table
        row = {"how": "?", "phases": {}, "correctness_s": float("nan"), "peak_gib": float("nan"),
               "verdict": f"ERROR {type(e).__name__}: {str(e)[:200]}", "trace": traceback.format_exc()[-1500:]}
    import torch

    if torch.cuda.is_available():
        row["device_gib"] = torch.cuda.get_device_properties(0).total_memory / 2**30
        row["this_process_peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return row


def run_child(ref: str, args: argparse.Namespace, out: Path) -> dict:
    """``measure`` in a process of its own; its row comes back as the last line of its stdout."""
    cmd = [sys.executable, __file__, "--one", ref, "--set", args.set, "--seed", str(args.seed), "--out", str(out)]
    cmd += ["--time"] if args.time else []
    cmd += ["--reference-side"] if args.reference_side else []
    t = time.monotonic()
    env = {**os.environ}
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")  # as the Verifier's child has it
    p = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, timeout=args.child_timeout, env=env)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        return {"how": "?", "phases": {}, "correctness_s": float("nan"), "peak_gib": float("nan"),
                "verdict": f"ERROR the measuring process exited with {p.returncode} after "
                           f"{time.monotonic() - t:.0f} s and no row"}
    return json.loads(lines[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shared = Path(os.environ.get("STITCHCUDA_SHARED") or Path(__file__).resolve().parents[2] / "shared")
    ap.add_argument("--set", default=str(shared / "kernelbench" / "all.jsonl"))
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--only", help="LEVEL:ID,... instead of the ranking")
    ap.add_argument("--time", action="store_true", help="verify built programs with timing too")
    ap.add_argument("--reference-side", action="store_true", help="never build: measure the reference side")
    ap.add_argument("--seed", type=int, default=20261122)
    ap.add_argument("--child-timeout", type=float, default=300.0, help="seconds for one problem's process")
    ap.add_argument("--json")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # kernelbench:L:ID, measured in this process (the child)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    os.environ["STITCHCUDA_KERNELBENCH"] = args.set  # kernelbench:L:ID names a problem of this set
    if args.one:
        row = measure(args.one, args.seed, Path(args.out), args.time, args.reference_side)
        print(json.dumps(row, default=str), flush=True)
        return 0
    t = time.monotonic()
    if args.only:
        want = [(int(x.split(":")[0]), int(x.split(":")[1])) for x in args.only.split(",")]
        sized = {(r["level"], r["id"]): r for r in problem_sizes(Path(args.set), set(want))}
        picks = [sized.get(w, {"level": w[0], "id": w[1], "name": f"{w[0]}:{w[1]}", "bytes": -1}) for w in want]
    else:
        picks = problem_sizes(Path(args.set))[:args.top]
    print(f"sized the problems of {args.set} in {time.monotonic() - t:.0f} s", file=sys.stderr)
    rows, failed = [], False
    with tempfile.TemporaryDirectory(prefix="stitchcuda-large-") as tmp:
        for p in picks:
            ref = f"kernelbench:{p['level']}:{p['id']}"
            gib = p["bytes"] / 2**30 if p["bytes"] >= 0 else float("nan")
            print(f"{ref} {p['name']} ({gib:.2f} GiB)", file=sys.stderr, flush=True)
            try:
                row = run_child(ref, args, Path(tmp) / f"p{p['level']}_{p['id']}")
            except subprocess.TimeoutExpired:
                row = {"how": "?", "phases": {}, "correctness_s": float("nan"), "peak_gib": float("nan"),
                       "verdict": f"ERROR the measuring process ran past {args.child_timeout:.0f} s"}
            row.update(problem=ref, name=p["name"], gib=gib)
            bad = "out of memory" in row["verdict"].lower() or not (row["correctness_s"] <= CORRECTNESS_LIMIT_S) or \
                row["verdict"].startswith("ERROR") or row["verdict"].lower().startswith("inconclusive")
            row["ok"] = not bad
            failed |= bad
            rows.append(row)
            print(f"  {row['how']}: correctness {row['correctness_s']:.1f} s, peak {row['peak_gib']:.1f} GiB, "
                  f"{row['verdict'][:120]}", file=sys.stderr, flush=True)
            for n in row.get("notes", []):
                print(f"    note: {n}", file=sys.stderr)
    import torch

    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    total = f", {rows[0]['device_gib']:.0f} GiB" if rows and "device_gib" in rows[0] else ""
    print(f"Verification cost of {len(rows)} large problems of {Path(args.set).name}, {device}{total}, "
          f"{dt.date.today().isoformat()}: `python benchmarks/verify_large.py "
          f"{' '.join(argv if argv is not None else sys.argv[1:])}`\n")
    print("| problem | GiB (in + out + weights) | measured | phases (s) | correctness s | peak device GiB | verdict | "
          "copies on the host |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        phases = ", ".join(f"{k} {v:.1f}" for k, v in r["phases"].items())
        host = "; ".join(n.split(":")[0] for n in r.get("notes", []) if "kept on the host" in n) or "none"
        print(f"| {r['problem']} {r['name']} | {r['gib']:.2f} | {r['how']} | {phases} | {r['correctness_s']:.1f} | "
              f"{r['peak_gib']:.1f} | {r['verdict'][:100]}{'' if r['ok'] else ' **(over the limit)**'} | {host} |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
