"""Create the example program in this process with host weights (run under a debugger to
locate a crash in the program ABI path)."""
import sys
import tempfile
from pathlib import Path

import numpy as np

import stitchcuda
from stitchcuda import rt, toolchain

warm = len(sys.argv) > 1 and sys.argv[1] == "warm"
if warm:
    print("devices", rt.device_count(), flush=True)
with tempfile.TemporaryDirectory() as tmp:
    so = Path(tmp) / "ex.so"
    res = toolchain.compile_program(stitchcuda.PACKAGE_DIR / "examples" / "example_mlp.cu", so, arch="sm_90",
                                    extra=("-g",))
    assert res.ok, res.output
    w = [np.random.rand(512, 256).astype("f4"), np.random.rand(512).astype("f4"),
         np.random.rand(128, 512).astype("f4"), np.random.rand(128).astype("f4")]
    lib = rt.ProgramLibrary(str(so))
    print("creating", flush=True)
    inst = lib.create(w)
    print("created", flush=True)
    inst.close()
    print("ok", flush=True)
