"""compute-sanitizer on one small trial: memory outside the buffers, races, barriers misused.

Guard zones see writes next to a buffer; they do not see a read past its end, a write far away, or
a race that is right almost always. NVIDIA's compute-sanitizer does, at a cost (tens of times
slower), so it runs once, on one small trial, where the problem allows (its inputs, outputs and
weights together at most :data:`MAX_BYTES`, and ``compute-sanitizer`` on the PATH or in the
toolkit): the native runner (no interpreter, no PyTorch: only the program's own work is checked)
under each tool of :data:`TOOLS`, its buffers its own device allocations of exactly the tensors'
sizes, filled from a shared host file:

``memcheck``    an access outside any allocation, a misaligned access, an invalid free
``racecheck``   a shared-memory race (a missing ``__syncthreads``)
``synccheck``   a barrier some threads of a block never reach, or an invalid warp synchronisation

An error is the ``sanitizer`` check, naming the tool, the error and the kernel. A tool that does not
finish in its time limit, or that the machine lacks, is a note, never a verdict.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..report.verdict import DynamicCheck

TOOLS = ("memcheck", "racecheck", "synccheck")
#: The largest trial (inputs + outputs + weights) the sanitizer runs on.
MAX_BYTES = 256 << 20
#: Seconds each tool may take (a tool over it is a note): three tools at most 4.5 minutes in all.
TOOL_SECONDS = 90.0
#: The runtime under a tool picks each GEMM algorithm and convolution engine by cuDNN's and cuBLASLt's
#: heuristics instead of timing the candidates: every candidate timed is one more kernel instrumented
#: (each tens of times slower; suspected first when a 4096^3 GEMM's verification took 256 s and a
#: LeNet-5's 318 s), and which engine runs does not change what the program's own code reads and writes.
TOOL_ENV = {"STITCHCUDA_GEMM_AUTOTUNE": "0", "STITCHCUDA_CONV_AUTOTUNE": "0"}
ERROR_EXIT = 86


def find_sanitizer() -> str | None:
    """``compute-sanitizer`` on the PATH, beside nvcc, or in the usual toolkit folder."""
    hit = shutil.which("compute-sanitizer")
    if hit:
        return hit
    from ...toolchain import find_nvcc

    nvcc = find_nvcc()
    for folder in ([Path(nvcc).parent] if nvcc else []) + [Path("/usr/local/cuda/bin"),
                                                          Path("/usr/local/cuda/compute-sanitizer")]:
        p = folder / "compute-sanitizer"
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


@dataclass(frozen=True)
class ToolReport:
    tool: str
    errors: int
    lines: tuple[str, ...]  # the first error's lines, trimmed
    finished: bool = True
    note: str = ""
    seconds: float = 0.0  # the tool's run, start to end (where the Verifier's time went)
    libraries_left_out: bool = False  # NVIDIA's library kernels not instrumented (LIBRARY_EXCLUDE)


_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+)\s+error", re.I)
_HAZARDS = re.compile(r"RACECHECK SUMMARY:.*?\((\d+)\s+errors?", re.I)
_ERROR_LINE = re.compile(r"^=+\s*(?:ERROR:\s*)?(Invalid |Race reported|Barrier error|Warp|Misaligned|Out-of-range|"
                         r"Address .* is out of bounds|Program hit|Malloc/Free|Cuda API error|Error:)", re.I)
#: the kernel an error names: "at 0x.. in void k(...)" (memcheck) or "at k+0xa50" (racecheck's hazards)
_KERNEL = re.compile(r"\bat (?:0x[0-9a-fA-F]+ in )?(?:void )?([A-Za-z_][\w:<>,~ ]*?)(?:\(|\+0x[0-9a-fA-F]+)")
#: Kernels of NVIDIA's libraries (cuBLAS / cuBLASLt, cuDNN, CUTLASS): racecheck's and synccheck's reports
#: in them are the libraries', not the program's (memcheck's are kept: a wrong leading dimension handed
#: to the library is the program's).
LIBRARY_KERNELS = re.compile(r"cutlass|xmma|cublas|cudnn|nvjet|gemm|sm\d+_|ampere_|hopper_|turing_|volta_|"
                             r"implicit_convolve|winograd|fft|cask", re.I)
#: What racecheck and synccheck leave uninstrumented (``--kernel-name-exclude``): NVIDIA's library kernels
#: by the names only they carry (a subset of :data:`LIBRARY_KERNELS`, whose reports those tools drop
#: anyway; not "gemm", "fft" or "sm90_", which a kernel of the program's could contain). Each instrumented
#: library kernel runs tens of times slower: the sanitizer was 44-97 s of the 50-120 s verifications of
#: cuBLAS- and cuDNN-heavy problems (H200). memcheck keeps every kernel: a wrong leading dimension
#: handed to a library is the program's error, found inside the library's kernel.
#: (".*(...).*": the same whether the tool searches the name or matches all of it)
LIBRARY_EXCLUDE = "regex=.*(cutlass|xmma|cublas|cudnn|nvjet|ampere_|hopper_|turing_|volta_|implicit_convolve|cask).*"
EXCLUDING_TOOLS = ("racecheck", "synccheck")


_excludes: dict[str, bool] = {}


def excludes_libraries(sanitizer: str) -> bool:
    """Whether this ``compute-sanitizer`` takes :data:`LIBRARY_EXCLUDE` (its ``regex`` key is recent):
    asked once per tool path, by running it over ``true`` with the option. A tool that refuses it
    instruments every kernel, as before."""
    if sanitizer not in _excludes:
        true = shutil.which("true") or "/bin/true"
        try:
            r = subprocess.run([sanitizer, "--tool", "racecheck", "--kernel-name-exclude", LIBRARY_EXCLUDE, true],
                               capture_output=True, timeout=60)
            _excludes[sanitizer] = r.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _excludes[sanitizer] = False
    return _excludes[sanitizer]


def parse_report(tool: str, text: str) -> ToolReport:
    """What one tool said (its ``=========`` lines in the runner's log): its errors, each attributed to a
    kernel where the report names one; for racecheck and synccheck, errors in library kernels are
    left out (see :data:`LIBRARY_KERNELS`)."""
    lines = [ln.rstrip() for ln in text.splitlines() if ln.startswith("=")]
    blocks: list[list[str]] = []
    for ln in lines:
        if _ERROR_LINE.search(ln):
            blocks.append([ln])
        elif blocks and not (_SUMMARY.search(ln) or _HAZARDS.search(ln)) and ln.strip("= "):
            blocks[-1].append(ln)
    summary = 0
    for ln in lines:
        m = _SUMMARY.search(ln) or _HAZARDS.search(ln)
        if m:
            summary = max(summary, int(m.group(1)))

    def kernel(block: list[str]) -> str:
        for ln in block:
            m = _KERNEL.search(ln)
            if m:
                return m.group(1).strip()
        return ""

    if tool in ("racecheck", "synccheck"):
        kept = [b for b in blocks if not LIBRARY_KERNELS.search(kernel(b))]
        errors = len(kept) if blocks else summary
    else:
        kept = blocks
        errors = max(summary, len(blocks))
    first = [re.sub(r"^=+\s*", "", x) for x in (kept[0][:6] if kept else [])]
    return ToolReport(tool, errors if kept or not blocks else 0, tuple(x[:200] for x in first))


def run_tool(sanitizer: str, tool: str, runner_exe: str, library: str, device: int,
             tensors: Sequence[tuple[str, Any]], n_weights: int, n_inputs: int,
             seconds: float = TOOL_SECONDS, where: str = "dev") -> ToolReport:
    """One tool over one call: ``tensors`` are (role, tensor) in create/run order — the weights, the
    inputs, then the outputs (contents ignored); their bytes go through a shared host file, into
    device allocations of exactly their size (``where="host"``: left in the file, for a program that
    computes on the host: the CPU tests)."""
    import torch

    from .native import ST_DTYPE, NativeRunner, RunnerDied, RunnerError, RunnerTimeout

    fd = os.memfd_create("stitchcuda-sanitizer", 0)
    try:
        offsets, at = [], 0
        for _, t in tensors:
            offsets.append(at)
            at += ((t.numel() * t.element_size() + 255) // 256) * 256
        os.ftruncate(fd, max(at, 1))
        for (_, t), off in zip(tensors, offsets):
            data = t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            os.pwrite(fd, data, off)
        prefix = [sanitizer, "--tool", tool, "--error-exitcode", str(ERROR_EXIT), "--print-limit", "10"]
        left_out = tool in EXCLUDING_TOOLS and excludes_libraries(sanitizer)
        if left_out:
            prefix += ["--kernel-name-exclude", LIBRARY_EXCLUDE]
        t0 = time.monotonic()
        native = NativeRunner(runner_exe, library, device=device, host_fd=fd, prefix=prefix, timeout=seconds,
                              env=TOOL_ENV)
        finished, note = True, ""
        try:
            ids = []
            for k, ((_, t), off) in enumerate(zip(tensors, offsets)):
                native.call("buf", k + 1, where, off, t.numel() * t.element_size())
                native.call("tensor", 1000 + k, k + 1, ST_DTYPE[t.dtype], t.dim(), *t.shape)
                ids.append(1000 + k)
            w, rest = ids[:n_weights], ids[n_weights:]
            native.call("create", device, len(w), *w)
            ins, outs = rest[:n_inputs], rest[n_inputs:]
            native.call("run", len(ins), *ins, len(outs), *outs)
            native.call("destroy")
            native.call("quit", check=False)
            native.proc.wait(timeout=seconds)
        except (subprocess.TimeoutExpired, RunnerTimeout):
            finished, note = False, f"{tool} did not finish in {seconds:g} s"
        except (RunnerDied, RunnerError) as e:
            note = f"{tool}: the run ended early ({str(e).splitlines()[0][:200]})"
        finally:
            if native.proc.poll() is None:
                native.proc.kill()
                native.proc.wait()
        text = native.log_tail(200_000)
        native.close()
    finally:
        os.close(fd)
    rep = parse_report(tool, text)
    took = round(time.monotonic() - t0, 1)
    if not finished:
        return ToolReport(tool, 0, (), False, note, took, left_out)
    return ToolReport(tool, rep.errors, rep.lines, True, note, took, left_out)


def sanitizer_check(reports: Sequence[ToolReport]) -> DynamicCheck:
    for r in reports:
        if r.errors:
            first = "; ".join(r.lines[:3]) or "see the log"
            # the runner's own word where the program's run ended early under the tool (the tool says
            # only that the process failed; ResNet101's racecheck run said no more than that)
            why = f" ({r.note})" if r.note else ""
            return DynamicCheck("sanitizer", "fail", f"compute-sanitizer {r.tool}: {r.errors} error(s): {first}{why}")
    ran = [r.tool for r in reports if r.finished and not r.note]
    notes = [r.note for r in reports if r.note]
    took = ", ".join(f"{r.tool} {r.seconds:.0f} s" for r in reports if r.seconds)
    skipped = [r.tool for r in reports if r.libraries_left_out]
    text = (f"no error from {', '.join(ran)} on one small trial" if ran else "not judged") + \
        (f" ({'; '.join(notes)})" if notes else "") + (f"; took {took}" if took else "") + \
        (f"; {' and '.join(skipped)} left NVIDIA's library kernels out" if skipped else "")
    return DynamicCheck("sanitizer", "pass", text)


__all__ = ["TOOLS", "MAX_BYTES", "TOOL_SECONDS", "LIBRARY_EXCLUDE", "find_sanitizer", "excludes_libraries",
           "ToolReport", "parse_report", "run_tool", "sanitizer_check"]
