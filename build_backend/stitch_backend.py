"""PEP 517 backend: scikit-build-core, plus NVIDIA's CUDA wheels when the machine has no toolkit.

CUDA comes from a system toolkit when one is found (CUDACXX, CUDA_HOME / CUDA_PATH, nvcc on
PATH, /usr/local/cuda). Otherwise the build asks for NVIDIA's PyPI wheels (nvcc, cudart, the
headers nvcc needs) and points CMake at them, so a machine with only a driver and pip builds.
cuBLAS always comes from the ``nvidia-cublas`` wheel unless the toolkit has it (see
cmake/FindCublasLt.cmake); cuDNN from the ``nvidia-cudnn-cu13`` wheel unless the system has one
(cmake/FindCudnn.cmake). ``STITCHCUDA_CUDA_FROM_WHEELS=1`` forces the wheel route.

The CMake build folder persists (``build-dir`` in pyproject.toml) so that a second ``pip install``
of the same checkout compiles nothing again. pip builds each time in a new isolated environment,
and the header folders of the build requirements (cuBLASLt's, cuDNN's, pybind11's) would change path with
it, and with them every compile command: :func:`_stable_build_requirements` mirrors them into
``build/deps/`` (a file is copied only when its content changed, so its time stamp, which Ninja
reads, stays) and points CMake there. scikit-build-core clears the CMake cache and objects when
the isolated environment changed, because cached paths may point into the old one; with those
paths mirrored, :func:`_keep_build_folder` tells it the folder is this environment's. Should the
reused configuration fail anyway, the build runs again from a cleared folder.
"""

from __future__ import annotations

import json
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


def _mirror(src: Path, dst: Path) -> None:
    """``dst`` holds the files of ``src``: headers copied when their content differs, shared
    libraries linked (their folder is only linked against)."""
    for f in src.rglob("*"):
        if f.is_dir():
            continue
        out = dst / f.relative_to(src)
        out.parent.mkdir(parents=True, exist_ok=True)
        if ".so" in f.name:
            if out.is_symlink() or out.exists():
                if out.resolve() == f.resolve():
                    continue
                out.unlink()
            out.symlink_to(f)
        elif not out.is_file() or out.read_bytes() != f.read_bytes():
            shutil.copyfile(f, out)


def _stable_build_requirements() -> None:
    root = Path("build") / "deps"
    try:
        import nvidia
    except ImportError:
        nvidia = None
    mirrored = False
    # (folder under nvidia/, a header and a library that say the wheel is there)
    for sub, header, lib in (("cu13", "cublasLt.h", "libcublasLt.so.13"), ("cudnn", "cudnn_graph.h", "libcudnn.so.9")):
        for base in (nvidia.__path__ if nvidia is not None else []):
            d = Path(base) / sub
            if (d / "include" / header).is_file() and (d / "lib" / lib).exists():
                for part in ("include", "lib"):
                    _mirror(d / part, root / "py" / "nvidia" / sub / part)
                mirrored = True
                break
    if mirrored:
        # FindCublasLt.cmake and FindCudnn.cmake ask Python where `nvidia` is: the mirror comes first
        os.environ["PYTHONPATH"] = str((root / "py").resolve()) + os.pathsep + os.environ.get("PYTHONPATH", "")
    try:
        import pybind11
    except ImportError:
        return
    src = Path(pybind11.__file__).parent
    _mirror(src, root / "pybind11")
    cmake_dir = (root / "pybind11" / "share" / "cmake" / "pybind11").resolve()
    if cmake_dir.is_dir():
        os.environ["CMAKE_ARGS"] = (os.environ.get("CMAKE_ARGS", "") + f" -Dpybind11_DIR={cmake_dir}").strip()


def _keep_build_folder() -> list[Path]:
    """Mark the persistent build folders as this isolated environment's; returns them."""
    import scikit_build_core

    here = str(Path(scikit_build_core.__file__).parent)
    kept = []
    for info in Path("build").glob("*/.skbuild-info.json"):
        try:
            data = json.loads(info.read_text())
        except (OSError, ValueError):
            continue
        if data.get("skbuild_path") != here and (info.parent / "CMakeCache.txt").is_file():
            data["skbuild_path"] = here
            info.write_text(json.dumps(data, indent=2))
            kept.append(info.parent)
    return kept


def _build(build, *args):
    kept = _keep_build_folder()
    try:
        return build(*args)
    except Exception:
        if not kept:
            raise
        sys.stderr.write("stitchcuda: the reused CMake build failed; building again from a clear folder\n")
        for d in kept:
            (d / "CMakeCache.txt").unlink(missing_ok=True)
            shutil.rmtree(d / "CMakeFiles", ignore_errors=True)
        return build(*args)


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
    _stable_build_requirements()
    return _build(_skb.build_wheel, wheel_directory, config_settings, metadata_directory)


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    _point_cmake_at_wheels()
    _stable_build_requirements()
    return _build(_skb.build_editable, wheel_directory, config_settings, metadata_directory)


def build_sdist(sdist_directory, config_settings=None):
    return _skb.build_sdist(sdist_directory, config_settings)


prepare_metadata_for_build_wheel = getattr(_skb, "prepare_metadata_for_build_wheel", None)
if prepare_metadata_for_build_wheel is None:
    del prepare_metadata_for_build_wheel
