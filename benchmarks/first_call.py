"""Where a program's first call goes: fresh processes time calls 1..10 of a built program under
variations: the instance prepared when created (one call on zeros) or not, the folder's tuning file or
not, one convolution candidate built instead of the ranked list, CUDA modules loaded eagerly.

    python benchmarks/first_call.py PROGRAM_DIR
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

PROBE = r"""
import json, sys, time
import torch
from stitchcuda.program import Program

prog = Program.load(sys.argv[1])
x = [torch.randn(s.shape, device="cuda").to(getattr(torch, s.dtype)) for s in prog.inputs]
t = time.perf_counter()
prog.instance(0, prepare=sys.argv[2] == "prepare")
torch.cuda.synchronize()
instance_ms = (time.perf_counter() - t) * 1e3
times = []
for k in range(10):
    t = time.perf_counter()
    prog(*x)
    torch.cuda.synchronize()
    times.append((time.perf_counter() - t) * 1e3)
print(json.dumps({"instance_ms": instance_ms, "first_ms": times[0], "second_ms": times[1], "tenth_ms": times[-1],
                  "tuned": prog.tuned, "note": prog.tuning_note, "prepared_ms": prog.prepared_ms}))
"""


def probe(folder: Path, env: dict, prepare: bool = True) -> dict:
    """One fresh process's figures (PROBE), or ``{"error": its stderr's tail}``."""
    r = subprocess.run([sys.executable, "-c", PROBE, str(folder), "prepare" if prepare else "no"],
                       capture_output=True, text=True, timeout=600,
                       env={**os.environ, **env})
    if r.returncode:
        return {"error": r.stderr[-800:]}
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("program", type=Path)
    args = ap.parse_args()
    tuning = args.program / "tuning.txt"
    rows = []
    one = {"STITCHCUDA_CONV_AUTOTUNE": "0", "STITCHCUDA_GEMM_AUTOTUNE": "0"}
    variants = [("tuning file, prepared", {}, True, True), ("no tuning file, prepared", {}, False, True),
                ("tuning file, not prepared", {}, True, False), ("no tuning file, not prepared", {}, False, False),
                ("tuning file, not prepared, modules loaded eagerly", {"CUDA_MODULE_LOADING": "EAGER"}, True, False),
                ("no timing (one candidate), not prepared", one, False, False)]
    with tempfile.TemporaryDirectory() as tmp:
        kept = Path(tmp) / "tuning.txt"
        if tuning.is_file():
            shutil.copy(tuning, kept)
        for name, env, with_file, prepare in variants:
            if with_file and kept.is_file():
                shutil.copy(kept, tuning)
            elif tuning.is_file():
                tuning.unlink()
            rows.append((name, probe(args.program, env, prepare)))
        if kept.is_file():
            shutil.copy(kept, tuning)
    print("| variant | instance created (and prepared) ms | call 1 ms | call 2 ms | call 10 ms | imported choices |")
    print("|---|---|---|---|---|---|")
    for name, r in rows:
        if "error" in r:
            print(f"| {name} | error: {r['error'].splitlines()[-1] if r['error'] else '?'} |")
            continue
        print(f"| {name} | {r['instance_ms']:.1f} | {r['first_ms']:.1f} | {r['second_ms']:.2f} | {r['tenth_ms']:.3f} "
              f"| {r['tuned']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
