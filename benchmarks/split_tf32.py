"""The split-TF32 GEMM and convolution beside fp32 and TF32: error against float64 and speed.

For each size n: A, B drawn from N(0, 1) (and, with --scale-rows, rows of A scaled over six decades,
where one TF32 rounding costs the most), out = A @ B by the runtime at fp32 (SIMT), at tf32 (one
TF32 product), split TF32 (``rt.gemm_split_tf32``: three TF32 products as one GEMM over 3K) and split
bf16 (``rt.gemm_split_bf16``: three bf16 products as one GEMM), each against A @ B in float64 on the
GPU (max |error| / max |reference|); times are CUDA-event medians of 10 runs with the L2 flushed
before each, after warm-up (plans built and timed outside). Prints a Markdown table.

With --conv: the convolutions of a MobileNet V1 and a ResNet-50 (32 images of 224x224; bias and
ReLU), each at fp32 channels-first (where a raised convolution ran before), fp32 channels-last,
tf32 and split TF32 (``rt.conv(..., split_tf32=True)`` with STITCHCUDA_CONV_SPLIT=always: one TF32
convolution over three times the input channels, whatever the timing would choose), the last
three channels-last; errors against F.conv2d in float64 on the GPU. "split vs best fp32" is the
split path's own speed; the runtime takes it only where it beats fp32 channels-last.

    python benchmarks/split_tf32.py [--sizes 1024,2048,4096,8192] [--json out.jsonl]
    python benchmarks/split_tf32.py --conv [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (beside it: event_timing)
from event_timing import flushed_median_ms  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096,8192")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--scale-rows", action="store_true", help="rows of A over six decades")
    ap.add_argument("--json", help="append one line per size")
    ap.add_argument("--conv", action="store_true", help="convolutions of MobileNet V1 and ResNet-50")
    a = ap.parse_args(argv)
    if a.conv:
        return convs(a)
    import torch

    from stitchcuda import rt

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    flush = torch.empty(2 * torch.cuda.get_device_properties(dev).L2_cache_size, dtype=torch.uint8, device=dev)
    ways = {"fp32": lambda x, y, o: rt.gemm(x, y, o, policy="fp32", stream=stream),
            "tf32": lambda x, y, o: rt.gemm(x, y, o, policy="tf32", stream=stream),
            "split tf32": lambda x, y, o: rt.gemm_split_tf32(x, y, o, stream=stream),
            "split bf16": lambda x, y, o: rt.gemm_split_bf16(x, y, o, stream=stream)}
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    print("| n | fp32 error | tf32 error | split tf32 error | split bf16 error | fp32 ms | tf32 ms | split tf32 ms | "
          "split bf16 ms | split bf16 vs tf32 time | split bf16 vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n in (int(s) for s in a.sizes.split(",")):
        g = torch.Generator(device=dev).manual_seed(n)
        x = torch.randn(n, n, device=dev, generator=g)
        if a.scale_rows:
            x *= torch.logspace(-3, 3, n, device=dev).unsqueeze(1)
        y = torch.randn(n, n, device=dev, generator=g)
        ref = x.double() @ y.double()
        scale = ref.abs().max().item()
        out = torch.empty(n, n, device=dev)
        row = {"n": n}
        for name, fn in ways.items():
            for _ in range(3):
                fn(x, y, out)
            torch.cuda.synchronize()
            row[f"{name} error"] = (out.double() - ref).abs().max().item() / scale
            row[f"{name} ms"] = flushed_median_ms(lambda: fn(x, y, out), flush, a.runs)
        _emit(a, row, f"| {n} | {row['fp32 error']:.2e} | {row['tf32 error']:.2e} | {row['split tf32 error']:.2e} | "
                      f"{row['split bf16 error']:.2e} | {row['fp32 ms']:.3f} | {row['tf32 ms']:.3f} | "
                      f"{row['split tf32 ms']:.3f} | {row['split bf16 ms']:.3f} | "
                      f"{row['split bf16 ms'] / row['tf32 ms']:.2f}x | {row['fp32 ms'] / row['split bf16 ms']:.2f}x |")
        del x, y, ref, out
        torch.cuda.empty_cache()
    return 0


def _emit(a, row: dict, line: str) -> None:
    """One table row printed, and its figures appended to ``--json`` when given."""
    print(line, flush=True)
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(row) + "\n")


#: (name, in channels, out channels, input size, kernel, stride, padding), 32 images each.
CONVS = [("mnv1 stem 3x3/2", 3, 32, 225, 3, 2, 0), ("mnv1 1x1 32-64 @112", 32, 64, 112, 1, 1, 0),
         ("mnv1 1x1 64-128 @56", 64, 128, 56, 1, 1, 0), ("mnv1 1x1 128-128 @56", 128, 128, 56, 1, 1, 0),
         ("mnv1 1x1 256-256 @28", 256, 256, 28, 1, 1, 0), ("mnv1 1x1 512-512 @14", 512, 512, 14, 1, 1, 0),
         ("mnv1 1x1 1024-1024 @7", 1024, 1024, 7, 1, 1, 0), ("r50 stem 7x7/2", 3, 64, 224, 7, 2, 3),
         ("r50 3x3 64 @56", 64, 64, 56, 3, 1, 1), ("r50 1x1 256-64 @56", 256, 64, 56, 1, 1, 0),
         ("r50 3x3 128 @28", 128, 128, 28, 3, 1, 1), ("r50 3x3 256 @14", 256, 256, 14, 3, 1, 1),
         ("r50 3x3 512 @7", 512, 512, 7, 3, 1, 1)]


def convs(a) -> int:
    import torch
    import torch.nn.functional as F

    from stitchcuda import rt

    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    flush = torch.empty(2 * torch.cuda.get_device_properties(dev).L2_cache_size, dtype=torch.uint8, device=dev)
    cl = torch.channels_last
    ways = {"fp32 NCHW": ("fp32", False, False), "fp32 NHWC": ("fp32", True, False), "tf32": ("tf32", True, False),
            "split": ("fp32", True, True)}
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    print("| convolution | GFLOP | fp32 NCHW err | tf32 err | split err | fp32 NCHW ms | fp32 NHWC ms | tf32 ms | "
          "split ms | split vs best fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, cin, cout, size, k, stride, pad in CONVS:
        g = torch.Generator(device=dev).manual_seed(cin * 1000 + cout + size)
        x = torch.randn(32, cin, size, size, device=dev, generator=g)
        w = torch.randn(cout, cin, k, k, device=dev, generator=g) / (cin * k * k) ** 0.5
        b = torch.randn(cout, device=dev, generator=g)
        ref = F.relu(F.conv2d(x.double(), w.double(), b.double(), stride=stride, padding=pad))
        scale = ref.abs().max().item()
        row = {"conv": name, "gflop": 2.0 * ref.numel() * cin * k * k / 1e9}
        for way, (policy, nhwc, split) in ways.items():
            xs, ws = (x.contiguous(memory_format=cl), w.contiguous(memory_format=cl)) if nhwc else (x, w)
            out = torch.empty_like(ref, dtype=torch.float32, memory_format=cl if nhwc else torch.contiguous_format)

            def fn():
                rt.conv(xs, ws, b, stride=stride, padding=pad, policy=policy, activation="relu", channels_last=nhwc,
                        out=out, split_tf32=split, stream=stream)
            if split:
                os.environ["STITCHCUDA_CONV_SPLIT"] = "always"
            else:
                os.environ.pop("STITCHCUDA_CONV_SPLIT", None)
            for _ in range(3):
                fn()
            torch.cuda.synchronize()
            row[f"{way} error"] = (out.double() - ref).abs().max().item() / scale
            row[f"{way} ms"] = flushed_median_ms(fn, flush, a.runs)
            del out
        best32 = min(row["fp32 NCHW ms"], row["fp32 NHWC ms"])
        _emit(a, row, f"| {name} | {row['gflop']:.2f} | {row['fp32 NCHW error']:.1e} | {row['tf32 error']:.1e} | "
                      f"{row['split error']:.1e} | {row['fp32 NCHW ms']:.3f} | {row['fp32 NHWC ms']:.3f} | "
                      f"{row['tf32 ms']:.3f} | {row['split ms']:.3f} | {best32 / row['split ms']:.2f}x |")
        del x, w, ref
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
