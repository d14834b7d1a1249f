"""stitchcuda: a PyTorch reference program in, a verified, self-contained CUDA program out.

The native runtime is ``stitchcuda._rt`` (re-exported here as ``stitchcuda.rt``); it needs no
PyTorch. Tensors cross it through DLPack.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

__version__ = "0.1.0"


def _preload_cublaslt() -> None:
    """Load cuBLASLt from NVIDIA's wheel before the runtime asks the loader for it.

    libstitchrt carries an rpath to the wheel's folder; this covers layouts where that
    relative path does not hold (editable installs, vendored site-packages).
    """
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return
    for base in nvidia.__path__:
        lib = Path(base) / "cu13" / "lib" / "libcublasLt.so.13"
        if lib.is_file():
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return


_preload_cublaslt()

from . import _rt as rt  # noqa: E402
from ._rt import (  # noqa: E402
    ArgumentError,
    CublasError,
    CudaError,
    NoDeviceError,
    NotSupportedError,
    OutOfMemoryError,
    StitchError,
)

from .paths import INCLUDE_DIR, LIB_DIR, PACKAGE_DIR  # noqa: E402,F401


def has_gpu() -> bool:
    """True when a CUDA device is usable."""
    if os.environ.get("STITCHCUDA_FORCE_NO_GPU") == "1":
        return False
    return rt.device_count() > 0


def __getattr__(name: str):
    """``build_program`` and ``Program`` on first use (capture needs PyTorch; running does not)."""
    if name == "build_program":
        from .pipeline import build_program

        return build_program
    if name == "Program":
        from .program import Program

        return Program
    raise AttributeError(f"module 'stitchcuda' has no attribute {name!r}")


__all__ = [
    "build_program",
    "Program",
    "rt",
    "has_gpu",
    "StitchError",
    "ArgumentError",
    "CudaError",
    "CublasError",
    "NoDeviceError",
    "OutOfMemoryError",
    "NotSupportedError",
    "PACKAGE_DIR",
    "INCLUDE_DIR",
    "LIB_DIR",
    "__version__",
]
