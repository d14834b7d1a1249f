"""The split-TF32 GEMM beside fp32 and TF32: error against float64 and speed, square sizes 1k-8k.

For each size n: A, B drawn from N(0, 1) (and, with --scale-rows, rows of A scaled over six decades,
where one TF32 rounding costs the most), out = A @ B by the runtime at fp32 (SIMT), at tf32 (one
TF32 product) and split TF32 (``rt.gemm_split_tf32``: three), each against A @ B in float64 on the
GPU (max |error| / max |reference|); times are CUDA-event medians of 10 runs with the L2 flushed
before each, after warm-up (plans built and timed outside). Prints a Markdown table.

    python benchmarks/split_tf32.py [--sizes 1024,2048,4096,8192] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1024,2048,4096,8192")
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--scale-rows", action="store_true", help="rows of A over six decades")
    ap.add_argument("--json", help="append one line per size")
    a = ap.parse_args(argv)
    import torch

    from stitchcuda import rt

    torch.backends.cuda.matmul.allow_tf32 = False
    dev = torch.device("cuda")
    stream = torch.cuda.current_stream().cuda_stream
    flush = torch.empty(2 * torch.cuda.get_device_properties(dev).L2_cache_size, dtype=torch.uint8, device=dev)
    ways = {"fp32": lambda x, y, o: rt.gemm(x, y, o, policy="fp32", stream=stream),
            "tf32": lambda x, y, o: rt.gemm(x, y, o, policy="tf32", stream=stream),
            "split tf32": lambda x, y, o: rt.gemm_split_tf32(x, y, o, stream=stream)}
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}")
    print("| n | fp32 error | tf32 error | split error | fp32 ms | tf32 ms | split ms | split TFLOP/s | split vs fp32 |")
    print("|---|---|---|---|---|---|---|---|---|")
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
            times = []
            for _ in range(a.runs):
                flush.zero_()
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn(x, y, out)
                e.record()
                e.synchronize()
                times.append(s.elapsed_time(e))
            row[f"{name} ms"] = statistics.median(times)
        flops = 2.0 * n ** 3
        print(f"| {n} | {row['fp32 error']:.2e} | {row['tf32 error']:.2e} | {row['split tf32 error']:.2e} | "
              f"{row['fp32 ms']:.3f} | {row['tf32 ms']:.3f} | {row['split tf32 ms']:.3f} | "
              f"{flops / row['split tf32 ms'] / 1e9:.0f} | {row['fp32 ms'] / row['split tf32 ms']:.2f}x |", flush=True)
        if a.json:
            with open(a.json, "a") as f:
                f.write(json.dumps(row) + "\n")
        del x, y, ref, out
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
