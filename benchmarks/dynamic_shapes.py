"""One dynamic program against the static programs of each shape, and against torch.compile (GPU).

For each reference: ``build --dynamic`` once, then at each shape of ``--shapes``: the static program
built for that shape, the dynamic program, PyTorch eager, ``torch.compile`` (static: one compile a
shape) and ``torch.compile(dynamic=True)`` (one compile for the range), all at the policy's
precision, all checked against the reference in float64 first. Times are CUDA-event medians of
``--reps`` calls after a warm-up, inputs fixed, L2 flushed before each call, the five interleaved
call by call (programs this small are bound by the host's time to issue a call, which drifts).

    python benchmarks/dynamic_shapes.py models/gpt_block.py:batch=1:8:1,2,4,8 \\
        "models/gpt_block.py:batch=1:8:1,8;seq=16:255:64,255" models/resnet_block.py:batch=1:32:1,8,32 \\
        --precision tf32 --out runs/dynamic

Prints a markdown table (and writes it to OUT/dynamic_shapes.md): per shape, ms of each, the dynamic
program over the static one (the issue's "within 5 %"), each torch.compile over ours, and where
ours spend a call: the kernels' time on the device and the host's time to issue the call; and
the dynamic program's first call at each shape in this process (no tuning file: the cost a wheel's
first call at an untuned shape pays).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from stitchcuda import dynamic as D
from stitchcuda import frontend
from stitchcuda.pipeline import build_program
from stitchcuda.program import Program


def timed(fns: dict[str, object], reps: int) -> dict[str, float]:
    """Each callable's CUDA-event median over ``reps`` calls, L2 flushed before each, the callables
    interleaved call by call (a drift of the host or the clocks falls on all of them alike) in an
    order drawn afresh each round: a call bound by the host's time runs faster right after a call
    of the same code path (its caches warm), so no contender may always follow the same other."""
    flush = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    for fn in fns.values():
        for _ in range(5):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    order = random.Random(0)
    for _ in range(reps):
        order.shuffle(names)
        for name in names:
            flush.zero_()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fns[name]()
            b.record()
            torch.cuda.synchronize()
            times[name].append(a.elapsed_time(b))
    return {name: statistics.median(t) for name, t in times.items()}


def kernels(fn, reps: int) -> dict[str, float]:
    """The device's time a call per kernel (name -> ms): from the profiler's CUDA activity over
    ``reps`` calls, no flush between them."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    return {e.key: e.device_time_total / reps / 1e3 for e in prof.key_averages()
            if e.device_time_total > 0 and e.key != "cudaDeviceSynchronize"}


def kernel_differences(dyn: dict[str, float], static: dict[str, float], top: int = 6) -> str:
    """The kernels whose time differs most between the two programs, largest first."""
    names = sorted(set(dyn) | set(static), key=lambda k: -abs(dyn.get(k, 0.0) - static.get(k, 0.0)))
    return "; ".join(f"{k[:70]} {dyn.get(k, 0.0) * 1e3:.1f} / {static.get(k, 0.0) * 1e3:.1f} us"
                     for k in names[:top])


def driver_calls(fn, reps: int, flush: bool) -> dict[str, tuple[float, float]]:
    """The CUDA runtime and driver calls a call makes: name -> (calls, us) per call, from the
    profiler's CPU activity; ``flush``: each call behind a queued L2 flush, as :func:`timed` makes
    them (a call that waits for the device shows there)."""
    from torch.profiler import ProfilerActivity, profile

    scratch = torch.empty(64 << 20, dtype=torch.int8, device="cuda")
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            if flush:
                scratch.zero_()
            fn()
            torch.cuda.synchronize()
    out = {}
    for e in prof.key_averages():
        if e.key.startswith(("cuda", "cu")) and e.key != "cudaDeviceSynchronize":
            out[e.key] = (e.count / reps, e.cpu_time_total / reps)
    return out


def host_ms(fns: dict[str, object], reps: int) -> dict[str, float]:
    """The host's time to issue a call (ms, median), each from an idle device (a synchronize before,
    so a full queue never throttles the host), the callables interleaved."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            torch.cuda.synchronize()
            t = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t) * 1e3)
    torch.cuda.synchronize()
    return {name: statistics.median(t) for name, t in times.items()}


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
    tune = [f"{n}={','.join(str(v) for _, v in grid)}" for n, grid in zip((r.split("=")[0] for r in ranges), grids)]
    o = D.build_dynamic(Path(file), ranges, precision=precision, out=out / f"{stem}-dynamic", arch=arch,
                        tune_shapes=tune)
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
            want = copy.deepcopy(model).double()(*[x.double() if x.is_floating_point() else x for x in xs])
            torch.cuda.synchronize()
            t = time.perf_counter()
            first = dyn(*xs)  # its first call at this shape: the library's plans timed, a graph captured
            torch.cuda.synchronize()
            t_first = (time.perf_counter() - t) * 1e3
            e_dyn, e_static = error(first, want), error(static(*xs), want)
            compiled = torch.compile(model)
            if compiled_dyn is None:
                compiled_dyn = torch.compile(copy.deepcopy(model), dynamic=True)
            t = timed({"dyn": lambda: dyn(*xs), "static": lambda: static(*xs), "eager": lambda: model(*xs),
                       "compile": lambda: compiled(*xs), "compile_dyn": lambda: compiled_dyn(*xs)}, reps)
            t_dyn, t_static, t_eager, t_comp, t_cdyn = (t[k] for k in ("dyn", "static", "eager", "compile", "compile_dyn"))
            kd, ks = kernels(lambda: dyn(*xs), reps), kernels(lambda: static(*xs), reps)
            k_dyn, k_static = sum(kd.values()), sum(ks.values())
            if k_dyn > 1.02 * k_static:
                print(f"{stem} {label}: kernels dynamic / static: {kernel_differences(kd, ks)}", file=sys.stderr)
            h = host_ms({"dyn": lambda: dyn(*xs), "static": lambda: static(*xs)}, reps)
            h_dyn, h_static = h["dyn"], h["static"]
            side = torch.cuda.Stream()
            with torch.cuda.stream(side):  # a stream of its own: the programs replay CUDA graphs there
                g = timed({"dyn": lambda: dyn(*xs), "static": lambda: static(*xs)}, reps)
            print(f"{stem} {label} on a side stream: dynamic {g['dyn']:.3f} ms, static {g['static']:.3f} ms "
                  f"({g['dyn'] / g['static']:.3f})", file=sys.stderr)
            if not rows:  # the first shape: what each program asks of CUDA a call (a wait shows its time)
                for name, fn in (("dynamic", lambda: dyn(*xs)), ("static", lambda: static(*xs))):
                    calls = driver_calls(fn, 20, flush=True)
                    print(f"{stem} {label} {name}: " + ", ".join(
                        f"{k} {n:g}x {us:.1f} us" for k, (n, us) in sorted(calls.items(), key=lambda kv: -kv[1][1])),
                        file=sys.stderr)
        rows.append(f"| {stem} | {label} | {t_dyn:.3f} | {t_static:.3f} | **{t_dyn / t_static:.3f}** | "
                    f"{t_eager:.3f} | {t_comp:.3f} | {t_cdyn:.3f} | {t_comp / t_dyn:.2f}x | {t_cdyn / t_dyn:.2f}x | "
                    f"{e_dyn:.1e} / {e_static:.1e} | {k_dyn:.3f} / {k_static:.3f} | {h_dyn:.3f} / {h_static:.3f} | {t_first:.1f} |")
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
            "kernels ms dyn / static | host ms dyn / static | dynamic's first call ms |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
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
