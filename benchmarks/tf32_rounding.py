"""Does each convolution of a model round its operands to TF32, or drop their low bits?

A tensor core fed fp32 data computes on TF32 (10 mantissa bits). A kernel may round the operands to
nearest first, or feed them as they are, which drops the 13 low bits (a bias toward zero, about
twice the error, and one that does not cancel over a deep net). For every convolution of a model's
tf32 plan this runs, on fresh random operands: the runtime's convolution (channels-last, as a tf32
program runs it, and channels-first) and PyTorch's (cuDNN with TF32 allowed, both layouts); and in
float64 on the GPU the exact convolution, the one of the operands rounded to nearest and the one of
the operands truncated. Each run's distance to the two models (max |diff| / max |exact|) says which
it does: the one it matches to fp32 accumulation order (~1e-6) is its rounding.

    python benchmarks/tf32_rounding.py models/zoo/efficientnet_b0.py [--limit 20]

Needs a GPU and PyTorch.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (beside it: conv_engines)
from conv_engines import rt_conv, torch_kwargs  # noqa: E402


def tf32(x, mode: str):
    """``x`` (float32) with its mantissa cut to TF32's 10 bits: to nearest (ties away, as cvt.rna) or truncated."""
    import torch

    bits = x.contiguous().view(torch.int32)
    if mode == "nearest":
        bits = bits + 0x1000
    return (bits & ~0x1FFF).view(torch.float32)


def main(argv: list[str] | None = None) -> int:
    import torch
    import torch.nn.functional as F

    from stitchcuda import plan as P
    from stitchcuda.pipeline import capture_problem

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("reference", help="a KernelBench-format .py file")
    ap.add_argument("--limit", type=int, default=0, help="only the first N convolutions")
    args = ap.parse_args(argv)
    prob = capture_problem(args.reference, precision="tf32", compiling=False)
    specs = [t.params for t in prob.plan().tasks if isinstance(t.params, P.ConvSpec)]
    specs = [c for c in specs if len(c.in_size) == 2 and not c.transposed][: args.limit or None]
    stream = torch.cuda.current_stream().cuda_stream
    torch.backends.cudnn.allow_tf32 = True
    print(f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          "distance of each run to the exact result and to the two TF32 models (max |diff| / max |exact|)")
    print("| convolution | run | vs exact | vs rounded | vs truncated | reads as |")
    print("|---|---|---|---|---|---|")
    seen = set()
    for c in specs:
        key = (c.batch, c.in_channels, c.in_size, c.out_channels, c.kernel, c.stride, c.padding, c.groups)
        if key in seen:
            continue
        seen.add(key)
        g = torch.Generator(device="cuda").manual_seed(len(seen))
        x = torch.randn(c.batch, c.in_channels, *c.in_size, device="cuda", generator=g)
        w = torch.randn(*c.w.shape, device="cuda", generator=g)
        kw = torch_kwargs(c)
        exact = F.conv2d(x.double(), w.double(), **kw)
        near = F.conv2d(tf32(x, "nearest").double(), tf32(w, "nearest").double(), **kw)
        trunc = F.conv2d(tf32(x, "truncate").double(), tf32(w, "truncate").double(), **kw)
        scale = exact.abs().max().item() or 1.0
        runs = {}
        for cl in (True, False):
            fmt = torch.channels_last if cl else torch.contiguous_format
            xx, ww = x.contiguous(memory_format=fmt), w.contiguous(memory_format=fmt)
            o = torch.empty_like(exact, dtype=torch.float32, memory_format=fmt)
            rt_conv(c, xx, ww, None, o, cl, stream)
            runs[f"ours {'NHWC' if cl else 'NCHW'}"] = o
            runs[f"torch {'NHWC' if cl else 'NCHW'}"] = F.conv2d(xx, ww, **kw)
        torch.cuda.synchronize()
        shape = (f"{c.batch}x{c.in_channels}x{'x'.join(map(str, c.in_size))} -> {c.out_channels}, "
                 f"k{'x'.join(map(str, c.kernel))} s{c.stride[0]} g{c.groups}")
        for name, o in runs.items():
            d = [((o.double() - r).abs().max().item() / scale) for r in (exact, near, trunc)]
            verdict = "fp32" if d[0] < 0.3 * min(d[1], d[2]) else "rounded" if d[1] < d[2] else "truncated"
            print(f"| {shape} | {name} | {d[0]:.2e} | {d[1]:.2e} | {d[2]:.2e} | {verdict} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
