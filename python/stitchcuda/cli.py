"""The `stitchcuda` command."""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path


def _selfcheck(args: argparse.Namespace) -> int:
    """Check the install end to end: runtime, toolchain, a program built and (with a GPU) run."""
    import stitchcuda
    from stitchcuda import rt, toolchain

    ok = True

    def line(status: str, what: str, detail: str = "") -> None:
        print(f"  [{status:4s}] {what}" + (f": {detail}" if detail else ""), flush=True)

    print(f"stitchcuda {stitchcuda.__version__}, runtime {rt.version()}")
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
    print("selfcheck " + ("passed" if ok else "FAILED"))
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
    from math import erf

    ref = a.astype(np.float64) @ b
    ref = 0.5 * ref * (1 + np.vectorize(erf)(ref / np.sqrt(2)))
    err = float(np.abs(y - ref).max() / np.abs(ref).max())
    good = err < 1e-4
    line("ok" if good else "FAIL", "GEMM + fused GELU (fp32)", f"rel error {err:.1e}, first call {dt * 1e3:.1f} ms")
    return good


def _verify_options(args: argparse.Namespace, **extra):
    from stitchcuda.verifier.run import VerifyOptions

    return VerifyOptions(trials=args.trials, time=not args.no_time, profile=not args.no_profile,
                         compile=not args.no_compile, seed=args.seed, arch=args.arch,
                         command="stitchcuda " + " ".join(sys.argv[1:]), **extra)


def _input_error(e: Exception) -> int:
    print(f"stitchcuda: error: {e}", file=sys.stderr)
    return 2


def _verify(args: argparse.Namespace) -> int:
    """Verify a program folder; write report.json / report.md / timeline.png into it."""
    from stitchcuda.manifest import ManifestError
    from stitchcuda.verifier.problem import ProblemError
    from stitchcuda.verifier.run import VerifyEnvironmentError, verify_program

    if args.trials < 1:
        return _input_error(ValueError("--trials must be at least 1"))
    try:
        v = verify_program(args.dir, args.reference, _verify_options(args))
    except (ManifestError, ProblemError) as e:
        return _input_error(e)
    except VerifyEnvironmentError as e:
        print(f"stitchcuda: cannot verify here: {e}", file=sys.stderr)
        return 3
    r = v.report
    print(f"{r.program}: {v.result.verdict.summary()}")
    if r.timings is not None:
        t = r.timings
        parts = [f"{t.program.median_ms:.4g} ms"]
        for name, b in t.baselines():
            s = t.speedup(b)
            if s is not None:
                parts.append(f"{name.replace('at policy', r.precision)} {s:.2f}x")
        print("  time: " + "; ".join(parts))
    if r.phases:
        print("  cost: " + ", ".join(f"{p.name.split(' (')[0]} {p.seconds:.1f} s" for p in r.phases))
    if v.files is not None:
        print(f"  report: {v.files.markdown}")
    return 0 if v.result.ok else 1


def _profile(args: argparse.Namespace) -> int:
    """CUPTI-profile a program folder (no correctness trials); write profile.json into it."""
    import json

    from stitchcuda.fsutil import atomic_write_text
    from stitchcuda.manifest import ManifestError, load_program_dir
    from stitchcuda.verifier import serde
    from stitchcuda.verifier.problem import ProblemError
    from stitchcuda.verifier.profile import format_ns, summarise
    from stitchcuda.verifier.run import VerifyEnvironmentError, VerifyOptions, profile_program_dir

    try:
        opts = VerifyOptions(arch=args.arch, profile_runs=args.runs, command="stitchcuda " + " ".join(sys.argv[1:]))
        res = profile_program_dir(args.dir, args.reference, opts)
        manifest = load_program_dir(args.dir).manifest
    except (ManifestError, ProblemError) as e:
        return _input_error(e)
    except VerifyEnvironmentError as e:
        print(f"stitchcuda: cannot profile here: {e}", file=sys.stderr)
        return 3
    if res.verdict is not None:
        print(f"{manifest.name}: {res.verdict.summary()}")
        return 1
    summary = summarise(res.kernels, res.ceilings, manifest.precision)
    src = res.details.source if res.details else "?"
    print(f"{manifest.name}: {summary.launches} launches, {format_ns(summary.busy_ns)} busy ({src})")
    for k in summary.top(10):
        print(f"  {format_ns(k.total_ns):>10}  {k.share:5.0%}  x{k.calls:<4} {k.name[:70]}  {k.describe_bound()}")
    if res.details:
        for t in res.details.tasks:
            print(f"  task {t.task}: {format_ns(t.per_run_ns)} per run ({t.share:.0%}), {t.bound}")
    out = Path(args.dir) / "profile.json"
    atomic_write_text(out, json.dumps(serde.to_jsonable({"kernels": res.kernels, "details": res.details,
                                                          "ceilings": res.ceilings}), indent=1) + "\n")
    print(f"  written: {out}")
    return 0


def _add_verify_commands(sub) -> None:
    p = sub.add_parser("verify", help="verify a program folder: correctness, anti-hacking, timing, CUPTI profile")
    p.add_argument("dir", help="the program folder (manifest.json, program.cu, weights.safetensors)")
    p.add_argument("--reference", help="a KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    p.add_argument("--trials", type=int, default=5, help="random trials (default 5)")
    p.add_argument("--seed", type=int, default=1000, help="seed of the first trial (default 1000)")
    p.add_argument("--no-time", action="store_true", help="skip timing")
    p.add_argument("--no-profile", action="store_true", help="skip the CUPTI profile")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile baselines")
    p.add_argument("--arch", help="build target (default: $STITCHCUDA_ARCH, else the manifest's)")
    p.set_defaults(func=_verify)
    p = sub.add_parser("profile", help="CUPTI-profile a program folder (kernels, tasks, roofline)")
    p.add_argument("dir", help="the program folder")
    p.add_argument("--reference", help="a KernelBench-format file or kernelbench:LEVEL:ID (default: the manifest's)")
    p.add_argument("--runs", type=int, default=20, help="profiled runs (default 20)")
    p.add_argument("--arch", help="build target (default: $STITCHCUDA_ARCH, else the manifest's)")
    p.set_defaults(func=_profile)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchcuda", description="PyTorch reference -> verified CUDA program")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("selfcheck", help="check the install: runtime, nvcc, example program, GPU")
    p.add_argument("--arch", help="target architecture for the example build (default: the GPU's, else sm_90)")
    p.set_defaults(func=_selfcheck)
    _add_verify_commands(sub)
    from stitchcuda.pipeline import add_build_command

    add_build_command(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
