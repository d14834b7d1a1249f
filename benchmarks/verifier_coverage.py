"""Line coverage of the Verifier's child-side code while tests run (the GPU tests, on a GPU machine).

The Verifier judges a program in a child process (``python -m stitchcuda.verifier.worker``); its
correctness trials, dynamic checks, timing and profiling run there, where the tests' own process
cannot see them. This script runs pytest with ``benchmarks/childtrace`` on PYTHONPATH (a
``sitecustomize`` that records, with the standard library alone, the lines every process runs of
the stitchcuda package), then reports per file the lines the *worker children* ran: the child
side of the Verifier (``worker``, ``timing``, the program runner in ``correctness``, the dynamic
checks, the comparisons, the profile). Processes killed by a signal (a crash or hang verdict)
record nothing: their lines count only when another child ran them too.

    python benchmarks/verifier_coverage.py                           # pytest -m gpu tests/gpu/test_verifier_gpu.py
    python benchmarks/verifier_coverage.py --write benchmarks/verifier_coverage.md
    python benchmarks/verifier_coverage.py -- -m gpu tests/gpu        # other pytest arguments
    python benchmarks/verifier_coverage.py --out DIR -- -m gpu ...    # keep the traces: runs split over commands
    python benchmarks/verifier_coverage.py --traces DIR               # report traces already written
"""

from __future__ import annotations

import argparse
import dis
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TRACER = Path(__file__).resolve().parent / "childtrace"
DEFAULT_ARGS = ["-m", "gpu", "tests/gpu/test_verifier_gpu.py"]

#: The child side: the modules whose code runs in the worker process (the first three by the
#: issue's name: the worker, the timing, and the program runner), relative to the verifier package.
CHILD_MODULES = ("run/worker.py", "measure/timing.py", "run/runner.py", "run/correctness.py", "run/session.py",
                 "run/dynamic.py", "run/timed_calls.py", "run/compare.py", "run/inputs.py", "run/harness.py",
                 "run/reference.py", "report/profile.py", "measure/cupti.py", "run/job.py", "run/child.py")


def executable_lines(path: Path) -> set[int]:
    """Lines where a statement starts, in the module and every function and class in it."""
    code = compile(path.read_text(encoding="utf-8"), str(path), "exec")
    lines: set[int] = set()
    stack = [code]
    while stack:
        c = stack.pop()
        lines.update(ln for _, ln in dis.findlinestarts(c) if ln is not None and ln > 0)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_code"))
    return lines


def _ranges(lines: list[int]) -> str:
    out, start, prev = [], None, None
    for ln in lines:
        if start is None:
            start = prev = ln
        elif ln == prev + 1:
            prev = ln
        else:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = prev = ln
    if start is not None:
        out.append(f"{start}" if start == prev else f"{start}-{prev}")
    return ", ".join(out)


def load_traces(folder: Path) -> tuple[dict[str, set[int]], int, int]:
    """(file -> lines run by worker children, number of worker traces, number of traces in all)."""
    hits: dict[str, set[int]] = {}
    workers = total = 0
    for p in sorted(folder.glob("trace-*.json")):
        data = json.loads(p.read_text())
        total += 1
        argv0 = (data.get("argv") or [""])[0]
        if not argv0.replace(os.sep, "/").endswith("verifier/run/worker.py"):
            continue
        workers += 1
        for f, lines in data["files"].items():
            hits.setdefault(f, set()).update(lines)
    return hits, workers, total


def verifier_dir(hits: dict[str, set[int]]) -> Path:
    """The verifier package the children ran (the installed one), found in the traces."""
    for f in hits:
        p = Path(f)
        for d in p.parents:
            if d.name == "verifier" and d.parent.name == "stitchcuda":
                return d
    import stitchcuda.verifier

    return Path(stitchcuda.verifier.__file__).parent


def report(folder: Path) -> tuple[str, float]:
    hits, workers, total = load_traces(folder)
    vdir = verifier_dir(hits)
    rows, run_all, exe_all = [], 0, 0
    for name in CHILD_MODULES:
        path = vdir / name
        if not path.is_file():
            continue
        exe = executable_lines(path)
        ran = hits.get(str(path), set()) & exe
        run_all += len(ran)
        exe_all += len(exe)
        missed = sorted(exe - ran)
        rows.append((name, len(ran), len(exe), missed))
    pct = 100.0 * run_all / exe_all if exe_all else 0.0
    lines = [f"{workers} worker processes traced ({total} processes in all); the Verifier at {vdir}", "",
             "| module | lines run | executable | coverage | not run (lines) |", "|---|---|---|---|---|"]
    for name, r, e, missed in rows:
        shown = _ranges(missed)
        if len(shown) > 400:
            shown = shown[:400].rsplit(",", 1)[0] + ", ..."
        lines.append(f"| `{name}` | {r} | {e} | {100.0 * r / e if e else 0:.0f} % | {shown} |")
    lines.append(f"| **all** | {run_all} | {exe_all} | **{pct:.0f} %** | |")
    return "\n".join(lines) + "\n", pct


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    raw = list(argv)
    pytest_args = DEFAULT_ARGS
    if "--" in argv:
        k = argv.index("--")
        argv, pytest_args = argv[:k], argv[k + 1:]
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--traces", type=Path, help="report the traces in this folder instead of running pytest")
    ap.add_argument("--out", type=Path, help="write the traces here (kept; several runs add up) instead of a "
                                             "temporary folder")
    ap.add_argument("--write", type=Path, metavar="FILE", help="also write the table (with date and command) here")
    a = ap.parse_args(argv)

    t0 = time.monotonic()
    rc = None
    if a.traces is None:
        folder = a.out.resolve() if a.out else Path(tempfile.mkdtemp(prefix="stitchcuda-childtrace-"))
        folder.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ)
        env["STITCHCUDA_COVERAGE_DIR"] = str(folder)
        env["PYTHONPATH"] = os.pathsep.join([str(TRACER)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep)
                                                              if p])
        print(f"pytest {' '.join(pytest_args)}  (traces in {folder})", flush=True)
        rc = subprocess.run([sys.executable, "-m", "pytest", "-q", *pytest_args], cwd=REPO, env=env).returncode
    else:
        folder = a.traces
    table, pct = report(folder)
    print(table)
    if a.write:
        import datetime

        commit = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO, capture_output=True,
                                text=True).stdout.strip() or "unknown"
        cmd = "python benchmarks/verifier_coverage.py " + " ".join(raw)
        head = (f"## Line coverage of the Verifier's child side\n\n{datetime.date.today().isoformat()}, commit {commit}, "
                f"`{cmd.strip()}` (pytest {' '.join(pytest_args)}"
                + (f", exit status {rc}" if rc is not None else "") + f", {(time.monotonic() - t0) / 60:.1f} min)\n\n")
        a.write.write_text(head + table, encoding="utf-8")
        print(f"written: {a.write}")
    return rc if rc else 0


if __name__ == "__main__":
    sys.exit(main())
