"""The ``stitchcuda`` command: every subcommand, its help with examples, and its exit code.

argparse, with rich for the display (:mod:`stitchcuda.ship.ui`): the parser is the standard
library's, so the command starts fast and its subcommands stay plain functions that tests call
with a list of arguments; rich draws the progress (a spinner per step on a terminal, one line per
finished step elsewhere) and the tables. typer would add a dependency and a second way to declare
what argparse already declares. Every failure ends in one line naming the cause and what to do,
with the exit codes of :mod:`stitchcuda.ship.errors` (2 bad input, 3 this machine cannot, 1 the
candidate failed); ``STITCHCUDA_DEBUG=1`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from .ship import errors
from .ship.errors import CommandError
from .ship.ui import UI

EXAMPLES = """examples:
  stitchcuda build models/gpt_block.py --precision tf32 --out run/gpt_block
  stitchcuda verify run/gpt_block
  stitchcuda optimize models/gemm_row_sum.py --precision tf32 --budget 3m
  stitchcuda runs list
  stitchcuda wheel run/gpt_block --name gpt_block --arch sm_90 --arch sm_80
  stitchcuda bench ../shared/kernelbench/dev.jsonl --precision tf32 --gpus 2 --out bench/dev
  stitchcuda cache list
  stitchcuda doctor
  stitchcuda train run --data train/data --model test --out train/run --steps 300

exit codes: 0 done, 1 the program failed (compile or verdict), 2 bad input,
3 this machine cannot (missing package, no GPU, no nvcc, out of memory), 130 interrupted.
"""


def _version() -> str:
    from . import __version__

    return __version__


# ---------------------------------------------------------------------- selfcheck


def _selfcheck(args: argparse.Namespace, ui: UI) -> int:
    """Check the install end to end: runtime, toolchain, a program built and (with a GPU) run."""
    import stitchcuda
    from stitchcuda import rt, toolchain

    ok = True

    def line(status: str, what: str, detail: str = "") -> None:
        ui.line(f"  [{status:4s}] {what}" + (f": {detail}" if detail else ""))

    ui.line(f"stitchcuda {stitchcuda.__version__}, runtime {rt.version()}")
    nvcc = toolchain.find_nvcc()
    line("ok" if nvcc else "FAIL", "nvcc", f"{nvcc} ({toolchain.nvcc_version(nvcc)})" if nvcc else "not found")
    ok &= nvcc is not None
    gpus = rt.device_count()
    if gpus:
        info = rt.device_info(0)
        cc = info["compute_capability"]
        line("ok", "GPU", f"{gpus} device(s); device 0 sm_{cc[0]}{cc[1]}, {info['sm_count']} SMs, "
                          f"{info['memory_bytes'] / 2**30:.0f} GiB")
    else:
        line("info", "GPU", "none found: building works, running needs a CUDA device")
    if nvcc:
        with tempfile.TemporaryDirectory() as tmp:
            so = Path(tmp) / "example_mlp.so"
            res = toolchain.compile_program(stitchcuda.PACKAGE_DIR / "examples" / "example_mlp.cu", so,
                                            arch=args.arch or toolchain.default_arch())
            line("ok" if res.ok else "FAIL", "example program builds", f"{res.seconds:.1f} s" if res.ok
                 else res.output.strip().splitlines()[-1])
            ok &= res.ok
            if res.ok:
                lib = rt.ProgramLibrary(str(so))
                line("ok", "program ABI", f"loaded, ABI v{lib.abi_version}")
                if gpus:
                    ok &= _run_example(lib, line)
    if gpus:
        ok &= _gemm_check(line)
    ui.line("selfcheck " + ("passed" if ok else "FAILED"))
    ui.result({"ok": ok})
    return 0 if ok else 1


def _run_example(lib, line) -> bool:
    import numpy as np

    from stitchcuda import rt

    rng = np.random.default_rng(0)
    w1 = (rng.standard_normal((512, 256)) / 16).astype(np.float32)
    b1 = rng.standard_normal(512).astype(np.float32)
    w2 = (rng.standard_normal((128, 512)) / 22).astype(np.float32)
    b2 = rng.standard_normal(128).astype(np.float32)
    x = rng.standard_normal((64, 256)).astype(np.float32)
    inst = lib.create([w1, b1, w2, b2])
    xd = rt.DeviceTensor([64, 256], "float32")
    yd = rt.DeviceTensor([64, 128], "float32")
    rt.h2d(xd, x)
    inst.run([xd], [yd])
    y = np.empty((64, 128), np.float32)
    rt.d2h(y, yd)
    rt.synchronize()
    ref = np.maximum(x.astype(np.float64) @ w1.T + b1, 0) @ w2.T + b2
    err = float(np.abs(y - ref).max())
    good = err < 1e-3
    line("ok" if good else "FAIL", "example program runs", f"max abs error {err:.2e} vs float64")
    return good


def _gemm_check(line) -> bool:
    from math import erf

    import numpy as np

    from stitchcuda import rt

    rng = np.random.default_rng(1)
    m, n, k = 256, 192, 320
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    ad, bd = rt.DeviceTensor([m, k]), rt.DeviceTensor([k, n])
    rt.h2d(ad, a)
    rt.h2d(bd, b)
    t0 = time.perf_counter()
    out = rt.gemm(ad, bd, policy="fp32", ops=["gelu"])
    y = np.empty((m, n), np.float32)
    rt.d2h(y, out)
    rt.synchronize()
    dt = time.perf_counter() - t0
    ref = a.astype(np.float64) @ b
    ref = 0.5 * ref * (1 + np.vectorize(erf)(ref / np.sqrt(2)))
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    good = err < 1e-4
    line("ok" if good else "FAIL", "GEMM + fused GELU (fp32)", f"rel error {err:.1e}, first call {dt * 1e3:.1f} ms")
    return good


# ---------------------------------------------------------------------- build


def _build(args: argparse.Namespace, ui: UI) -> int:
    """reference -> program folder: capture, plan, generate CUDA, compile."""
    from . import manifest as mf
    from .pipeline import build_program

    with ui.step("build") as step:
        o = build_program(args.reference, precision=args.precision, out=args.out, arch=args.arch, seed=args.seed,
                          compile=not args.no_compile, quiet=True, progress=step)
    m = o.manifest
    ui.table(f"plan: {m.name} ({m.precision}, {m.arch}), {len(m.tasks)} task(s)",
             ["task", "strategy", "covers", "MFLOP", "MB moved"],
             [[t.name, t.strategy, ", ".join(t.covers), f"{t.flops / 1e6:,.1f}", f"{t.bytes / 1e6:,.2f}"]
              for t in m.tasks], justify=["left", "left", "left", "right", "right"])
    b = o.build
    data = {"program": m.name, "precision": m.precision, "arch": m.arch, "seconds": o.seconds,
            "tasks": [t.to_dict() for t in m.tasks], **({"state": [st.to_dict() for st in m.state]} if m.state else {})}
    if b is not None and not b.ok:
        from .paths import cache_dir

        first = b.message
        where = f"; nvcc's output: {cache_dir() / b.entry / 'build.json'}" if b.entry else ""
        ui.error(f"{m.name}: the generated program does not compile ({first}){where}; nothing was written")
        if b.compile is not None and not ui.quiet:
            sys.stderr.write("".join("    " + ln + "\n" for ln in b.compile.output.strip().splitlines()[:20]))
        ui.result({**data, "ok": False, "error": first})
        return errors.FAILED
    how = "not compiled" if b is None else ("from the build cache" if b.cached else f"compiled in {b.seconds:.1f} s")
    ui.line(f"program {m.name} written to {o.directory} (library {how}; total {o.seconds.get('total', 0):.1f} s)")
    for st in m.state:
        ui.line(f"state kept in {st.attribute} between calls: input {st.input} before the call, output {st.output} "
                "after it (the caller carries it from call to call)")
    if b is not None:
        ui.line(f"next: stitchcuda verify {o.directory}")
    ui.result({**data, "ok": True, "directory": str(o.directory),
               "library": str(o.directory / mf.LIBRARY_FILE) if b is not None else None,
               "cached": bool(b and b.cached)})
    return errors.OK


# ---------------------------------------------------------------------- optimize and runs


def _optimize(args: argparse.Namespace, ui: UI) -> int:
    """The loop: plan -> code -> verify -> route until the budget ends; the best program in <run>/best."""
    import os

    from .workflow import optimize, parse_seconds
    from .workflow.runs import RunError

    if args.reference is None and not args.resume:
        raise CommandError("give a reference (FILE or kernelbench:LEVEL:ID), or --resume RUN")
    try:
        budget = parse_seconds(args.budget) if args.budget is not None else None
        gpu = parse_seconds(args.gpu_budget) if args.gpu_budget is not None else None
    except ValueError as e:
        raise CommandError(str(e)) from None
    if args.iterations is not None and args.iterations < 1:
        raise CommandError("--iterations must be at least 1")
    llm = args.llm or os.environ.get("STITCHCUDA_LLM") or None
    if llm is not None and not Path(llm).is_file():
        raise CommandError(f"--llm {llm}: no such GGUF file")
    out = args.resume if isinstance(args.resume, str) else args.out
    if args.resume and out is None:
        raise CommandError("--resume needs the run folder: --resume RUN (or --out RUN --resume)")
    from .pipeline import need_torch

    need_torch("optimize")
    try:
        with ui.step("optimize") as step:
            r = optimize(args.reference, precision=args.precision, budget=budget, iterations=args.iterations,
                         gpu_budget=gpu, llm=llm, out=out, resume=bool(args.resume), arch=args.arch,
                         progress=lambda text: (step(text) if not ui.quiet else None))
    except RunError as e:
        raise CommandError(str(e)) from None
    st = r.state
    ui.table(f"{st.run_id}: {len(st.candidates)} candidate(s), {st.spent.wall_s:.0f} s",
             ["id", "proposer", "what", "verdict", "ms"],
             [[c.id, c.proposer, c.description[:60], c.judgement.kind if c.judgement else "-",
               f"{c.ms:.4g}" if c.ms is not None else "-"] for c in st.candidates])
    ui.line(f"ended: {st.finished}")
    ui.line(f"report: {r.markdown}")
    best = st.best_candidate
    ui.result({"run": str(r.run_dir), "ok": r.ok, "best": str(r.best) if r.best else None,
               "best_candidate": best.id if best else None, "ms": best.ms if best else None,
               "candidates": len(st.candidates), "finished": st.finished, "report": str(r.markdown)})
    if best is None:
        ui.error(f"no candidate verified ({st.finished}); see {r.markdown}")
        return errors.FAILED
    ui.line(f"best: {best.id} ({best.proposer}) {best.ms:.4g} ms -> {r.best}")
    return errors.OK


def _runs(args: argparse.Namespace, ui: UI) -> int:
    """list | show RUN | diff A B (A, B: RUN for its best, or RUN:CANDIDATE)."""
    from .workflow import runs as R
    from .workflow.report import render

    try:
        if args.action == "list":
            rows, data = [], []
            for run, asked, st in R.list_runs(args.dir):
                best = st.best_candidate if st else None
                rows.append([run.root.name, asked.get("reference", ""), asked.get("precision", ""),
                             len(st.candidates) if st else 0, f"{best.ms:.4g}" if best and best.ms else "-",
                             (st.finished or "interrupted") if st else "no candidate"])
                data.append({"run": str(run.root), "reference": asked.get("reference"), "best_ms": best.ms if best else None,
                             "finished": st.finished if st else None})
            ui.table(f"runs in {args.dir}/", ["run", "reference", "precision", "candidates", "best ms", "ended"], rows)
            ui.result({"runs": data})
            return errors.OK
        if not args.items:
            raise CommandError(f"runs {args.action} needs a run (folder or id under {args.dir}/)")
        if args.action == "show":
            run = R.resolve(args.items[0], args.dir)
            st = run.load()
            ui.line(render(st))
            ui.result({"run": str(run.root), "state": st.to_dict()})
            return errors.OK
        if len(args.items) != 2:
            raise CommandError("runs diff needs two: RUN[:CANDIDATE] RUN[:CANDIDATE]")
        pair = []
        for item in args.items:
            name, _, cid = item.partition(":")
            run = R.resolve(name, args.dir)
            st = run.load()
            c = st.candidate(cid) if cid else st.best_candidate or st.root_candidate
            if c is None:
                raise CommandError(f"{item}: no such candidate in {run.root}")
            pair.append((run, c))
        text = R.diff_candidates(pair[0], pair[1])
        ui.line(text)
        ui.result({"diff": text})
        return errors.OK
    except R.RunError as e:
        raise CommandError(str(e)) from None


# ---------------------------------------------------------------------- verify and profile


def _verify_options(args: argparse.Namespace, **extra):
    from stitchcuda.verifier.verification import VerifyOptions

    return VerifyOptions(trials=args.trials, time=not args.no_time, profile=not args.no_profile,
                         compile=not args.no_compile, seed=args.seed, arch=args.arch, precision=args.precision,
                         command="stitchcuda " + " ".join(sys.argv[1:]), **extra)


def _verify(args: argparse.Namespace, ui: UI) -> int:
    """Verify a program folder; write report.json / report.md / timeline.png into it."""
    from stitchcuda.verifier.verification import VerifyEnvironmentError, verify_program

    if args.trials < 1:
        raise CommandError("--trials must be at least 1")
    from .pipeline import need_torch

    need_torch("verify")
    with ui.step("verify") as step:
        step("static rules, build, correctness, timing, profile")
        try:
            v = verify_program(args.dir, args.reference, _verify_options(args))
        except VerifyEnvironmentError as e:
            part = e.verification.files.markdown if e.verification is not None and e.verification.files else None
            raise CommandError(f"cannot verify here: {e}" + (f" (partial report: {part})" if part else ""),
                               errors.ENVIRONMENT) from None
    r = v.report
    ui.line(f"{r.program}: {v.result.verdict.summary()}")
    if r.phases:
        ui.table(None, ["phase", "seconds"], [[p.name, f"{p.seconds:.1f}"] for p in r.phases], justify=["left", "right"])
    rows, speedups = [], {}
    if r.timings is not None:
        t = r.timings
        rows.append(["program", f"{t.program.median_ms:.4g}", ""])
        for name, b in t.baselines():
            s = t.speedup(b)
            if b is not None and s is not None:
                label = name.replace("at policy", f"at {r.precision}")
                rows.append([label, f"{b.median_ms:.4g}", f"{s:.2f}x"])
                speedups[label] = s
        ui.table(f"time ({r.device or 'GPU'})", ["", "median ms", "speedup"], rows, justify=["left", "right", "right"])
    if v.files is not None:
        ui.line(f"report: {v.files.markdown}")
    ui.result({"program": r.program, "ok": v.result.ok, "verdict": v.result.verdict.summary(),
               "speedups": speedups, "report": str(v.files.json) if v.files else None})
    return v.exit_code  # 0 passed, 1 a verdict against the candidate, 3 inconclusive


def _profile(args: argparse.Namespace, ui: UI) -> int:
    """CUPTI-profile a program folder (no correctness trials); write profile.json into it."""
    import json

    from stitchcuda.fsutil import atomic_write_text
    from stitchcuda.manifest import load_program_dir
    from stitchcuda.verifier import serde
    from stitchcuda.verifier.report.profile import format_ns, summarise
    from stitchcuda.verifier.verification import VerifyEnvironmentError, VerifyOptions, profile_program_dir

    from .pipeline import need_torch

    need_torch("profile")
    with ui.step("profile") as step:
        step("build, profile")
        try:
            opts = VerifyOptions(arch=args.arch, profile_runs=args.runs, precision=args.precision,
                                 command="stitchcuda " + " ".join(sys.argv[1:]))
            res = profile_program_dir(args.dir, args.reference, opts)
        except VerifyEnvironmentError as e:
            raise CommandError(f"cannot profile here: {e}", errors.ENVIRONMENT) from None
    manifest = load_program_dir(args.dir).manifest
    if res.verdict is not None:
        ui.line(f"{manifest.name}: {res.verdict.summary()}")
        return errors.FAILED
    summary = summarise(res.kernels, res.ceilings, manifest.precision)
    src = res.details.source if res.details else "?"
    ui.line(f"{manifest.name}: {summary.launches} launches, {format_ns(summary.busy_ns)} busy ({src})")
    ui.table(None, ["time", "share", "calls", "kernel", "bound"],
             [[format_ns(k.total_ns), f"{k.share:.0%}", k.calls, k.name[:70], k.describe_bound()]
              for k in summary.top(10)], justify=["right", "right", "right", "left", "left"])
    if res.details:
        ui.table(None, ["task", "per run", "share", "bound"],
                 [[t.task, format_ns(t.per_run_ns), f"{t.share:.0%}", t.bound] for t in res.details.tasks])
    out = Path(args.dir) / "profile.json"
    atomic_write_text(out, json.dumps(serde.to_jsonable({"kernels": res.kernels, "details": res.details,
                                                          "ceilings": res.ceilings}), indent=1) + "\n")
    ui.line(f"written: {out}")
    ui.result({"program": manifest.name, "profile": str(out)})
    return errors.OK


# ---------------------------------------------------------------------- wheel, bench, cache, doctor


def _wheel(args: argparse.Namespace, ui: UI) -> int:
    from .ship.wheel import make_wheels

    with ui.step("wheel") as step:
        w = make_wheels(args.dir, name=args.name, archs=args.arch, out=args.out, version=args.wheel_version,
                        progress=step)
    for p in (w.program, w.runtime):
        ui.line(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    ui.line(f"install: pip install {w.program} {w.runtime}")
    ui.line(f"use:     import {w.name}; m = {w.name}.load(); y = m(x)   # NumPy, CuPy or PyTorch arrays")
    ui.result({"name": w.name, "program_wheel": str(w.program), "runtime_wheel": str(w.runtime),
               "archs": list(w.archs)})
    return errors.OK


def _bench(args: argparse.Namespace, ui: UI) -> int:
    from .ship import bench

    mode = "optimize" if args.optimize else "build"
    opts = bench.BenchOptions(precision=args.precision, mode=mode, budget=args.budget, gpus=args.gpus,
                              limit=args.limit, ray=args.ray, only=tuple(args.only or ()), solver=args.solver,
                              trials=args.trials, profile=not args.no_profile, compile=not args.no_compile)
    summary = bench.run_suite(args.suite, args.out, opts, log=ui.info)
    ui.table(f"{summary.suite}: {summary.total} problem(s), {summary.precision}",
             ["", "value"], summary.rows(), justify=["left", "right"])
    for note in summary.notes:
        ui.info(note)
    ui.line(f"report: {summary.markdown}  {summary.html}")
    ui.result(summary.to_dict())
    return errors.OK


def _cache(args: argparse.Namespace, ui: UI) -> int:
    from . import build as B
    from .paths import cache_dir

    if args.action == "list":
        es = B.entries()
        ui.table(f"build cache {cache_dir()}: {len(es)} entr{'y' if len(es) == 1 else 'ies'}, "
                 f"{sum(e.bytes for e in es) / 1e6:.1f} MB",
                 ["program", "policy", "arch", "built", "MB", "age"],
                 [[e.program, e.policy, e.arch, "yes" if e.ok else "FAILED", f"{e.bytes / 1e6:.1f}",
                   _age(time.time() - e.modified)] for e in es], justify=["left", "left", "left", "left", "right", "right"])
        ui.result({"cache": str(cache_dir()), "entries": [
            {"name": e.name, "program": e.program, "policy": e.policy, "arch": e.arch, "ok": e.ok, "bytes": e.bytes,
             "modified": e.modified} for e in es]})
        return errors.OK
    older = args.older_than * 86400 if args.older_than is not None else None
    n, freed = B.clean(older_than_s=older, failed_only=args.failed, program=args.program)
    ui.line(f"removed {n} entr{'y' if n == 1 else 'ies'}, {freed / 1e6:.1f} MB freed from {cache_dir()}")
    ui.result({"removed": n, "bytes": freed})
    return errors.OK


def _age(s: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= size:
            return f"{s / size:.0f} {unit}"
    return f"{s:.0f} s"


def _doctor(args: argparse.Namespace, ui: UI) -> int:
    from .ship.doctor import run_checks

    checks = run_checks()
    ui.table("stitchcuda doctor", ["", "check", "found", "fix"],
             [[c.mark, c.name, c.detail, c.fix] for c in checks])
    bad = [c for c in checks if c.status == "missing" and c.needed_for == "all"]
    ui.result({"checks": [c.to_dict() for c in checks], "ok": not bad})
    return errors.ENVIRONMENT if bad else errors.OK


# ---------------------------------------------------------------------- the parser


def _common() -> argparse.ArgumentParser:
    """Options every subcommand takes (also before the subcommand: ``stitchcuda --json build ...``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--quiet", "-q", action="store_true", default=argparse.SUPPRESS,
                   help="only results and errors")
    p.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                   help="print one JSON object (the result) on stdout and nothing else")
    return p


def parser() -> argparse.ArgumentParser:
    from .precision import NAMES

    common = _common()
    top = argparse.ArgumentParser(prog="stitchcuda", parents=[common],
                                  description="PyTorch reference -> verified, self-contained CUDA program.",
                                  epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)
    top.add_argument("--version", action="version", version=f"stitchcuda {_version()}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def add(name: str, help: str, func, example: str):
        p = sub.add_parser(name, help=help, description=help, parents=[common], epilog=f"example:\n  {example}",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
        p.set_defaults(func=func)
        return p

    p = add("selfcheck", "check the install: runtime, nvcc, example program, GPU", _selfcheck, "stitchcuda selfcheck")
    p.add_argument("--arch", help="target for the example build (default: the GPU's, else sm_90)")

    p = add("build", "reference -> program folder: capture, plan, generate CUDA, compile", _build,
            "stitchcuda build models/gpt_block.py --precision tf32 --out run/gpt_block")
    p.add_argument("reference", metavar="FILE", help="a KernelBench-format .py file, or kernelbench:LEVEL:ID")
    p.add_argument("--precision", "-p", default="fp32", choices=NAMES,
                   help="precision policy (default fp32: exact fp32 math)")
    p.add_argument("--out", "-o", help="program folder (default run/<name>); replaced whole when the build succeeds")
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the GPU's, else $STITCHCUDA_ARCH or sm_90)")
    p.add_argument("--seed", type=int, default=0, help="torch.manual_seed before building the model (default 0)")
    p.add_argument("--no-compile", action="store_true", help="write the folder only")

    p = add("optimize", "the loop: build, verify, then repair / optimize / replan until the budget ends", _optimize,
            "stitchcuda optimize models/gemm_row_sum.py --precision tf32 --budget 3m")
    p.add_argument("reference", metavar="FILE", nargs="?", help="a KernelBench-format .py file, or kernelbench:LEVEL:ID")
    p.add_argument("--precision", "-p", default="fp32", choices=NAMES, help="precision policy (default fp32)")
    p.add_argument("--budget", default=None, help="wall time: 90s, 3m, 1h (default 3m)")
    p.add_argument("--iterations", type=int, default=None, help="at most this many candidates")
    p.add_argument("--gpu-budget", default=None, help="at most this much judging (Verifier) time")
    p.add_argument("--llm", default=None, help="a GGUF model for the LLM proposer (default $STITCHCUDA_LLM; none: no LLM)")
    p.add_argument("--out", "-o", default=None, help="the run folder (default runs/<name>-<precision>-<time>)")
    p.add_argument("--resume", nargs="?", const=True, default=False, metavar="RUN",
                   help="go on with a run (killed, or given more budget); RUN defaults to --out")
    p.add_argument("--arch", help="target, e.g. sm_90 (default: the GPU's, else $STITCHCUDA_ARCH or sm_90)")

    p = add("runs", "list, show or diff optimisation runs", _runs, "stitchcuda runs diff RUN:c0000 RUN")
    p.add_argument("action", choices=["list", "show", "diff"])
    p.add_argument("items", nargs="*", help="show: RUN; diff: RUN[:CANDIDATE] RUN[:CANDIDATE] (a run alone: its best)")
    p.add_argument("--dir", default="runs", help="where runs are (default runs)")

    p = add("verify", "verify a program folder: correctness, anti-hacking, timing, CUPTI profile", _verify,
            "stitchcuda verify run/gpt_block --trials 5")
    p.add_argument("dir", help="the program folder (manifest.json, program.cu, weights.safetensors)")
    p.add_argument("--reference", help="a KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    p.add_argument("--trials", type=int, default=5, help="random trials (default 5)")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of the first trial (default: drawn fresh, written to the report after the run)")
    p.add_argument("--precision", "-p", default=None, choices=NAMES,
                   help="the policy to judge at (default: the one the manifest states; the report says which)")
    p.add_argument("--no-time", action="store_true", help="skip timing")
    p.add_argument("--no-profile", action="store_true", help="skip the CUPTI profile")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument("--arch", help="build target (default: $STITCHCUDA_ARCH, else the manifest's)")

    p = add("profile", "CUPTI-profile a program folder (kernels, tasks, roofline)", _profile,
            "stitchcuda profile run/gpt_block --runs 20")
    p.add_argument("dir", help="the program folder")
    p.add_argument("--reference", help="a KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    p.add_argument("--runs", type=int, default=20, help="profiled runs (default 20)")
    p.add_argument("--precision", "-p", default=None, choices=NAMES, help="the policy to judge at (default: the manifest's)")
    p.add_argument("--arch", help="build target (default: $STITCHCUDA_ARCH, else the manifest's)")

    p = add("wheel", "package a program folder as a wheel that runs without PyTorch", _wheel,
            "stitchcuda wheel run/gpt_block --name gpt_block --arch sm_90 --arch sm_80  "
            "# then: import gpt_block; m = gpt_block.load(); y = m(x)")
    p.add_argument("dir", help="a built program folder")
    p.add_argument("--name", help="the Python package name (default: the program's name)")
    p.add_argument("--arch", action="append", help="a target to include, repeatable (default: the folder's)")
    p.add_argument("--out", default="dist", help="folder for the wheels (default dist)")
    p.add_argument("--wheel-version", default="0.1.0", help="the program wheel's version (default 0.1.0)")

    p = add("bench", "run a suite: one worker per GPU, resumable, report.md / report.html with plots", _bench,
            "stitchcuda bench ../shared/kernelbench/dev.jsonl --precision tf32 --gpus 2 --out bench/dev")
    p.add_argument("suite", help="a .jsonl of KernelBench problems, or a folder of reference .py files")
    p.add_argument("--precision", "-p", default="fp32", choices=NAMES, help="precision policy (default fp32)")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--build", action="store_true", help="build_program then verify each problem (the default)")
    how.add_argument("--optimize", action="store_true", help="run the optimisation loop on each problem")
    p.add_argument("--budget", type=float, default=None, help="--optimize: budget per problem (seconds)")
    p.add_argument("--gpus", type=int, default=None, help="worker processes, one per GPU (default: every visible GPU)")
    p.add_argument("--out", "-o", default=None, help="results folder (default bench/<suite>-<precision>); "
                                                    "a rerun skips the problems already there")
    p.add_argument("--limit", type=int, default=None, help="only the first N problems")
    p.add_argument("--trials", type=int, default=5, help="verification trials per problem (default 5)")
    p.add_argument("--no-profile", action="store_true", help="skip the CUPTI profile of each program")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument("--only", action="append", help="only problems whose id contains this text (repeatable)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the problems as Ray tasks of one GPU each (pip install ray; "
                                                   "'auto', host:port, or 'local' for a new local instance)")
    p.add_argument("--solver", help=argparse.SUPPRESS)  # module:attribute of another solver (tests)

    p = add("cache", "list or clean the build cache", _cache, "stitchcuda cache clean --older-than 30")
    p.add_argument("action", choices=["list", "clean"])
    p.add_argument("--older-than", type=float, metavar="DAYS", help="clean: only entries older than this")
    p.add_argument("--failed", action="store_true", help="clean: only failed builds")
    p.add_argument("--program", help="clean: only this program's entries")

    add("doctor", "check this machine: driver, GPU, nvcc, cuBLAS, cuDNN, CUPTI, PyTorch, the LLM", _doctor,
        "stitchcuda doctor")

    from .rl.cli import register as _register_train   # its code lives with the RL modules

    _register_train(add)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    ui = UI(quiet=getattr(args, "quiet", False), json_mode=getattr(args, "json", False))
    try:
        return args.func(args, ui)
    except BaseException as e:  # noqa: BLE001 - every failure ends in one line and an exit code
        if isinstance(e, SystemExit):
            raise
        if errors.debug():
            raise
        f = errors.explain(e)
        ui.error(f.message)
        ui.result({"ok": False, "error": f.message, "exit_code": f.code})
        return f.code


if __name__ == "__main__":
    sys.exit(main())
