"""Diagnostic: the runtime's plan decisions (STITCHCUDA_GEMM_LOG=1) and graph-replay device
time against torch for a few GEMMs."""
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from bench_runtime import Timer, cur_stream  # noqa: E402

from stitchcuda import rt  # noqa: E402

timer = Timer()
cases = [("tf32", torch.float32, 8192, 8192, 8192, "none"), ("bf16", torch.bfloat16, 128, 16384, 16384, "bias_gelu"),
         ("bf16", torch.bfloat16, 8192, 8192, 1024, "bias_gelu"), ("bf16", torch.bfloat16, 128, 16384, 16384, "bias")]
for pol, dt, m, n, k, epi in cases:
    torch.backends.cuda.matmul.allow_tf32 = pol == "tf32"
    x = torch.randn(m, k, device="cuda", dtype=dt)
    w = torch.randn(n, k, device="cuda", dtype=dt) / k**0.5
    b = torch.randn(n, device="cuda", dtype=dt)
    o = torch.empty(m, n, device="cuda", dtype=dt)
    bias = b if "bias" in epi else None
    ours = lambda: rt.gemm(x, w, o, policy=pol, trans_b=True, epilogue=epi, bias=bias, stream=cur_stream())
    if epi == "none":
        theirs = lambda: torch.matmul(x, w.t())
    elif epi == "bias":
        theirs = lambda: torch.addmm(b, x, w.t())
    else:
        theirs = lambda: F.gelu(torch.addmm(b, x, w.t()), approximate="tanh")
    to, tt = timer(ours), timer(theirs)
    print(f"{pol} {m}x{n}x{k} {epi}: ours {to['median_ms']:.4f} ms  torch {tt['median_ms']:.4f} ms  "
          f"ratio {tt['median_ms'] / to['median_ms']:.3f}", flush=True)
