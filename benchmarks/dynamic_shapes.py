"""One dynamic program against the static programs of each shape, and against torch.compile (GPU).

For each reference: ``build --dynamic`` once, then at each shape of ``--shapes``: the static program
built for that shape, the dynamic program, PyTorch eager, ``torch.compile`` (static: one compile a
shape) and ``torch.compile(dynamic=True)`` (one compile for the range), all at the policy's
precision, all checked against the reference in float64 first. Times are CUDA-event medians of
``--reps`` calls after a warm-up, inputs fixed, L2 flushed before each call.

    python benchmarks/dynamic_shapes.py models/gpt_block.py:batch=1:8:1,2,4,8 \\
        "models/gpt_block.py:batch=1:8:1,8;seq=16:255:64,255" models/resnet_block.py:batch=1:32:1,8,32 \\
        --precision tf32 --out runs/dynamic

Prints a markdown table (and writes it to OUT/dynamic_shapes.md): per shape, ms of each, the dynamic
program over the static one (the issue's "within 5 %"), each torch.compile over ours, and where
ours spend a call: the kernels' time on the device and the host's time to issue the call.
"""

from __future__ import annotations

import argparse
import copy
import itertools
import statistics
import sys
import time
from pathlib import Path

import torch

from stitchcuda import dynamic as D
from stitchcuda import frontend
from stitchcuda.pipeline import build_program
from stitchcuda.program import Program


def timed(fn, reps: int) -> float:
    flush = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        flush.zero_()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def split(fn, reps: int) -> tuple[float, float]:
    """Where a call's time goes: the device's kernel time a call (ms, summed from the profiler's
    CUDA activity, no flush between calls) and the host's time to issue a call (ms, from an idle
    device: a synchronize before each, so a full queue never throttles the host)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    kernels = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total > 0
                  and e.key != "cudaDeviceSynchronize") / reps / 1e3
    host = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t) * 1e3)
    return kernels, statistics.median(host)


def error(got, want) -> float:
    got, want = got.double().cpu(), want.double().cpu()
    return ((got - want).abs() / (1 + want.abs())).max().item()


def run(spec: str, precision: str, out: Path, reps: int) -> list[str]:
    """``FILE:NAME=MIN:MAX:S1,S2[;NAME=MIN:MAX:S1,...]``: one dynamic program over the named sizes, then
    every combination of the listed values."""
    file, dims = spec.split(":", 1)
    ranges, grids = [], []
    for dim in dims.split(";"):
        dname, rng = dim.split("=", 1)
        lo, hi, shapes = rng.split(":")
        ranges.append(f"{dname}={lo}:{hi}")
        grids.append([(dname, int(x)) for x in shapes.split(",")])
    ref = frontend.load_reference(Path(file))
    stem = Path(file).stem
    arch = "sm_{}{}".format(*torch.cuda.get_device_capability())
    t0 = time.monotonic()
    o = D.build_dynamic(Path(file), ranges, precision=precision, out=out / f"{stem}-dynamic", arch=arch)
    assert o.ok, o.build.message if o.build else ""
    print(f"{stem}: dynamic program over {', '.join(ranges)} built in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    dyn = Program.load(o.directory)
    variables = {b.dim.name: b.dim.variable for b in D.bind(ref, D.parse_dynamic(ranges))}
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = precision == "tf32"
    rows = []
    compiled_dyn = None
    for combo in itertools.product(*grids):
        label = ", ".join(f"{n}={v}" for n, v in combo)
        with D.Sizes(ref.module, {variables[n]: v for n, v in combo}):
            model, inputs = ref.instantiate(seed=0)
            so = build_program(ref, precision=precision, out=out / f"{stem}-{'-'.join(f'{n}{v}' for n, v in combo)}",
                               quiet=True, arch=arch)
        assert so.ok
        static = Program.load(so.directory)
        model = model.cuda()
        xs = [x.cuda() for x in inputs]
        with torch.no_grad():
            want = copy.deepcopy(model).double()(*[x.double() for x in xs])
            e_dyn, e_static = error(dyn(*xs), want), error(static(*xs), want)
            compiled = torch.compile(model)
            if compiled_dyn is None:
                compiled_dyn = torch.compile(copy.deepcopy(model), dynamic=True)
            t_dyn = timed(lambda: dyn(*xs), reps)
            t_static = timed(lambda: static(*xs), reps)
            t_eager = timed(lambda: model(*xs), reps)
            t_comp = timed(lambda: compiled(*xs), reps)
            t_cdyn = timed(lambda: compiled_dyn(*xs), reps)
            (k_dyn, h_dyn), (k_static, h_static) = split(lambda: dyn(*xs), reps), split(lambda: static(*xs), reps)
        rows.append(f"| {stem} | {label} | {t_dyn:.3f} | {t_static:.3f} | **{t_dyn / t_static:.3f}** | "
                    f"{t_eager:.3f} | {t_comp:.3f} | {t_cdyn:.3f} | {t_comp / t_dyn:.2f}x | {t_cdyn / t_dyn:.2f}x | "
                    f"{e_dyn:.1e} / {e_static:.1e} | {k_dyn:.3f} / {k_static:.3f} | {h_dyn:.3f} / {h_static:.3f} |")
        print(rows[-1], file=sys.stderr)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("specs", nargs="+", metavar="FILE:NAME=MIN:MAX:S1,S2,...[;NAME=...]")
    ap.add_argument("--precision", default="tf32")
    ap.add_argument("--out", type=Path, default=Path("runs/dynamic"))
    ap.add_argument("--reps", type=int, default=50)
    ns = ap.parse_args(argv)
    ns.out.mkdir(parents=True, exist_ok=True)
    head = ["| reference | shape | dynamic ms | static ms | dynamic / static | eager ms | compile ms | "
            "compile(dynamic) ms | compile / ours | compile(dynamic) / ours | error dyn / static | "
            "kernels ms dyn / static | host ms dyn / static |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = []
    for spec in ns.specs:
        rows += run(spec, ns.precision, ns.out, ns.reps)
    gpu = torch.cuda.get_device_name()
    text = "\n".join([f"{gpu}, torch {torch.__version__}, precision {ns.precision}", "", *head, *rows]) + "\n"
    (ns.out / "dynamic_shapes.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
