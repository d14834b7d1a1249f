"""What each ``stitchcuda`` command does, once its arguments are parsed and checked.

:mod:`stitchcuda.cli` declares the commands and their arguments and calls, for each, its
``check_*`` (what the values name: files, folders, a model, a server; before the machine is asked
anything) and then the command itself, with a :class:`~.ui.UI` for its progress and tables. A
command returns its exit code (:mod:`.errors`); an input it refuses is a
:class:`~.errors.CommandError` of one line.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from . import checks, errors
from .errors import CommandError
from .ui import UI

#: An H100 / A100 80 GB: "a typical one" when no GPU is visible (build's memory warning).
DEFAULT_TYPICAL_GPU_BYTES = 80 * 2**30


# ---------------------------------------------------------------------- selfcheck


def selfcheck(args: argparse.Namespace, ui: UI) -> int:
    """Check the install end to end: runtime, toolchain, a program built and (with a GPU) run."""
    from ..paths import PACKAGE_DIR, version
    from .. import _rt as rt
    from .. import toolchain

    ok = True

    def line(status: str, what: str, detail: str = "") -> None:
        ui.line(f"  [{status:4s}] {what}" + (f": {detail}" if detail else ""))

    ui.line(f"stitchcuda {version()}, runtime {rt.version()}")
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
            res = toolchain.compile_program(PACKAGE_DIR / "examples" / "example_mlp.cu", so,
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

    from .. import _rt as rt

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

    from .. import _rt as rt

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


def check_build(args: argparse.Namespace) -> None:
    checks.reference(args.reference)
    checks.out_folder(args.out)
    if getattr(args, "tune_shapes", None) and not args.dynamic:
        raise CommandError("--tune-shapes names sizes of dynamic dimensions: give each its range with --dynamic too")
    if getattr(args, "dynamic", None):
        from ..dynamic import DynamicSpecError, parse_dynamic, parse_tune_shapes

        try:
            parse_tune_shapes(args.tune_shapes or (), parse_dynamic(args.dynamic))
        except DynamicSpecError as e:
            raise CommandError(str(e)) from None
    if not args.no_compile:
        checks.nvcc_arch(args.arch)


def build(args: argparse.Namespace, ui: UI) -> int:
    """reference -> program folder: capture, plan, generate CUDA, compile."""
    from .. import manifest as mf
    from ..pipeline import build_program

    with ui.step("build") as step:
        if getattr(args, "dynamic", None):
            from ..dynamic import build_dynamic

            o = build_dynamic(args.reference, args.dynamic, precision=args.precision, out=args.out, arch=args.arch,
                              seed=args.seed, compile=not args.no_compile, progress=step,
                              tune_shapes=args.tune_shapes or ())
        else:
            o = build_program(args.reference, precision=args.precision, out=args.out, arch=args.arch,
                              seed=args.seed, compile=not args.no_compile, quiet=True, progress=step)
    m = o.manifest
    ui.table(f"plan: {m.name} ({m.precision}, {m.arch}), {len(m.tasks)} task(s)",
             ["task", "strategy", "covers", "MFLOP", "MB moved"],
             [[t.name, t.strategy, ", ".join(t.covers), f"{t.flops / 1e6:,.1f}", f"{t.bytes / 1e6:,.2f}"]
              for t in m.tasks], justify=["left", "left", "left", "right", "right"])
    b = o.build
    data = {"program": m.name, "precision": m.precision, "arch": m.arch, "seconds": o.seconds,
            "tasks": [t.to_dict() for t in m.tasks], **({"state": [st.to_dict() for st in m.state]} if m.state else {})}
    if b is not None and not b.ok:
        from ..paths import cache_dir

        first = b.message
        where = f"; nvcc's output: {cache_dir() / b.entry / 'build.json'}" if b.entry else ""
        ui.error(f"{m.name}: the generated program does not compile ({first}){where}; nothing was written")
        if b.compile is not None and not ui.quiet:
            sys.stderr.write("".join("    " + ln + "\n" for ln in b.compile.output.strip().splitlines()[:20]))
        ui.result({**data, "ok": False, "error": first})
        return errors.FAILED
    _warn_memory(m, ui)
    if m.dynamic is not None:
        from ..plan.specs import fmt_bytes

        ui.line("dynamic: " + "; ".join(
            f"{d.name} {d.min}..{d.max}" + (f" (multiples of {d.multiple_of})" if d.multiple_of > 1 else "")
            + " at " + ", ".join(f"{i}[{a}]" for i, a in d.places)
            + (f", tuned at {', '.join(map(str, d.tuned))}" if d.tuned else "") for d in m.dynamic.dims)
            + f"; outputs {', '.join(str(list(s)) for s in m.dynamic.outputs)}; at the largest shape "
            f"{fmt_bytes(m.dynamic.arena_bytes)} of intermediates a stream and "
            f"{fmt_bytes(sum(_nbytes(t) for t in m.weights))} of weights on the device")
    how = "not compiled" if b is None else ("from the build cache" if b.cached else f"compiled in {b.seconds:.1f} s")
    ui.line(f"program {m.name} written to {o.directory} (library {how}; total {o.seconds.get('total', 0):.1f} s)")
    for st in m.state:
        ui.line(f"state kept in {st.attribute} between calls: input {st.input} before the call, output {st.output} "
                "after it (the caller carries it from call to call)")
    for r in m.lifted_random:  # a program draws no numbers: its caller does, as the reference did
        law = ", ".join(f"{k}={v}" for k, v in r.params)
        ui.line(f"random draws ({r.distribution or r.op}{': ' + law if law else ''}) are the input {r.input}, "
                f"drawn by the caller for each call{' (' + r.source + ')' if r.source else ''}")
    if b is not None:
        ui.line(f"next: stitchcuda verify {o.directory}")
    ui.result({**data, "ok": True, "directory": str(o.directory),
               "library": str(o.directory / mf.LIBRARY_FILE) if b is not None else None,
               "cached": bool(b and b.cached)})
    return errors.OK


def _warn_memory(m, ui: UI) -> None:
    """Say so when the program's inputs alone exceed the device memory (this GPU's, else a typical 80 GB one)."""
    inputs = sum(_nbytes(t) for t in m.inputs)
    need = inputs + sum(_nbytes(t) for t in m.weights)
    have, which = DEFAULT_TYPICAL_GPU_BYTES, "a typical 80 GB GPU's"
    try:
        from .. import _rt as rt

        if rt.device_count() > 0:
            have, which = int(rt.device_info(0)["memory_bytes"]), "this GPU's"
    except Exception:  # noqa: BLE001 - no driver: compare with the typical one
        pass
    if inputs > have:
        ui.warn(f"the inputs alone take {_size(inputs)}, more than {which} {_size(have)}: "
                "the program cannot run there; shrink get_inputs()")
    elif need > have:
        ui.warn(f"inputs and weights take {_size(need)}, more than {which} {_size(have)}: "
                "the program cannot run there")


def _nbytes(t) -> int:
    from ..dtypes import get as dtype

    n = 1
    for d in t.shape:
        n *= int(d)
    return n * dtype(t.dtype).size


def _size(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if b < 1024 or unit == "PiB":
            return f"{b:.0f} {unit}" if unit == "B" else f"{b:.1f} {unit}"
        b /= 1024
    return f"{b:.1f} PiB"


# ---------------------------------------------------------------------- optimize and runs


def check_optimize(args: argparse.Namespace) -> None:
    import os

    from ..llm.server import check_llm_arg

    if args.reference is None and not args.resume:
        raise CommandError("give a reference (FILE or kernelbench:LEVEL:ID), or --resume RUN")
    if args.reference is not None:
        checks.reference(args.reference)
    args.llm = args.llm or os.environ.get("STITCHCUDA_LLM") or None
    if args.llm is not None:
        check_llm_arg(args.llm)
    out = args.resume if isinstance(args.resume, str) else args.out
    if args.resume and out is None:
        raise CommandError("--resume needs the run folder: --resume RUN (or --out RUN --resume)")
    if args.resume:
        from ..workflow.runs import resolve

        resolve(out).asked()   # a folder that is not a run: RunError, exit 2
    elif out is not None:
        checks.out_folder(out)
        if (Path(out) / "run.json").is_file():
            raise CommandError(f"--out {out}: already holds a run; resume it (--resume {out}) or choose another --out")
    checks.nvcc_arch(args.arch)


def optimize(args: argparse.Namespace, ui: UI) -> int:
    """The loop: plan -> code -> verify -> route until the budget ends; the best program in <run>/best."""
    from ..workflow import optimize
    from ..workflow.runs import RunError

    llm = args.llm
    out = args.resume if isinstance(args.resume, str) else args.out
    from ..pipeline import need_torch

    need_torch("optimize")
    if llm is not None:
        from ..llm.server import check_llm_ready

        llm = check_llm_ready(llm)
    if not _has_gpu():
        raise CommandError("optimize verifies every candidate on a CUDA GPU, and this machine has none "
                           "(stitchcuda doctor says what it has); stitchcuda build works without one",
                           errors.ENVIRONMENT)
    try:
        with ui.step("optimize") as step:
            r = optimize(args.reference, precision=args.precision, budget=args.budget, iterations=args.iterations,
                         gpu_budget=args.gpu_budget, llm=llm, out=out, resume=bool(args.resume), arch=args.arch,
                         progress=step)
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
        if st.finished.startswith("cannot verify on this machine"):
            ui.error(f"{st.finished}; see {r.markdown}")
            return errors.ENVIRONMENT
        if st.set_aside:
            ui.error(f"no candidate passed its final verification ({', '.join(c for c, _ in st.set_aside)} set "
                     f"aside); see {r.markdown}")
            return errors.FAILED
        ui.error(f"no candidate verified ({st.finished}); see {r.markdown}")
        return errors.FAILED
    ui.line(f"best: {best.id} ({best.proposer}) {best.ms:.4g} ms -> {r.best}")
    return errors.OK


def _has_gpu() -> bool:
    from ..device import has_gpu

    try:
        return has_gpu()
    except Exception:  # noqa: BLE001 - a driver that cannot even count devices: none usable
        return False


def runs(args: argparse.Namespace, ui: UI) -> int:
    """list | show RUN | diff A B (A, B: RUN for its best, or RUN:CANDIDATE)."""
    from ..workflow import runs as R
    from ..workflow.report import render

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
    from ..verifier.verification import VerifyOptions

    return VerifyOptions(trials=args.trials, time=not args.no_time, profile=not args.no_profile,
                         compile=not args.no_compile, autotune="max-autotune" in (getattr(args, "baselines", None) or ()),
                         seed=args.seed, arch=args.arch, precision=args.precision,
                         at=tuple(getattr(args, "at", None) or ()), between=getattr(args, "between", 3),
                         command="stitchcuda " + " ".join(sys.argv[1:]), **extra)


def check_program_command(args: argparse.Namespace) -> None:
    """verify and profile: a program folder, a reference when one is named, a target nvcc builds."""
    checks.program_dir(args.dir)
    if args.reference is not None:
        checks.reference(args.reference, "--reference")
    checks.nvcc_arch(args.arch)


def verify(args: argparse.Namespace, ui: UI) -> int:
    """Verify a program folder; write report.json / report.md / timeline.png into it."""
    from ..verifier.verification import VerifyEnvironmentError, verify_program

    from ..pipeline import need_torch

    need_torch("verify")
    with ui.step("verify") as step:
        try:
            v = verify_program(args.dir, args.reference, _verify_options(args, progress=step))
        except VerifyEnvironmentError as e:
            part = e.verification.files.markdown if e.verification is not None and e.verification.files else None
            raise CommandError(f"cannot verify here: {e}" + (f" (partial report: {part})" if part else ""),
                               errors.ENVIRONMENT) from None
    r = v.report
    ui.line(f"{r.program}: {v.result.verdict.summary()}")
    hint = precision_hint(r)
    if hint:
        ui.line(hint)
    if r.shapes:
        ui.line(f"judged at {'; '.join(r.shapes)} (the report's trials and timing are the last one's)")
    if r.phases:
        ui.table(None, ["phase", "seconds"], [[f"· {p.name}" if p.part_of else p.name, f"{p.seconds:.1f}"]
                                              for p in r.phases], justify=["left", "right"])
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


def precision_hint(report) -> str | None:
    """For a wrong answer under a reduced policy where PyTorch's own arithmetic at that policy misses
    the tolerance on the same inputs too (the Verifier's note): the policy cannot meet it here, so
    the way on is precision, not a bug hunt. None otherwise."""
    from ..verifier.run.session import policy_misses_too

    if report.result.kind != "wrong_answer" or report.details is None:
        return None
    note = next((n for n in report.details.correctness_notes if policy_misses_too(n)), None)
    if note is None:
        return None
    return (f"{note}. {report.precision} itself misses the tolerance here: `stitchcuda optimize` raises only "
            "the layers that need it to fp32 (or build with --precision fp32)")


def profile(args: argparse.Namespace, ui: UI) -> int:
    """CUPTI-profile a program folder (no correctness trials); write profile.json into it."""
    import json

    from ..fsutil import atomic_write_text
    from ..manifest import load_program_dir
    from ..verifier import serde
    from ..verifier.report.profile import format_ns, summarise
    from ..verifier.verification import VerifyEnvironmentError, VerifyOptions, profile_program_dir

    from ..pipeline import need_torch

    need_torch("profile")
    with ui.step("profile") as step:
        try:
            opts = VerifyOptions(arch=args.arch, profile_runs=args.runs, precision=args.precision,
                                 command="stitchcuda " + " ".join(sys.argv[1:]), progress=step)
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


def check_wheel(args: argparse.Namespace) -> None:
    from .wheel import check_name, check_verified, check_version

    checks.program_dir(args.dir)
    if args.name is not None:
        check_name(args.name)
    check_version(args.wheel_version)
    checks.out_folder(args.out)
    for a in args.arch or ():
        checks.nvcc_arch(a)
    check_verified(args.dir, unverified=args.unverified)


def wheel(args: argparse.Namespace, ui: UI) -> int:
    from .wheel import make_wheels

    if args.unverified:
        ui.warn(f"{args.dir}: packed without a passed verification (--unverified); the wheel's metadata says so")
    with ui.step("wheel") as step:
        w = make_wheels(args.dir, name=args.name, archs=args.arch, out=args.out, version=args.wheel_version,
                        progress=step, unverified=args.unverified)
    for p in (w.program, w.runtime):
        ui.line(f"wrote {p} ({p.stat().st_size / 1e6:.1f} MB)")
    ui.line(f"install: pip install {w.program} {w.runtime}")
    ui.line(f"use:     import {w.name}; m = {w.name}.load(); y = m(x)   # NumPy, CuPy or PyTorch arrays")
    ui.result({"name": w.name, "program_wheel": str(w.program), "runtime_wheel": str(w.runtime),
               "archs": list(w.archs)})
    return errors.OK


def check_bench(args: argparse.Namespace) -> None:
    from . import bench

    if args.budget is not None and not args.optimize:
        raise CommandError("--budget is the --optimize budget per problem; add --optimize (or drop --budget)")
    bench.load_suite(args.suite)          # SuiteError: exit 2, nothing written
    checks.out_folder(args.out)
    if args.gpus is not None and not args.ray and not args.solver:
        seen = bench.visible_gpus()
        if seen and args.gpus > len(seen):
            raise CommandError(f"--gpus {args.gpus}: only {len(seen)} GPU(s) visible ({','.join(seen)})")


def bench(args: argparse.Namespace, ui: UI) -> int:
    from . import bench

    if not args.solver and not args.ray:
        from ..pipeline import need_torch

        need_torch("bench")
        if not _has_gpu():
            raise CommandError("bench verifies every problem on a CUDA GPU, and this machine has none "
                               "(stitchcuda doctor says what it has)", errors.ENVIRONMENT)
    mode = "optimize" if args.optimize else "build"
    opts = bench.BenchOptions(precision=args.precision, mode=mode, budget=args.budget, gpus=args.gpus,
                              per_gpu=args.per_gpu,
                              limit=args.limit, ray=args.ray, only=tuple(args.only or ()), solver=args.solver,
                              failed_in=args.failed_in,
                              trials=args.trials, profile=not args.no_profile, compile=not args.no_compile,
                              autotune="max-autotune" in (args.baselines or ()), sanitizer=not args.no_sanitizer)
    with ui.live() as show:
        summary = bench.run_suite(args.suite, args.out, opts, log=lambda text: (show(None), ui.info(text)),
                                  stage=lambda pid, text: show(f"{pid}: {text}"))
    ui.table(f"{summary.suite}: {summary.total} problem(s), {summary.precision}",
             ["", "value"], summary.rows(), justify=["left", "right"])
    for note in summary.notes:
        ui.info(note)
    ui.line(f"report: {summary.markdown}  {summary.html}")
    ui.result(summary.to_dict())
    return errors.OK


def check_cache(args: argparse.Namespace) -> None:
    from ..paths import cache_dir

    root = cache_dir()
    if root.exists() and not root.is_dir():
        raise CommandError(f"the build cache {root} (STITCHCUDA_CACHE) is a file, not a folder; "
                           "point STITCHCUDA_CACHE at a folder (nothing was removed)")
    blocker = next((a for a in root.absolute().parents if a.exists() and not a.is_dir()), None)
    if blocker is not None:
        raise CommandError(f"the build cache {root} (STITCHCUDA_CACHE) is under {blocker}, a file; "
                           "point STITCHCUDA_CACHE at a folder (nothing was removed)")
    if args.action == "list" and (args.older_than is not None or args.failed or args.program is not None):
        raise CommandError("--older-than, --failed and --program choose what cache clean removes; cache list takes none")
    if args.program is not None and not args.program.strip():
        raise CommandError("--program: give a program name (stitchcuda cache list shows them)")


def cache(args: argparse.Namespace, ui: UI) -> int:
    from .. import build as B
    from ..paths import cache_dir

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


def doctor(args: argparse.Namespace, ui: UI) -> int:
    from .doctor import run_checks

    checks = run_checks()
    ui.table("stitchcuda doctor", ["", "check", "found", "fix"],
             [[c.mark, c.name, c.detail, c.fix] for c in checks])
    bad = [c for c in checks if c.status == "missing" and c.needed_for == "all"]
    ui.result({"checks": [c.to_dict() for c in checks], "ok": not bad})
    return errors.ENVIRONMENT if bad else errors.OK


# ---------------------------------------------------------------------- the parser
