"""Render the runtime benchmark outputs (runtime_host.json, runtime_host_tuned.json,
bench_runtime.json from one run_gpu.sh session) as the Markdown tables of BENCHMARKS.md."""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(folder: str) -> None:
    d = Path(folder)
    host = json.loads((d / "runtime_host.json").read_text())
    tuned = json.loads((d / "runtime_host_tuned.json").read_text())
    py = json.loads((d / "bench_runtime.json").read_text())
    out = []
    out.append(f"GPU: {py['gpu']} · torch {py['torch']} · commit {py['commit']} · {py['date']}\n")
    out.append("### GEMM host time per call (C++, µs, median of 5,000 calls)\n")
    out.append("| case | bare cublasLtMatmul | st_gemm, cached plan | overhead | first call (plan built) | first call, autotuned |")
    out.append("|---|---|---|---|---|---|")
    for h, t in zip(host["gemm_host"], tuned["gemm_host"]):
        out.append(f"| {h['case']} ({h['m']}×{h['n']}×{h['k']}, {h['policy']}) | {h['bare_median_us']:.2f} | "
                   f"{h['cached_median_us']:.2f} | **{h['overhead_median_us']:+.2f}** | {h['uncached_median_us']:.1f} | "
                   f"{t['uncached_median_us']:.0f} |")
    out.append("\n### Host time of one call from Python (µs, median)\n")
    out.append("| policy, shape | rt.gemm(out=) | rt.gemm() | bound call | torch.matmul(out=) | torch.matmul() |")
    out.append("|---|---|---|---|---|---|")
    for r in py["host"]:
        out.append(f"| {r['policy']} {'×'.join(map(str, r['shape']))} | {r['rt_gemm_out_us']:.1f} | {r['rt_gemm_alloc_us']:.1f} | "
                   f"{r['rt_bound_gemm_us']:.1f} | {r['torch_matmul_out_us']:.1f} | {r['torch_matmul_alloc_us']:.1f} |")
    out.append("\n### GEMM throughput vs torch.matmul at the same precision (device time, CUDA-graph replays, L2 flushed)\n")
    out.append("| policy | case | ours ms (IQR) | torch ms (IQR) | torch/ours | ours TFLOP/s | max rel err vs fp64 |")
    out.append("|---|---|---|---|---|---|---|")
    for r in py["throughput"]:
        mark = "" if r["ratio_vs_torch"] >= 0.95 else " ✗"
        out.append(f"| {r['policy']} | {r['case']} | {r['ours_ms']:.3f} ({r['ours_iqr_ms']:.3f}) | {r['torch_ms']:.3f} "
                   f"({r['torch_iqr_ms']:.3f}) | **{r['ratio_vs_torch']:.3f}**{mark} | {r['ours_tflops']:.0f} | {r['max_rel_err']:.1e} |")
    out.append("\n### GEMM + bias + GELU (bf16): fused epilogue vs PyTorch eager ops and vs the bare GEMM\n")
    out.append("| m×n×k | fused ms | eager ms | bare GEMM ms | eager/fused | fused/bare | Python loop: fused / eager ms |")
    out.append("|---|---|---|---|---|---|---|")
    for r in py["epilogue"]:
        out.append(f"| {'×'.join(map(str, r['shape']))} | {r['fused_ms']:.3f} | {r['eager_ms']:.3f} | {r['bare_gemm_ms']:.3f} | "
                   f"**{r['speedup_vs_eager']:.2f}×** | **{r['fused_over_bare']:.3f}** | {r['fused_python_call_ms']:.3f} / "
                   f"{r['eager_python_call_ms']:.3f} |")
    t = host["transfers"]
    out.append("\n### Pinned transfers, 256 MiB (GB/s, CUDA events, median of 10)\n")
    out.append("| direction | cudaMemcpyAsync from cudaHostAlloc | runtime pool (st_copy_*) | ratio | staged from pageable |")
    out.append("|---|---|---|---|---|")
    out.append(f"| H2D | {t['cudaHostAlloc_h2d_GBps']:.1f} | {t['pool_h2d_GBps']:.1f} | **{t['h2d_ratio']:.3f}** | {t['staged_pageable_h2d_GBps']:.1f} |")
    out.append(f"| D2H | {t['cudaHostAlloc_d2h_GBps']:.1f} | {t['pool_d2h_GBps']:.1f} | **{t['d2h_ratio']:.3f}** | {t['staged_pageable_d2h_GBps']:.1f} |")
    print("\n".join(out))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
