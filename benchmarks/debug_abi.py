"""Create the example program with weights from several sources, each in its own process, to
find which combination the C ABI path mishandles (a crash is reported by exit status)."""
import subprocess
import sys
import tempfile
from pathlib import Path

import stitchcuda
from stitchcuda import toolchain

CASES = {
    "numpy_host": "import numpy as np; w=[np.random.rand(512,256).astype('f4'), np.random.rand(512).astype('f4'), np.random.rand(128,512).astype('f4'), np.random.rand(128).astype('f4')]",
    "torch_host": "import torch; w=[torch.randn(512,256), torch.randn(512), torch.randn(128,512), torch.randn(128)]",
    "torch_cuda": "import torch; w=[torch.randn(512,256,device='cuda'), torch.randn(512,device='cuda'), torch.randn(128,512,device='cuda'), torch.randn(128,device='cuda')]",
    "torch_mixed": "import torch; w=[torch.randn(512,256), torch.randn(512), torch.randn(128,512).cuda(), torch.randn(128).cuda()]",
    "torch_host_after_cuda_init": "import torch; torch.zeros(1,device='cuda'); w=[torch.randn(512,256), torch.randn(512), torch.randn(128,512), torch.randn(128)]",
}
with tempfile.TemporaryDirectory() as tmp:
    so = Path(tmp) / "ex.so"
    res = toolchain.compile_program(stitchcuda.PACKAGE_DIR / "examples" / "example_mlp.cu", so)
    assert res.ok, res.output
    for name, setup in CASES.items():
        code = f"import faulthandler; faulthandler.enable(); from stitchcuda import rt; {setup}; lib=rt.ProgramLibrary({str(so)!r}); print('creating', flush=True); inst=lib.create(w); print('created', flush=True); inst.close(); print('ok')"
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        print(f"{name}: rc={r.returncode} {r.stdout.strip()!r} {r.stderr.strip()[-600:]!r}")
