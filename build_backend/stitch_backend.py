"""PEP 517 backend: scikit-build-core, plus NVIDIA's CUDA wheels when the machine has no toolkit.

CUDA comes from a system toolkit when one is found (CUDACXX, CUDA_HOME / CUDA_PATH, nvcc on
PATH, /usr/local/cuda). Otherwise the build asks for NVIDIA's PyPI wheels (nvcc, cudart, the
headers nvcc needs) and points CMake at them, so a machine with only a driver and pip builds.
cuBLAS always comes from the ``nvidia-cublas`` wheel unless the toolkit has it (see
cmake/FindCublasLt.cmake); cuDNN from the ``nvidia-cudnn-cu13`` wheel unless the system has one
(cmake/FindCudnn.cmake). ``STITCHCUDA_CUDA_FROM_WHEELS=1`` forces the wheel route.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from scikit_build_core import build as _skb

CUDA_WHEELS = [
    "nvidia-cuda-nvcc>=13.0,<14",
    "nvidia-cuda-runtime>=13.0,<14",
    "nvidia-cuda-crt>=13.0,<14",
    "nvidia-cuda-cccl>=13.0,<14",
    "nvidia-nvvm>=13.0,<14",
]


def _system_nvcc() -> str | None:
    if os.environ.get("STITCHCUDA_CUDA_FROM_WHEELS") == "1":
        return None
    for var in ("CUDACXX",):
        if os.environ.get(var) and Path(os.environ[var]).is_file():
            return os.environ[var]
    for var in ("CUDA_HOME", "CUDA_PATH", "CUDAToolkit_ROOT"):
        root = os.environ.get(var)
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    found = shutil.which("nvcc")
    if found:
        return found
    default = Path("/usr/local/cuda/bin/nvcc")
    return str(default) if default.is_file() else None


def _wheel_cuda_root() -> Path | None:
    try:
        import nvidia  # namespace package of NVIDIA's wheels
    except ImportError:
        return None
    for base in nvidia.__path__:
        root = Path(base) / "cu13"
        if (root / "bin" / "nvcc").is_file():
            return root
    return None


def _point_cmake_at_wheels() -> None:
    if _system_nvcc() is not None:
        return
    root = _wheel_cuda_root()
    if root is None:
        sys.stderr.write(
            "stitchcuda: no CUDA toolkit found and no nvidia-cuda-nvcc wheel installed; "
            "install a CUDA 13 toolkit or let pip install the build requirements\n"
        )
        return
    nvcc = root / "bin" / "nvcc"
    nvcc.chmod(nvcc.stat().st_mode | 0o111)
    # The wheels ship only versioned shared libraries (libcudart.so.13); CMake's FindCUDAToolkit
    # looks for the unversioned development names. This is the build's own isolated env.
    for versioned in (root / "lib").glob("lib*.so.*"):
        dev_name = versioned.name.split(".so.")[0] + ".so"
        link = versioned.parent / dev_name
        if not link.exists():
            try:
                link.symlink_to(versioned.name)
            except OSError:
                pass
    os.environ["CUDACXX"] = str(nvcc)
    os.environ["CUDAToolkit_ROOT"] = str(root)
    os.environ["PATH"] = str(root / "bin") + os.pathsep + os.environ.get("PATH", "")
    sys.stderr.write(f"stitchcuda: building with CUDA from NVIDIA's wheels at {root}\n")


def _extra() -> list[str]:
    return [] if _system_nvcc() is not None else list(CUDA_WHEELS)


def get_requires_for_build_wheel(config_settings=None):
    return list(_skb.get_requires_for_build_wheel(config_settings)) + _extra()


def get_requires_for_build_editable(config_settings=None):
    return list(_skb.get_requires_for_build_editable(config_settings)) + _extra()


def get_requires_for_build_sdist(config_settings=None):
    return list(_skb.get_requires_for_build_sdist(config_settings))


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    _point_cmake_at_wheels()
    return _skb.build_wheel(wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _point_cmake_at_wheels()
    return _skb.build_editable(wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _skb.build_sdist(sdist_directory, config_settings)


prepare_metadata_for_build_wheel = getattr(_skb, "prepare_metadata_for_build_wheel", None)
if prepare_metadata_for_build_wheel is None:
    del prepare_metadata_for_build_wheel
