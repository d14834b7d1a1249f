"""Time the CUDA templates (through the GPU tests' harness .so files) against PyTorch.

    python benchmarks/bench_templates.py [--quick]

CUDA events on torch's current stream, 10 warm-up runs, median (and min-max) of the timed runs;
inputs stay in L2 when they fit (no flush), so short kernels read as their L2-resident speed.
Prints one markdown table: kernel, shape, our time, PyTorch's time, ratio, and the achieved
rate (TFLOP/s for attention, GB/s of compulsory traffic for the memory-bound kernels).
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu"))
import nvcc_util  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (beside it: event_timing)
from event_timing import event_times  # noqa: E402

DT = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2}
NAMES = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}


def timeit(fn, reps: int) -> tuple[float, float, float]:
    """Median, min, max milliseconds of fn() over reps runs (after 10 untimed, no L2 flush)."""
    times = event_times(fn, reps, warmup=10)
    return statistics.median(times), min(times), max(times)


def i64(vals):
    vals = list(vals)
    return (ctypes.c_int64 * len(vals))(*vals)


def stream() -> int:
    return torch.cuda.current_stream().cuda_stream


def check(rc: int) -> None:
    if rc != 0:
        raise RuntimeError(f"launch failed: cudaError_t {rc}")


ROWS: list[str] = []


def row(kernel, shape, ours, theirs, rate_ours, rate_theirs, unit):
    ROWS.append(
        f"| {kernel} | {shape} | {ours[0]:.3f} ({ours[1]:.3f}-{ours[2]:.3f}) | {theirs[0]:.3f} | "
        f"{theirs[0] / ours[0]:.2f}x | {rate_ours:.0f} | {rate_theirs:.0f} {unit} |")


def bench_attention(lib, reps, quick):
    cfgs = [(4, 16, 2048, 64), (4, 16, 2048, 128), (1, 16, 8192, 128)]
    if quick:
        cfgs = cfgs[:2]
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for (B, H, L, D) in cfgs:
            if dtype == torch.float32 and L > 2048:
                continue
            # fp32 storage: the exact SIMT kernel, split TF32 (fp32-grade, as PyTorch's own fp32
            # attention computes) and TF32 (attention_harness.cu's modes 0, 3, 2)
            modes = [(0, ""), (3, " split-tf32"), (2, " tf32")] if dtype == torch.float32 else [(0, "")]
            for causal, (mode, label) in itertools.product((False, True), modes):
                q, k, v = (torch.randn(B, H, L, D, device="cuda", dtype=dtype) for _ in range(3))
                o = torch.empty_like(q)
                args = (DT[dtype], D, mode, q.data_ptr(), i64(q.stride()), k.data_ptr(),
                        i64(k.stride()), v.data_ptr(), i64(v.stride()), o.data_ptr(),
                        i64(o.stride()), B, H, L, L, 1, 1.0 / math.sqrt(D), int(causal), 0, 0,
                        None, i64((0, 0, 0, 0)))
                check(lib.attention(*args, stream()))
                ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                err = (o.float() - ref.float()).abs().max().item()
                ours = timeit(lambda: lib.attention(*args, stream()), reps)
                theirs = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)
                flops = 4 * B * H * L * L * D * (0.5 if causal else 1.0)
                row(f"attention {NAMES[dtype]}{label}{' causal' if causal else ''} (max err {err:.1e})",
                    f"B{B} H{H} L{L} D{D}", ours, theirs, flops / ours[0] / 1e9,
                    flops / theirs[0] / 1e9, "TFLOP/s")


def bench_rows(lib, reps):
    ops = {"softmax": (0, lambda x: torch.softmax(x, -1)),
           "layer_norm": (2, None),
           "sum": (4, lambda x: x.sum(-1))}
    for dtype in (torch.float32, torch.bfloat16):
        for rows_, cols in [(32768, 1024), (8192, 4096), (2048, 20000), (16, 1 << 20)]:
            x = torch.randn(rows_, cols, device="cuda", dtype=dtype)
            w = torch.randn(cols, device="cuda", dtype=dtype)
            b = torch.randn(cols, device="cuda", dtype=dtype)
            for name, (code, ref_fn) in ops.items():
                writes = name != "sum"
                out = torch.empty_like(x) if writes else torch.empty(rows_, device="cuda", dtype=dtype)
                ldo = cols if writes else 1
                wp, bp = (w.data_ptr(), b.data_ptr()) if name == "layer_norm" else (None, None)
                args = (code, DT[dtype], x.data_ptr(), cols, out.data_ptr(), ldo, wp, bp, rows_,
                        cols, 1e-5, 0, 0)
                check(lib.row_reduce(*args, stream()))
                if ref_fn is None:
                    ref_fn = lambda t: F.layer_norm(t, (cols,), w, b, 1e-5)  # noqa: E731
                ours = timeit(lambda: lib.row_reduce(*args, stream()), reps)
                theirs = timeit(lambda: ref_fn(x), reps)
                nbytes = x.numel() * x.element_size() * (2 if writes else 1)
                row(f"{name} {NAMES[dtype]}", f"{rows_}x{cols}", ours, theirs,
                    nbytes / ours[0] / 1e6, nbytes / theirs[0] / 1e6, "GB/s")


def bench_axis(lib, reps):
    for dtype in (torch.float32, torch.bfloat16):
        for shape in [(64, 1024, 4096), (1, 65536, 1024), (4096, 256, 16)]:
            x = torch.randn(*shape, device="cuda", dtype=dtype)
            out = torch.empty(shape[0], shape[2], device="cuda", dtype=dtype)
            so, sr, si = x.stride()
            nws = lib.reduce_axis_ws_floats(DT[dtype], x.data_ptr(), *shape, so, sr, si)
            ws = torch.empty(max(nws, 1), device="cuda")
            args = (1, DT[dtype], x.data_ptr(), *shape, so, sr, si, out.data_ptr(), shape[2], 1,
                    ws.data_ptr(), nws)
            check(lib.reduce_axis(*args, stream()))
            ours = timeit(lambda: lib.reduce_axis(*args, stream()), reps)
            theirs = timeit(lambda: x.mean(1), reps)
            nbytes = x.numel() * x.element_size()
            row(f"mean(dim=1) {NAMES[dtype]}", str(shape), ours, theirs, nbytes / ours[0] / 1e6,
                nbytes / theirs[0] / 1e6, "GB/s")


def bench_elementwise(lib, reps):
    for dtype in (torch.float32, torch.bfloat16):
        n = 1 << 26
        for name, sb in [("add contiguous", (n,)), ("add row-broadcast", (4096,))]:
            a = torch.randn(n, device="cuda", dtype=dtype)
            shape = (n // 4096, 4096) if sb == (4096,) else (n,)
            a = a.view(shape)
            b = torch.randn(*sb, device="cuda", dtype=dtype)
            out = torch.empty(shape, device="cuda", dtype=dtype)
            args = (DT[dtype], a.data_ptr(), b.data_ptr(), out.data_ptr(), len(shape),
                    i64(shape), i64(out.stride()), i64(a.stride()), i64(b.expand(shape).stride()))
            check(lib.ew_add(*args, stream()))
            ours = timeit(lambda: lib.ew_add(*args, stream()), reps)
            theirs = timeit(lambda: torch.add(a, b), reps)
            nbytes = (a.numel() * 2 + b.numel()) * a.element_size()
            row(f"{name} {NAMES[dtype]}", str(shape), ours, theirs, nbytes / ours[0] / 1e6,
                nbytes / theirs[0] / 1e6, "GB/s")
        # the layout changes around convolutions: NCHW -> NHWC of 8 / 64 channels, NHWC -> NCHW
        # of 8 / 32 / 64 channels (as (N, H, W, C) permuted to (N, C, H, W))
        for shape, perm in [((8192, 8192), (1, 0)), ((64, 512, 1024), (0, 2, 1)),
                            ((32, 3, 512, 512), (0, 2, 3, 1)), ((64, 8, 256, 256), (0, 2, 3, 1)),
                            ((32, 64, 128, 128), (0, 2, 3, 1)), ((64, 256, 256, 8), (0, 3, 1, 2)),
                            ((32, 256, 256, 32), (0, 3, 1, 2)), ((32, 128, 128, 64), (0, 3, 1, 2))]:
            x = torch.randn(*shape, device="cuda", dtype=dtype)
            out = torch.empty(tuple(shape[p] for p in perm), device="cuda", dtype=dtype)
            pa = (ctypes.c_int * len(perm))(*perm)
            args = (DT[dtype], x.data_ptr(), len(shape), i64(shape), i64(x.stride()), pa,
                    out.data_ptr())
            check(lib.permute(*args, stream()))
            ours = timeit(lambda: lib.permute(*args, stream()), reps)
            theirs = timeit(lambda: x.permute(*perm).contiguous(), reps)
            nbytes = 2 * x.numel() * x.element_size()
            row(f"permute{perm} {NAMES[dtype]}", str(shape), ours, theirs,
                nbytes / ours[0] / 1e6, nbytes / theirs[0] / 1e6, "GB/s")
        # a norm's apply after a channels-last convolution: NHWC in, a per-channel operand, NCHW out
        x = torch.randn(128, 126, 126, 64, device="cuda", dtype=dtype).permute(0, 3, 1, 2)
        shape = tuple(x.shape)
        bias = torch.randn(64, 1, 1, device="cuda", dtype=dtype)
        out = torch.empty(shape, device="cuda", dtype=dtype)
        args = (DT[dtype], x.data_ptr(), bias.data_ptr(), out.data_ptr(), 4, i64(shape), i64(out.stride()),
                i64(x.stride()), i64(bias.expand(shape).stride()))
        check(lib.ew_add(*args, stream()))
        ours = timeit(lambda: lib.ew_add(*args, stream()), reps)
        theirs = timeit(lambda: torch.add(x, bias, out=out), reps)
        nbytes = 2 * x.numel() * x.element_size()
        row(f"add per-channel NHWC->NCHW {NAMES[dtype]}", str(shape), ours, theirs, nbytes / ours[0] / 1e6,
            nbytes / theirs[0] / 1e6, "GB/s")
        # a join along channels in channels-last memory: each part into its channel slice
        parts = [torch.randn(64, 64, 126, 126, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
                 for _ in range(2)]
        out = torch.empty(64, 128, 126, 126, device="cuda", dtype=dtype).to(memory_format=torch.channels_last)
        calls = []
        for i, x in enumerate(parts):
            dst = out[:, 64 * i:64 * (i + 1)]
            calls.append((DT[dtype], DT[dtype], x.data_ptr(), dst.data_ptr(), 4, i64(x.shape), i64(x.stride()),
                          i64(dst.stride())))

        def cat_ours():
            for c in calls:
                check(lib.strided_copy(*c, stream()))
        ours = timeit(cat_ours, reps)
        theirs = timeit(lambda: torch.cat(parts, dim=1), reps)
        nbytes = 4 * parts[0].numel() * parts[0].element_size()
        row(f"cat channels-last {NAMES[dtype]}", "2 x (64, 64, 126, 126)", ours, theirs,
            nbytes / ours[0] / 1e6, nbytes / theirs[0] / 1e6, "GB/s")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--only", choices=["attention", "rows", "axis", "elementwise"], action="append",
                    help="time only these families (repeatable; default all)")
    ns = ap.parse_args()
    only = set(ns.only or ["attention", "rows", "axis", "elementwise"])
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    need = {"attention": "attention_harness", "rows": "reduce_harness", "axis": "reduce_harness",
            "elementwise": "elementwise_harness"}
    libs = {n: nvcc_util.load_harness(n, arch) for n in {need[f] for f in only}}
    if "attention" in only:
        bench_attention(libs["attention_harness"], ns.reps, ns.quick)
    if "rows" in only:
        bench_rows(libs["reduce_harness"], ns.reps)
    if "axis" in only:
        bench_axis(libs["reduce_harness"], ns.reps)
    if "elementwise" in only:
        bench_elementwise(libs["elementwise_harness"], ns.reps)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, {arch}")
    print("| kernel | shape | ours ms (min-max) | torch ms | torch/ours | ours | torch |")
    print("|---|---|---|---|---|---|---|")
    print("\n".join(ROWS))


if __name__ == "__main__":
    main()
