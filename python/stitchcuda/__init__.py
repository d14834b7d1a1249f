"""stitchcuda: a PyTorch reference program in, a verified, self-contained CUDA program out.

The native runtime is ``stitchcuda._rt`` (re-exported here as ``stitchcuda.rt``); it needs no
PyTorch. Tensors cross it through DLPack.
"""

from __future__ import annotations

import ctypes
from pathlib import Path



def _preload_nvidia_libraries() -> None:
    """Load cuBLASLt and cuDNN from NVIDIA's wheels before the runtime asks the loader for them.

    libstitchrt carries rpaths to the wheels' folders; this covers layouts where those relative
    paths do not hold (editable installs, vendored site-packages).
    """
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return
    for rel in ("cu13/lib/libcublasLt.so.13", "cudnn/lib/libcudnn.so.9"):
        for base in nvidia.__path__:
            lib = Path(base) / rel
            if lib.is_file():
                try:
                    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
                except OSError:
                    continue
                break


_preload_nvidia_libraries()

from . import _rt as rt  # noqa: E402
from ._rt import (  # noqa: E402
    ArgumentError,
    CublasError,
    CudnnError,
    CudaError,
    NoDeviceError,
    NotSupportedError,
    OutOfMemoryError,
    StitchError,
)

from .device import has_gpu  # noqa: E402
from .errors import MachineError  # noqa: E402
from .paths import INCLUDE_DIR, LIB_DIR, PACKAGE_DIR  # noqa: E402,F401
from .paths import VERSION as __version__  # noqa: E402


def __getattr__(name: str):
    """``build_program``, ``build_dynamic``, ``optimize``, ``Program`` and the build's errors on first use (capture needs
    PyTorch; running does not)."""
    if name == "build_program":
        from .pipeline import build_program

        return build_program
    if name == "build_dynamic":
        from .dynamic import build_dynamic

        return build_dynamic
    if name == "Program":
        from .program import Program

        return Program
    if name == "optimize":
        from .workflow import optimize

        return optimize
    if name in ("BuildInputError", "BuildEnvironmentError"):
        from . import pipeline

        return getattr(pipeline, name)
    raise AttributeError(f"module 'stitchcuda' has no attribute {name!r}")


__all__ = [
    "build_program",
    "build_dynamic",
    "optimize",
    "Program",
    "rt",
    "has_gpu",
    "StitchError",
    "ArgumentError",
    "MachineError",
    "BuildInputError",
    "BuildEnvironmentError",
    "CudaError",
    "CublasError",
    "CudnnError",
    "NoDeviceError",
    "OutOfMemoryError",
    "NotSupportedError",
    "PACKAGE_DIR",
    "INCLUDE_DIR",
    "LIB_DIR",
    "__version__",
]
