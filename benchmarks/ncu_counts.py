"""The cost model's FLOP and byte counts against Nsight Compute's, per task, on a GPU machine.

For each program of a sample (small references of every task kind — the convolutions of
tests/test_costs.py, strided, grouped, depthwise and transposed ones among them — and, with
``--problems``, KernelBench development problems) the program is built at ``fp32`` (exact fp32
math: no tensor cores, so FLOPs are SIMT instructions that ncu counts), run once to create it and
once more so its CUDA graph is captured, then run a third time inside a profiler range under

    ncu --profile-from-start off --graph-profiling node --cache-control all --replay-mode kernel \\
        --csv --page raw --print-units base --metrics <FLOP and DRAM metrics>

``--cache-control all`` flushes the caches before each kernel, so DRAM bytes are the bytes a kernel
must move from a cold cache (what the cost model's "fewest bytes" estimates); FLOPs are
``fadd + fmul + 2 ffma`` (fp32 thread instructions; the fp16/bf16 ones likewise when asked with
``--half``). Kernels are given to tasks as the Verifier's profile does
(``stitchcuda.verifier.measure.cupti``: a kernel named after its task is that task's; library
kernels take the tasks between the named ones, in program order).

The report (markdown, and JSON lines with ``--json``) lists per task: kind, the plan's GFLOP and MB,
ncu's, and their ratios; a ratio outside ``--tolerance`` (default: a factor of 2) is flagged. Expect
FLOP ratios near 1 for GEMMs and direct convolutions (cuDNN may pick a Winograd or FFT engine,
which does fewer multiplications: a ratio below 1 there is the algorithm, not the model), and DRAM
ratios at or above 1 (the model counts each distinct element once; tiles re-read from DRAM and
write-allocate traffic add to it). A transposed convolution counted over its output instead of its
input shows as a FLOP ratio of 1/16 for a 4x4 kernel at stride 4.

    python benchmarks/ncu_counts.py                           # the sample, report on stdout
    python benchmarks/ncu_counts.py --problems 1:1,2:12,3:4 --json ncu.jsonl --out runs/ncu
    python benchmarks/ncu_counts.py --only conv_transposed_k4s4 --keep
    python benchmarks/ncu_counts.py --parse FILE.csv --program DIR   # re-read a saved ncu CSV

Needs a GPU, ncu (``--ncu``, else ``$NCU`` or the one on PATH / in the CUDA toolkit) with
permission to read the performance counters, PyTorch and the stitchcuda build toolchain.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

FP32_METRICS = ("sm__sass_thread_inst_executed_op_fadd_pred_on.sum", "sm__sass_thread_inst_executed_op_fmul_pred_on.sum",
                "sm__sass_thread_inst_executed_op_ffma_pred_on.sum")
HALF_METRICS = ("sm__sass_thread_inst_executed_op_hadd_pred_on.sum", "sm__sass_thread_inst_executed_op_hmul_pred_on.sum",
                "sm__sass_thread_inst_executed_op_hfma_pred_on.sum")
DRAM_METRICS = ("dram__bytes_read.sum", "dram__bytes_write.sum")


# ---------------------------------------------------------------------- the sample


def sample() -> dict[str, Callable[[], tuple[Any, list]]]:
    """name -> builder of (module, example inputs): one or more programs per task kind."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    from tests.test_costs import CONVS
    from tests.test_coverage_cases import Fn

    def conv(spec):
        nsp, tr, cin, cout, kernel, stride, padding, dilation, groups, opad, size = spec
        Conv = (nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d)[nsp - 1] if tr else \
            (nn.Conv1d, nn.Conv2d, nn.Conv3d)[nsp - 1]
        kw = dict(stride=stride, padding=padding, dilation=dilation, groups=groups)
        if tr:
            kw["output_padding"] = opad
        # the sizes of tests/test_costs.py, scaled so that the kernels are not launch-bound
        big = tuple(s * 8 for s in size) if nsp < 3 else tuple(s * 3 for s in size)
        return lambda: (Fn(lambda s, x: s.c(x), c=Conv(cin * 8, cout * 8, kernel, **kw)),
                        [torch.randn(8, cin * 8, *big)])

    out: dict[str, Callable[[], tuple[Any, list]]] = {f"conv_{k}": conv(v) for k, v in CONVS.items()}
    out.update({
        "linear_bias_gelu": lambda: (Fn(lambda s, x: F.gelu(s.fc(x)), fc=nn.Linear(1024, 2048)),
                                     [torch.randn(2048, 1024)]),
        "bmm": lambda: (Fn(lambda s, x, y: torch.bmm(x, y)), [torch.randn(16, 256, 512), torch.randn(16, 512, 384)]),
        "softmax": lambda: (Fn(lambda s, x: torch.softmax(x, -1)), [torch.randn(4096, 2048)]),
        "layer_norm": lambda: (Fn(lambda s, x: s.ln(x), ln=nn.LayerNorm(1024)), [torch.randn(8192, 1024)]),
        "sum_middle_axis": lambda: (Fn(lambda s, x: x.sum(1)), [torch.randn(64, 512, 256)]),
        "fused_elementwise": lambda: (Fn(lambda s, x, y: torch.relu(x) * y + 1), [torch.randn(4096, 4096),
                                                                                 torch.randn(4096)]),
        "max_pool_3x3_s1": lambda: (Fn(lambda s, x: F.max_pool2d(x, 3, 1, 1)), [torch.randn(16, 64, 64, 64)]),
        "avg_pool_2x2": lambda: (Fn(lambda s, x: F.avg_pool2d(x, 2)), [torch.randn(16, 64, 64, 64)]),
        "batch_norm_train": lambda: (Fn(lambda s, x: s.bn(x), bn=nn.BatchNorm2d(64)), [torch.randn(16, 64, 64, 64)]),
        "group_norm": lambda: (Fn(lambda s, x: s.gn(x), gn=nn.GroupNorm(8, 64)), [torch.randn(16, 64, 64, 64)]),
        "cumsum": lambda: (Fn(lambda s, x: torch.cumsum(x, 1)), [torch.randn(512, 4096)]),
        "argmax": lambda: (Fn(lambda s, x: x.argmax(1)), [torch.randn(512, 4096)]),
        "attention": lambda: (Fn(lambda s, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)),
                              [torch.randn(4, 8, 1024, 64)] * 3),
        "lstm": lambda: (Fn(lambda s, x: s.r(x)[0], r=nn.LSTM(256, 256)), [torch.randn(64, 32, 256)]),
        "gather_flip": lambda: (Fn(lambda s, x: x.flip(1) * 2), [torch.randn(4096, 4096)]),
    })
    return out


# ---------------------------------------------------------------------- running under ncu

RUNNER = r'''
import sys, torch
from cuda.bindings import runtime as rt
from stitchcuda.program import Program
prog = Program.load(sys.argv[1])
g = torch.Generator(device="cuda").manual_seed(0)
xs = [torch.randn(s.shape, generator=g, device="cuda").to(getattr(torch, s.dtype)) if s.dtype.startswith(("float", "bfloat"))
      else torch.zeros(s.shape, dtype=getattr(torch, s.dtype), device="cuda") for s in prog.inputs]
prog(*xs); prog(*xs)                     # create, then the call that captures the CUDA graph
torch.cuda.synchronize()
rt.cudaProfilerStart()
prog(*xs)
torch.cuda.synchronize()
rt.cudaProfilerStop()
'''


def find_ncu(explicit: str | None) -> str:
    for c in (explicit, os.environ.get("NCU"), shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if c and Path(c).is_file():
            return c
    raise SystemExit("ncu not found: pass --ncu PATH or set NCU")


def profile(ncu: str, program_dir: Path, metrics: Sequence[str], timeout: float) -> str:
    """ncu's raw CSV for one run of the program in ``program_dir``."""
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(RUNNER)
        runner = f.name
    cmd = [ncu, "--profile-from-start", "off", "--graph-profiling", "node", "--cache-control", "all",
           "--replay-mode", "kernel", "--csv", "--page", "raw", "--print-units", "base",
           "--metrics", ",".join(metrics), sys.executable, runner, str(program_dir)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        os.unlink(runner)
    if r.returncode != 0:
        raise RuntimeError(f"ncu failed ({r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


# ---------------------------------------------------------------------- reading its CSV


@dataclass(frozen=True)
class Kernel:
    name: str
    flops: float
    dram_bytes: float


def _number(text: str) -> float:
    text = (text or "").strip().replace(",", "")
    try:
        return float(text)
    except ValueError:
        return 0.0


def parse_csv(text: str, half: bool = False) -> list[Kernel]:
    """Kernels in launch order from ncu's ``--csv --page raw`` output (its own log lines, which start
    with ``==``, and the units row skipped)."""
    lines = [ln for ln in text.splitlines() if ln.strip() and not ln.startswith("==")]
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        return []
    rows = list(csv.DictReader(io.StringIO("\n".join(lines[start:]))))
    out = []
    for row in rows:
        if not (row.get("ID") or "").strip().isdigit():
            continue  # the units row
        m = {k: _number(v) for k, v in row.items() if k and "__" in k}
        flops = m.get(FP32_METRICS[0], 0) + m.get(FP32_METRICS[1], 0) + 2 * m.get(FP32_METRICS[2], 0)
        if half:
            flops += m.get(HALF_METRICS[0], 0) + m.get(HALF_METRICS[1], 0) + 2 * m.get(HALF_METRICS[2], 0)
        out.append(Kernel(row.get("Kernel Name", ""), flops, sum(m.get(k, 0) for k in DRAM_METRICS)))
    return out


# ---------------------------------------------------------------------- kernels to tasks, and the report


@dataclass(frozen=True)
class Row:
    program: str
    task: str
    kind: str
    kernels: int
    plan_flops: int
    ncu_flops: float
    plan_bytes: int
    ncu_bytes: float

    @property
    def flop_ratio(self) -> float | None:
        return self.ncu_flops / self.plan_flops if self.plan_flops else None

    @property
    def byte_ratio(self) -> float | None:
        return self.ncu_bytes / self.plan_bytes if self.plan_bytes else None


def compare(program: str, kernels: Sequence[Kernel], tasks: Sequence[Any], kinds: dict[str, str]) -> list[Row]:
    """Rows per run-phase task: the plan's counts and the sum over the kernels given to it (kernels
    no task claims are one row, ``(unclaimed)``)."""
    from stitchcuda.verifier.measure.cupti import match_task, place_unnamed, short_name

    run = [t for t in tasks if getattr(t, "phase", "run") == "run"]
    owner = [(t.name if (t := match_task(short_name(k.name), run)) else "") for k in kernels]
    place_unnamed(owner, run)
    rows = []
    for t in run:
        mine = [k for k, o in zip(kernels, owner) if o == t.name]
        rows.append(Row(program, t.name, kinds.get(t.name, ""), len(mine), int(t.flops),
                        sum(k.flops for k in mine), int(t.bytes), sum(k.dram_bytes for k in mine)))
    rest = [k for k, o in zip(kernels, owner) if not o]
    if rest:
        rows.append(Row(program, "(unclaimed)", "", len(rest), 0, sum(k.flops for k in rest), 0,
                        sum(k.dram_bytes for k in rest)))
    return rows


def flagged(r: Row, tolerance: float) -> list[str]:
    out = []
    for what, ratio in (("FLOPs", r.flop_ratio), ("bytes", r.byte_ratio)):
        if ratio is not None and not (1 / tolerance <= ratio <= tolerance):
            out.append(f"{what} x{ratio:.2g}")
    if r.plan_flops == 0 and r.ncu_flops > 1e6:
        out.append("FLOPs the plan does not count")
    return out


def markdown(rows: Sequence[Row], tolerance: float) -> str:
    def ratio(x: float | None) -> str:
        return "-" if x is None else f"{x:.2f}"

    lines = ["| program | task | kind | kernels | plan GFLOP | ncu GFLOP | ratio | plan MB | ncu DRAM MB | ratio | |",
             "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        lines.append(f"| {r.program} | `{r.task}` | {r.kind} | {r.kernels} | {r.plan_flops / 1e9:.4f} | "
                     f"{r.ncu_flops / 1e9:.4f} | {ratio(r.flop_ratio)} | {r.plan_bytes / 1e6:.3f} | "
                     f"{r.ncu_bytes / 1e6:.3f} | {ratio(r.byte_ratio)} | {', '.join(flagged(r, tolerance))} |")
    bad = [r for r in rows if flagged(r, tolerance)]
    lines.append("")
    lines.append(f"{len(rows)} rows, {len(bad)} outside a factor of {tolerance:g}")
    return "\n".join(lines)


def task_kinds(plan: Any) -> dict[str, str]:
    return {t.name: type(t.params).__name__.removesuffix("Spec") for t in plan.tasks}


def load_tasks(program_dir: Path) -> tuple[list[Any], dict[str, str]]:
    """The manifest's tasks (in run order) and, from the plan file where one is kept, their kinds."""
    from stitchcuda import manifest as mf

    prog = mf.load_program_dir(program_dir, require_weights=False)
    kinds: dict[str, str] = {}
    plan_file = Path(program_dir) / "plan.json"
    if plan_file.is_file():
        from stitchcuda import plan as P

        kinds = task_kinds(P.Plan.from_json(plan_file.read_text()))
    return list(prog.manifest.tasks), kinds


# ---------------------------------------------------------------------- main


def build(name: str, make: Callable[[], tuple[Any, list]], out: Path) -> tuple[Path, dict[str, str]]:
    import stitchcuda

    model, inputs = make()
    o = stitchcuda.build_program(model, example_inputs=inputs, precision="fp32", out=out / name, name=name,
                                 quiet=True)
    if not o.ok:
        raise RuntimeError(f"{name}: the build failed: {o.build.message if o.build else ''}")
    return o.directory, task_kinds(o.plan)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="NAME", help="only these programs of the sample")
    ap.add_argument("--problems", default="", help="KernelBench problems too, as L:ID,L:ID (kernelbench:L:ID)")
    ap.add_argument("--out", type=Path, default=None, help="where the programs are built (default: a temp folder)")
    ap.add_argument("--keep", action="store_true", help="keep the programs and the raw CSV files")
    ap.add_argument("--ncu", default=None, help="the ncu binary")
    ap.add_argument("--half", action="store_true", help="count fp16 / bf16 instructions too")
    ap.add_argument("--tolerance", type=float, default=2.0, help="flag ratios outside [1/T, T] (default 2)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per program under ncu")
    ap.add_argument("--json", type=Path, default=None, help="append one JSON line per row")
    ap.add_argument("--parse", type=Path, default=None, help="compare a saved ncu CSV instead of profiling")
    ap.add_argument("--program", type=Path, default=None, help="with --parse: the program folder it is of")
    ap.add_argument("--list", action="store_true", help="list the sample and exit")
    a = ap.parse_args(argv)

    metrics = FP32_METRICS + (HALF_METRICS if a.half else ()) + DRAM_METRICS
    if a.parse:
        if a.program is None:
            ap.error("--parse needs --program")
        tasks, kinds = load_tasks(a.program)
        rows = compare(a.program.name, parse_csv(a.parse.read_text(), a.half), tasks, kinds)
        print(markdown(rows, a.tolerance))
        return 0
    programs = sample()
    if a.list:
        print("\n".join(programs))
        return 0
    if a.only:
        unknown = [n for n in a.only if n not in programs]
        if unknown:
            ap.error(f"not in the sample: {', '.join(unknown)} (see --list)")
        programs = {n: programs[n] for n in a.only}
    ncu = find_ncu(a.ncu)
    out = a.out or Path(tempfile.mkdtemp(prefix="stitchcuda-ncu-"))
    todo: list[tuple[str, Path, dict[str, str]]] = []
    for name, make in programs.items():
        d, kinds = build(name, make, out)
        todo.append((name, d, kinds))
    for key in filter(None, a.problems.split(",")):
        import stitchcuda

        name = "kb_" + key.replace(":", "_")
        o = stitchcuda.build_program(f"kernelbench:{key}", precision="fp32", out=out / name, quiet=True)
        todo.append((name, o.directory, task_kinds(o.plan)))
    rows: list[Row] = []
    for name, d, kinds in todo:
        text = profile(ncu, d, metrics, a.timeout)
        if a.keep:
            (d / "ncu.csv").write_text(text)
        tasks, _ = load_tasks(d)
        got = compare(name, parse_csv(text, a.half), tasks, kinds)
        rows += got
        print(f"{name}: {len(got)} rows", flush=True)
        if a.json:
            with open(a.json, "a", encoding="utf-8") as f:
                for r in got:
                    f.write(json.dumps(dict(asdict(r), flop_ratio=r.flop_ratio, byte_ratio=r.byte_ratio)) + "\n")
    print(markdown(rows, a.tolerance))
    if not a.keep and a.out is None:
        shutil.rmtree(out, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
