"""Which kernels run each convolution: stitchcuda's (rt.conv, channels-first and channels-last) beside
PyTorch's (eager, both layouts) and torch.compile's, for every convolution of the given problems.

Every convolution of each problem's plan at --precision (tf32, or fp32) (its ConvSpec: shape, stride, padding, groups, bias,
activation) is run alone on fresh random operands, four ways: rt.conv with the spec as planned
(channels-first), rt.conv channels-last, ``F.conv2d``/``conv3d``/... in PyTorch eager NCHW and
channels-last (TF32 allowed under tf32 only; cuDNN's default algorithm choice). Each is timed (CUDA events, L2
flushed, warm-up first, median of --trials) and its kernels named (torch.profiler over one call:
the kernels that take the most time, cuDNN engine kernels included). Then the whole problem under
``torch.compile`` (at the same precision), with its kernels, to see the layout and engines Inductor chose.

    python benchmarks/conv_engines.py --problems 1:54,2:2 --out results/conv_engines.md

Needs a GPU and PyTorch; reads KernelBench's all.jsonl at run time ($STITCHCUDA_SHARED).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # (beside it: event_timing)
from event_timing import flushed_median_ms  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("STITCHCUDA_SHARED") or REPO.parent / "shared")
#: The convolution problems of the performance set (perf.txt).
DEFAULT = "1:50,1:54,1:63,1:65,1:82,1:87,2:2,2:4,2:6,2:17,2:21,2:35,2:52,2:57,2:73"


def _rows(ids: list[tuple[int, int]]) -> list[dict]:
    want = set(ids)
    out = {}
    for line in (SHARED / "kernelbench" / "all.jsonl").read_text().splitlines():
        if line.strip():
            r = json.loads(line)
            if (r["level"], r["problem_id"]) in want:
                out[(r["level"], r["problem_id"])] = r
    return [out[i] for i in ids if i in out]


def _kernels(fn, top: int = 2) -> str:
    """The names of the CUDA kernels one call of ``fn`` runs, longest first (shortened)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    events = [e for e in prof.key_averages() if e.device_type.name == "CUDA" and e.self_device_time_total > 0]
    events.sort(key=lambda e: -e.self_device_time_total)
    total = sum(e.self_device_time_total for e in events) or 1
    names = []
    for e in events[:top]:
        n = e.key.split("(")[0]
        names.append(f"{n[:60]} ({100 * e.self_device_time_total / total:.0f} %)")
    return "; ".join(names) + (f"; +{len(events) - top} more" if len(events) > top else "")


def _time(fn, flush, trials: int) -> float:
    return flushed_median_ms(fn, flush, trials, warmup=3)


def conv_specs(row: dict, policy: str = "tf32") -> list:
    from stitchcuda import frontend
    from stitchcuda import plan as P

    ref = frontend.load_reference(row["source"], name=row["name"])
    cap = frontend.capture_reference(ref, device="meta", seed=0, state="lift")
    plan = P.plan(cap.graph, policy)
    return [t.params for t in plan.tasks if isinstance(t.params, P.ConvSpec)]


def torch_kwargs(c) -> dict:
    """PyTorch's keyword arguments for convolution spec ``c`` (``F.conv2d`` and its kin)."""
    kw = dict(stride=c.stride, padding=c.padding, dilation=c.dilation, groups=c.groups)
    if c.transposed:
        kw["output_padding"] = c.output_padding
    return kw


def rt_conv(c, x, w, b, out, channels_last: bool, stream: int, policy: str = "tf32", activation: str = "none") -> None:
    """The runtime's convolution of spec ``c`` on these operands, into ``out``."""
    from stitchcuda import rt

    rt.conv(x, w, b, stride=list(c.stride), padding=list(c.padding), dilation=list(c.dilation), groups=c.groups,
            transposed=c.transposed, output_padding=list(c.output_padding), policy=policy, activation=activation,
            channels_last=channels_last, out=out, stream=stream)


def bench_spec(c, trials: int, flush, policy: str = "tf32") -> dict:
    import torch
    import torch.nn.functional as F

    sp = len(c.in_size)
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(c.batch, c.in_channels, *c.in_size, device="cuda", generator=g)
    w = torch.randn(*c.w.shape, device="cuda", generator=g) * 0.05
    b = torch.randn(c.out_channels, device="cuda", generator=g) if c.bias is not None else None
    fmt = {1: None, 2: torch.channels_last, 3: torch.channels_last_3d}[sp]
    torch.backends.cudnn.allow_tf32 = policy == "tf32"
    torch.backends.cuda.matmul.allow_tf32 = policy == "tf32"
    torch.backends.cudnn.benchmark = False  # PyTorch's default: cuDNN's heuristics, no autotuning
    kw = torch_kwargs(c)
    if c.transposed:
        fn = (F.conv_transpose1d, F.conv_transpose2d, F.conv_transpose3d)[sp - 1]
    else:
        fn = (F.conv1d, F.conv2d, F.conv3d)[sp - 1]
    act = {"none": lambda y: y, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
           "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda y: F.gelu(y, approximate="tanh")}[c.activation]
    stream = torch.cuda.current_stream().cuda_stream
    out = {}
    layouts = [("NCHW", False)] + ([("NHWC", True)] if fmt is not None else [])
    for name, cl in layouts:
        xx = x.contiguous(memory_format=fmt) if cl else x
        ww = w.contiguous(memory_format=fmt) if cl else w
        ref = act(fn(xx, ww, b, **kw))
        o = torch.empty_like(ref, memory_format=fmt if cl else torch.contiguous_format)

        def ours(xx=xx, ww=ww, o=o, cl=cl):
            rt_conv(c, xx, ww, b, o, cl, stream, policy=policy, activation=c.activation)

        def theirs(xx=xx, ww=ww):
            return act(fn(xx, ww, b, **kw))

        ours()
        torch.cuda.synchronize()
        err = ((o.double() - ref.double()).abs() / (1 + ref.double().abs())).max().item()
        out[f"ours {name}"] = (_time(ours, flush, trials), _kernels(ours), err)
        out[f"torch {name}"] = (_time(theirs, flush, trials), _kernels(theirs), 0.0)
    return out


def whole_problem(row: dict, trials: int, flush) -> tuple[float, str]:
    import torch

    from stitchcuda import frontend

    ref = frontend.load_reference(row["source"], name=row["name"])
    model, inputs = ref.instantiate(seed=0, device="cuda")
    compiled = torch.compile(model)
    with torch.no_grad():
        def run():
            return compiled(*inputs)
        return _time(run, flush, trials), _kernels(run, top=3)


def main(argv: list[str] | None = None) -> int:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", default=DEFAULT)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--precision", choices=("tf32", "fp32"), default="tf32")
    args = ap.parse_args(argv)
    ids = [tuple(int(x) for x in p.split(":")) for p in args.problems.split(",") if p]
    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8, device="cuda")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    lines = [f"# Convolution engines: {torch.cuda.get_device_name(0)}, {datetime.date.today()}, commit {commit}, "
             f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}", "",
             f"`python benchmarks/conv_engines.py --problems {args.problems}` ({args.precision}; ms, median of {args.trials}, "
             "L2 flushed; kernels by share of the call's GPU time)", "",
             "| problem | conv | way | ms | kernels | err |", "|---|---|---|---|---|---|"]
    for row in _rows(ids):
        pid = f"{row['level']}:{row['problem_id']}"
        try:
            specs = conv_specs(row, args.precision)
        except Exception as e:  # noqa: BLE001 - a problem that does not plan is a row saying so
            lines.append(f"| {pid} | | plan failed: {str(e).splitlines()[0][:80]} | | | |")
            continue
        for c in specs:
            shape = (f"{'T' if c.transposed else ''}{len(c.in_size)}d {c.batch}x{c.in_channels}x"
                     f"{'x'.join(map(str, c.in_size))} -> {c.out_channels}, k{'x'.join(map(str, c.kernel))} "
                     f"s{c.stride[0]} g{c.groups}{' +b' if c.bias is not None else ''}"
                     f"{' +' + c.activation if c.activation != 'none' else ''}")
            try:
                res = bench_spec(c, args.trials, flush, args.precision)
            except Exception as e:  # noqa: BLE001
                lines.append(f"| {pid} | {shape} | failed: {str(e).splitlines()[0][:100]} | | | |")
                continue
            for way, (ms, kern, err) in res.items():
                lines.append(f"| {pid} | {shape} | {way} | {ms:.3f} | {kern} | {err:.1e} |")
            print(lines[-1], flush=True)
        if not args.no_compile:
            try:
                ms, kern = whole_problem(row, args.trials, flush)
                lines.append(f"| {pid} | whole problem | torch.compile | {ms:.3f} | {kern} | |")
            except Exception as e:  # noqa: BLE001
                lines.append(f"| {pid} | whole problem | torch.compile failed: {str(e).splitlines()[0][:80]} | | | |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
