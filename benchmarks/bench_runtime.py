"""Runtime benchmark on a GPU: the runtime's GEMM against torch.matmul at the same precision.

  1. host time of one call from Python: stitchcuda._rt.gemm vs torch.matmul (small GEMM);
  2. throughput at 4096^3, 8192^3 and a 3-layer MLP (batch 128, width 16384), each policy;
  3. GEMM + bias + GELU through the runtime's epilogue vs the same ops in PyTorch eager, and
     vs the bare GEMM.

Every ratio comes from one process run; device times are CUDA-event medians with the L2
flushed between trials. Writes JSON to --out and prints a table.

    python benchmarks/bench_runtime.py --out bench.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import stitchcuda
from stitchcuda import rt

POLICY_DTYPE = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def set_torch_precision(policy: str) -> None:
    """Allow PyTorch the same precision as the policy (TF32 only under tf32)."""
    torch.backends.cuda.matmul.allow_tf32 = policy == "tf32"
    torch.backends.cudnn.allow_tf32 = policy == "tf32"


def cur_stream() -> int:
    return torch.cuda.current_stream().cuda_stream


class Timer:
    """Device time of a function: CUDA-event medians with the L2 flushed before each trial.

    With graph=True (the default) the function is captured into a CUDA graph once and its
    replays are timed, so the number is the GPU's time and not the host's launch overhead
    (which host_time_us measures separately). The function must launch on the current stream.
    Warm-up runs on the capture stream itself, so the runtime's per-stream context and GEMM
    plans exist (and are tuned) before capture.
    """

    def __init__(self) -> None:
        l2 = rt.device_info(torch.cuda.current_device())["l2_bytes"]
        self.flush_buf = torch.empty(max(2 * l2, 64 << 20), dtype=torch.uint8, device="cuda")
        self.stream = torch.cuda.Stream()

    def __call__(self, fn, trials: int = 30, warmup: int = 3, graph: bool = True) -> dict:
        return self.compare({"fn": fn}, trials, warmup, graph)["fn"]

    def compare(self, fns: dict, trials: int = 30, warmup: int = 3, graph: bool = True) -> dict:
        """Time several functions with their trials interleaved (a, b, a, b, ...), so that clock
        and power drift during the run hits every contender alike."""
        runs = {}
        for name, fn in fns.items():
            torch.cuda.synchronize()
            with torch.cuda.stream(self.stream):
                for _ in range(warmup):
                    fn()
            torch.cuda.synchronize()
            if graph:
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=self.stream):
                    fn()
                runs[name] = (g.replay, g)
            else:
                runs[name] = (fn, None)
        times = {name: [] for name in fns}
        with torch.cuda.stream(self.stream):
            for _ in range(trials):
                for name, (run, _) in runs.items():
                    self.flush_buf.zero_()
                    start = torch.cuda.Event(enable_timing=True)
                    end = torch.cuda.Event(enable_timing=True)
                    start.record()
                    run()
                    end.record()
                    end.synchronize()
                    times[name].append(start.elapsed_time(end))
        out = {}
        for name, ts in times.items():
            q = statistics.quantiles(ts, n=4)
            out[name] = {"median_ms": statistics.median(ts), "iqr_ms": q[2] - q[0], "trials": trials}
        return out


def host_time_us(fn, iters: int = 3000, batch: int = 50) -> float:
    """Median host time of one call, synchronising every `batch` calls so the queue stays short."""
    for _ in range(200):
        fn()
    torch.cuda.synchronize()
    samples = []
    for i in range(iters):
        t0 = time.perf_counter_ns()
        fn()
        samples.append((time.perf_counter_ns() - t0) / 1e3)
        if (i + 1) % batch == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(samples)


def bench_host(stream: int) -> list[dict]:
    out = []
    for policy, (m, n, k) in [("fp32", (64, 64, 64)), ("bf16", (128, 4096, 4096))]:
        set_torch_precision(policy)
        dt = POLICY_DTYPE[policy]
        a = torch.randn(m, k, device="cuda", dtype=dt)
        b = torch.randn(k, n, device="cuda", dtype=dt)
        o = torch.empty(m, n, device="cuda", dtype=dt)
        ours = host_time_us(lambda: rt.gemm(a, b, o, policy=policy, stream=stream))
        ours_new_out = host_time_us(lambda: rt.gemm(a, b, policy=policy, stream=stream))
        bound = rt.bind_gemm(a, b, o, policy=policy, stream=stream)
        ours_bound = host_time_us(lambda: bound(stream))
        theirs = host_time_us(lambda: torch.matmul(a, b, out=o))
        theirs_new_out = host_time_us(lambda: torch.matmul(a, b))
        out.append({"policy": policy, "shape": [m, n, k], "rt_gemm_out_us": ours, "rt_gemm_alloc_us": ours_new_out, "rt_bound_gemm_us": ours_bound,
                    "torch_matmul_out_us": theirs, "torch_matmul_alloc_us": theirs_new_out})
    return out


def bench_throughput(timer: Timer, stream: int, policies: list[str]) -> list[dict]:
    rows = []
    shapes = [("square_4096", [(4096, 4096, 4096)]), ("square_8192", [(8192, 8192, 8192)]),
              ("mlp3_b128_w16384", [(128, 16384, 16384)] * 3)]
    for policy in policies:
        set_torch_precision(policy)
        dt = POLICY_DTYPE[policy]
        for name, layers in shapes:
            m = layers[0][0]
            x = torch.randn(m, layers[0][2], device="cuda", dtype=dt)
            # nn.Linear layout: weight [out, in], y = x @ w.T (+ b).
            ws = [torch.randn(n, k, device="cuda", dtype=dt) / k**0.5 for (_, n, k) in layers]
            outs = [torch.empty(m, n, device="cuda", dtype=dt) for (_, n, _) in layers]

            def ours():
                h = x
                for w, o in zip(ws, outs):
                    rt.gemm(h, w, o, policy=policy, trans_b=True, stream=cur_stream())
                    h = o

            def theirs():
                h = x
                for w in ws:
                    h = torch.matmul(h, w.t())

            with torch.cuda.stream(timer.stream):
                ours()
            torch.cuda.synchronize()
            ref = x.double()
            for w in ws:
                ref = ref @ w.double().t()
            err = (outs[-1].double() - ref).abs().max().item() / max(ref.abs().max().item(), 1e-30)
            t = timer.compare({"ours": ours, "torch": theirs})
            t_ours, t_theirs = t["ours"], t["torch"]
            flops = sum(2 * mm * n * k for (mm, n, k) in layers)
            rows.append({"policy": policy, "case": name, "ours_ms": t_ours["median_ms"],
                         "ours_iqr_ms": t_ours["iqr_ms"], "torch_ms": t_theirs["median_ms"],
                         "torch_iqr_ms": t_theirs["iqr_ms"], "ratio_vs_torch": t_theirs["median_ms"] / t_ours["median_ms"],
                         "ours_tflops": flops / t_ours["median_ms"] / 1e9, "max_rel_err": err})
            del x, ws, outs
            torch.cuda.empty_cache()
    return rows


def bench_epilogue(timer: Timer, stream: int) -> list[dict]:
    rows = []
    policy = "bf16"
    set_torch_precision(policy)
    dt = POLICY_DTYPE[policy]
    # An MLP layer at batch 128, a transformer FFN up-projection, a square-ish layer, and a
    # short-k, output-heavy shape where the epilogue's share of the work is largest.
    for (m, n, k) in [(128, 16384, 16384), (4096, 16384, 4096), (2048, 4096, 4096), (8192, 8192, 1024)]:
        x = torch.randn(m, k, device="cuda", dtype=dt)
        w = torch.randn(n, k, device="cuda", dtype=dt) / k**0.5
        bias = torch.randn(n, device="cuda", dtype=dt)
        o = torch.empty(m, n, device="cuda", dtype=dt)

        def fused():
            rt.gemm(x, w, o, policy=policy, trans_b=True, epilogue="bias_gelu", bias=bias, stream=cur_stream())

        def bare():
            rt.gemm(x, w, o, policy=policy, trans_b=True, stream=cur_stream())

        def eager():
            return F.gelu(torch.addmm(bias, x, w.t()), approximate="tanh")

        with torch.cuda.stream(timer.stream):
            fused()
        torch.cuda.synchronize()
        ref = F.gelu(torch.addmm(bias.double(), x.double(), w.double().t()), approximate="tanh")
        err = (o.double() - ref).abs().max().item()
        t = timer.compare({"fused": fused, "bare": bare, "eager": eager})
        tf, tb, te = t["fused"], t["bare"], t["eager"]
        # As called from Python, host overhead included (no graph): what a plain loop sees.
        t = timer.compare({"fused": fused, "eager": eager}, graph=False)
        tf_py, te_py = t["fused"], t["eager"]
        rows.append({"shape": [m, n, k], "policy": policy, "fused_ms": tf["median_ms"], "bare_gemm_ms": tb["median_ms"],
                     "eager_ms": te["median_ms"], "speedup_vs_eager": te["median_ms"] / tf["median_ms"],
                     "fused_over_bare": tf["median_ms"] / tb["median_ms"], "max_abs_err": err,
                     "fused_python_call_ms": tf_py["median_ms"], "eager_python_call_ms": te_py["median_ms"]})
    return rows


def git_commit() -> str:
    import os

    if os.environ.get("STITCHCUDA_COMMIT"):
        return os.environ["STITCHCUDA_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return "unknown"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("bench_runtime.json"))
    ap.add_argument("--policies", default="fp32,tf32,bf16,fp16")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_runtime: needs a CUDA device", file=sys.stderr)
        return 2
    stream = torch.cuda.current_stream().cuda_stream
    timer = Timer()
    result = {
        "gpu": torch.cuda.get_device_name(),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "torch": torch.__version__,
        "stitchcuda": stitchcuda.__version__,
        "command": "python " + " ".join(sys.argv),
    }
    result["host"] = bench_host(stream)
    result["throughput"] = bench_throughput(timer, stream, args.policies.split(","))
    result["epilogue"] = bench_epilogue(timer, stream)
    args.out.write_text(json.dumps(result, indent=2))

    print(f"GPU {result['gpu']}  torch {result['torch']}  commit {result['commit']}")
    print("\nhost time per call (us, median)")
    for r in result["host"]:
        print(f"  {r['policy']} {r['shape']}: rt.gemm(out=) {r['rt_gemm_out_us']:.1f}  rt.gemm() {r['rt_gemm_alloc_us']:.1f}"
              f"  bound {r['rt_bound_gemm_us']:.1f}  torch.matmul(out=) {r['torch_matmul_out_us']:.1f}  torch.matmul() {r['torch_matmul_alloc_us']:.1f}")
    print("\nthroughput, device time of CUDA-graph replays (ratio = torch ms / ours ms; >= 0.95 is the target)")
    for r in result["throughput"]:
        print(f"  {r['policy']:5s} {r['case']:18s} ours {r['ours_ms']:8.3f} ms  torch {r['torch_ms']:8.3f} ms  "
              f"ratio {r['ratio_vs_torch']:.3f}  {r['ours_tflops']:.0f} TFLOP/s  err {r['max_rel_err']:.1e}")
    print("\nGEMM+bias+GELU (bf16), device time of graph replays: fused epilogue vs PyTorch eager ops and vs bare GEMM")
    for r in result["epilogue"]:
        print(f"  {r['shape']}: fused {r['fused_ms']:.3f} ms  eager {r['eager_ms']:.3f} ms  bare {r['bare_gemm_ms']:.3f} ms"
              f"  speedup {r['speedup_vs_eager']:.2f}x  fused/bare {r['fused_over_bare']:.3f}  err {r['max_abs_err']:.1e}"
              f"  | python loop: fused {r['fused_python_call_ms']:.3f} eager {r['eager_python_call_ms']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
