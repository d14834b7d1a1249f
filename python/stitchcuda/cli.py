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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="stitchcuda", description="PyTorch reference -> verified CUDA program")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("selfcheck", help="check the install: runtime, nvcc, example program, GPU")
    p.add_argument("--arch", help="target architecture for the example build (default: the GPU's, else sm_90)")
    p.set_defaults(func=_selfcheck)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
