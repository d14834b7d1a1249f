"""rt.conv (cuDNN through the runtime's cached plans) against torch.nn.functional.conv2d on
ResNet, VGG and depthwise (MobileNet) shapes, at matched precision, written as a Markdown table.

Precision is matched per policy: fp32 -> both without TF32 (torch.backends.cudnn.allow_tf32 off);
tf32 -> cudnn.allow_tf32 on for PyTorch; bf16 / fp16 -> 16-bit tensors for both, PyTorch under
autocast. Both sides get the same tensors in the same layout (channels-first, and channels-last for
the 16-bit policies, where tensor-core kernels want it), with bias and ReLU: PyTorch runs
F.relu(F.conv2d(x, w, b)), the runtime rt.conv(..., activation='relu') into a preallocated out.

Timing: CUDA events around one call on the current stream, the L2 flushed before each trial (a
memset of twice its size, outside the timed region), warm-up first (which also builds and autotunes
rt.conv's plan and lets cuDNN pick PyTorch's algorithm: cudnn.benchmark is on), median of --trials
trials, with the interquartile range. Each row is checked first: the two outputs agree within the
policy's tolerance against each other, or the row says so.

    python benchmarks/bench_conv.py --out results/bench_conv.md [--policies fp32,tf32,bf16] [--quick]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

from stitchcuda import rt

# (name, batch, in_channels, out_channels, H, W, kernel, stride, padding, groups)
SHAPES = [
    ("resnet50 conv1 7x7/2", 32, 3, 64, 224, 224, 7, 2, 3, 1),
    ("resnet50 3x3 64", 32, 64, 64, 56, 56, 3, 1, 1, 1),
    ("resnet50 1x1 256->64", 32, 256, 64, 56, 56, 1, 1, 0, 1),
    ("resnet50 3x3 128/2", 32, 128, 128, 56, 56, 3, 2, 1, 1),
    ("resnet50 3x3 512", 32, 512, 512, 7, 7, 3, 1, 1, 1),
    ("vgg16 3x3 64 @224", 8, 64, 64, 224, 224, 3, 1, 1, 1),
    ("vgg16 3x3 256 @56", 16, 256, 256, 56, 56, 3, 1, 1, 1),
    ("mobilenetv2 dw 3x3 144", 32, 144, 144, 56, 56, 3, 1, 1, 144),
    ("mobilenetv2 dw 3x3 576", 32, 576, 576, 14, 14, 3, 1, 1, 576),
    ("resnext 3x3 g32 256", 32, 256, 256, 28, 28, 3, 1, 1, 32),
]
POLICY = {"fp32": (torch.float32, 1e-3), "tf32": (torch.float32, 2e-2), "bf16": (torch.bfloat16, 3e-2),
          "fp16": (torch.float16, 2e-2)}


class Flusher:
    """Evicts L2 between trials: a memset of twice its size on the timed stream."""

    def __init__(self):
        l2 = torch.cuda.get_device_properties(0).L2_cache_size
        self.buf = torch.empty(2 * l2, dtype=torch.uint8, device="cuda")

    def __call__(self):
        self.buf.zero_()


def time_call(fn, flush: Flusher, trials: int, warmup: int) -> tuple[float, float, float]:
    """(median, q1, q3) in ms of one call, CUDA events on the current stream, L2 flushed."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    end = [torch.cuda.Event(enable_timing=True) for _ in range(trials)]
    for i in range(trials):
        flush()
        start[i].record()
        fn()
        end[i].record()
    torch.cuda.synchronize()
    ms = sorted(s.elapsed_time(e) for s, e in zip(start, end))
    q = statistics.quantiles(ms, n=4)
    return statistics.median(ms), q[0], q[2]


def layouts_for(policy: str) -> list[bool]:
    return [False, True] if policy in ("bf16", "fp16") else [False]


def bench_row(shape, policy: str, channels_last: bool, flush: Flusher, trials: int, warmup: int) -> dict:
    name, n, cin, cout, h, w_, k, s, p, g = shape
    dtype, tol = POLICY[policy]
    gen = torch.Generator(device="cuda").manual_seed(1234)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(n, cin, h, w_, device="cuda", generator=gen).to(dtype).contiguous(memory_format=fmt)
    w = (torch.randn(cout, cin // g, k, k, device="cuda", generator=gen) / (cin // g * k * k) ** 0.5).to(dtype)
    w = w.contiguous(memory_format=fmt)
    b = torch.randn(cout, device="cuda", generator=gen).to(dtype)
    torch.backends.cudnn.allow_tf32 = policy == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = policy == "tf32"
    torch.backends.cudnn.benchmark = True
    autocast = dtype in (torch.bfloat16, torch.float16)

    def torch_call():
        with torch.autocast("cuda", dtype=dtype, enabled=autocast):
            return F.relu(F.conv2d(x, w, b, stride=s, padding=p, groups=g))

    ref = torch_call()
    out = torch.empty_like(ref, memory_format=fmt)
    stream = torch.cuda.current_stream().cuda_stream

    def rt_call():
        rt.conv(x, w, b, stride=s, padding=p, groups=g, policy=policy, activation="relu", channels_last=channels_last,
                out=out, stream=stream)

    rt_call()
    torch.cuda.synchronize()
    err = ((out.double() - ref.double()).abs() / (1 + ref.double().abs())).max().item()
    row = dict(name=name, policy=policy, layout="NHWC" if channels_last else "NCHW", err=err, ok=err <= tol)
    row["torch"] = time_call(torch_call, flush, trials, warmup)
    row["rt"] = time_call(rt_call, flush, trials, warmup)
    ho, wo = (h + 2 * p - k) // s + 1, (w_ + 2 * p - k) // s + 1
    flops = 2 * n * cout * ho * wo * (cin // g) * k * k
    row["tflops_rt"] = flops / (row["rt"][0] * 1e-3) / 1e12
    return row


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=Path(__file__).resolve().parent).stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, help="Markdown file to write (stdout too)")
    ap.add_argument("--policies", default="fp32,tf32,bf16,fp16")
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--quick", action="store_true", help="the first four shapes, 20 trials")
    args = ap.parse_args()
    shapes = SHAPES[:4] if args.quick else SHAPES
    trials = 20 if args.quick else args.trials
    flush = Flusher()
    lines = [
        "# rt.conv vs torch.nn.functional.conv2d (+ bias + ReLU)", "",
        f"- date: {datetime.date.today().isoformat()}, GPU: {torch.cuda.get_device_name(0)}, "
        f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, runtime {rt.version()}, commit {git_commit()}",
        f"- command: `{' '.join([Path(sys.executable).name, *sys.argv])}` on {platform.node() or 'host'}",
        f"- median of {trials} trials (IQR in brackets), CUDA events around one call, L2 flushed before each trial, "
        f"{args.warmup} warm-up calls; matched precision per policy; err = max |rt - torch| / (1 + |torch|)",
        "",
        "| shape | policy | layout | torch ms | rt.conv ms | torch / rt | rt TFLOP/s | err |",
        "|---|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)
    for policy in args.policies.split(","):
        for cl in layouts_for(policy):
            for shape in shapes:
                try:
                    r = bench_row(shape, policy, cl, flush, trials, args.warmup)
                except Exception as e:  # a row that fails says why; the table goes on
                    line = f"| {shape[0]} | {policy} | {'NHWC' if cl else 'NCHW'} | failed: {type(e).__name__}: {str(e)[:160]} | | | | |"
                else:
                    t, q = r["torch"], r["rt"]
                    line = (f"| {r['name']} | {policy} | {r['layout']} | {t[0]:.4f} [{t[1]:.4f}-{t[2]:.4f}] | "
                            f"{q[0]:.4f} [{q[1]:.4f}-{q[2]:.4f}] | {t[0] / q[0]:.2f} | {r['tflops_rt']:.1f} | "
                            f"{r['err']:.1e}{'' if r['ok'] else ' MISMATCH'} |")
                lines.append(line)
                print(line, flush=True)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    if not torch.cuda.is_available():
        print("bench_conv: needs a CUDA device", file=sys.stderr)
        sys.exit(2)
    os.environ.setdefault("STITCHCUDA_CONV_LOG", "0")
    sys.exit(main())
