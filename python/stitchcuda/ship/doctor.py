"""``stitchcuda doctor``: what this machine has for each part of stitchcuda, and the fix for what
it lacks. Every check is read-only and quick (nothing is compiled; no GPU work beyond asking the
driver what is there)."""

from __future__ import annotations

import ctypes
import importlib
import os
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Check:
    name: str
    status: str        # ok | missing | info
    detail: str
    fix: str = ""
    needed_for: str = ""  # all (building) | run | verify | profile | llm | bench | cluster

    @property
    def mark(self) -> str:
        return {"ok": "ok", "missing": "NO", "info": "--"}[self.status]

    def to_dict(self) -> dict:
        return asdict(self)


def _nvidia_lib(*patterns: str) -> Path | None:
    """A library from NVIDIA's wheels (the ``nvidia`` namespace package)."""
    try:
        import nvidia
    except ImportError:
        return None
    for base in nvidia.__path__:
        for pat in patterns:
            found = sorted(Path(base).glob(pat))
            if found:
                return found[-1]
    return None


def _loadable(*names: str) -> str | None:
    for n in names:
        try:
            ctypes.CDLL(n)
            return n
        except OSError:
            continue
    return None


def _driver() -> Check:
    lib = _loadable("libcuda.so.1", "libcuda.so")
    if lib is None:
        return Check("NVIDIA driver", "missing", "libcuda.so.1 not found",
                     "install the NVIDIA driver, R580 or newer (CUDA 13); needed to run programs", "run")
    v = ctypes.c_int(0)
    ctypes.CDLL(lib).cuDriverGetVersion(ctypes.byref(v))
    major, minor = v.value // 1000, v.value % 1000 // 10
    if major < 13:
        return Check("NVIDIA driver", "missing", f"CUDA {major}.{minor} driver",
                     "upgrade the driver to R580+ (CUDA 13)", "run")
    return Check("NVIDIA driver", "ok", f"CUDA {major}.{minor} driver", "", "run")


def _gpu() -> Check:
    from .. import _rt as rt

    n = rt.device_count()
    if not n:
        return Check("GPU", "missing", "no CUDA device visible",
                     "run on a machine with an NVIDIA GPU (building works without one); check CUDA_VISIBLE_DEVICES",
                     "run")
    info = rt.device_info(0)
    cc = info["compute_capability"]
    return Check("GPU", "ok", f"{n} device(s); device 0 sm_{cc[0]}{cc[1]}, {info['memory_bytes'] / 2**30:.0f} GiB",
                 "", "run")


def _nvcc() -> Check:
    from .. import toolchain

    nvcc = toolchain.find_nvcc()
    if nvcc is None:
        return Check("nvcc", "missing", "not found (CUDACXX, CUDA_HOME, PATH, /usr/local/cuda, NVIDIA's wheel)",
                     "pip install 'stitchcuda[cuda]', or install a CUDA 13 toolkit", "all")
    return Check("nvcc", "ok", f"{nvcc} ({toolchain.nvcc_version(nvcc).split(',')[-1].strip()})", "", "all")


def _cublas() -> Check:
    for line in Path("/proc/self/maps").read_text().splitlines() if Path("/proc/self/maps").exists() else []:
        if "libcublasLt.so" in line:
            return Check("cuBLASLt", "ok", line.split()[-1], "", "all")
    return Check("cuBLASLt", "missing", "libcublasLt.so.13 not loaded", "pip install 'nvidia-cublas>=13,<14'", "all")


def _cudnn() -> Check:
    lib = _nvidia_lib("cudnn/lib/libcudnn.so.9*", "cu13/lib/libcudnn.so.9*")
    if lib is not None:
        return Check("cuDNN", "ok", str(lib), "", "run")
    if _loadable("libcudnn.so.9"):
        return Check("cuDNN", "ok", "libcudnn.so.9 (system)", "", "run")
    return Check("cuDNN", "info", "not found (convolutions will need it)", "pip install nvidia-cudnn-cu13", "run")


def _module(name: str, label: str, fix: str, needed_for: str, attr: str = "__version__", missing: str = "missing"
            ) -> Check:
    try:
        mod = importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - a broken install is as missing as an absent one
        return Check(label, missing, f"not importable ({type(e).__name__})", fix, needed_for)
    return Check(label, "ok", str(getattr(mod, attr, "installed")), "", needed_for)


def _cupti() -> Check:
    try:
        from cupti import cupti

        cupti.get_timestamp()
        return Check("CUPTI", "ok", "cupti-python, libcupti loads", "", "profile")
    except Exception as e:  # noqa: BLE001
        return Check("CUPTI", "info", f"cupti-python unusable ({type(e).__name__}); profiles fall back to "
                                      "torch.profiler", "pip install cupti-python", "profile")


def _torch() -> Check:
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        return Check("PyTorch", "missing", f"not importable ({type(e).__name__})",
                     "pip install torch  (capture and verification need it; a built program does not)", "all")
    cuda = torch.version.cuda or "CPU only"
    return Check("PyTorch", "ok", f"{torch.__version__} ({cuda})", "", "all")


def _llm_file() -> Check:
    path = os.environ.get("STITCHCUDA_LLM")
    if not path:
        return Check("LLM file", "info", "STITCHCUDA_LLM is not set",
                     "export STITCHCUDA_LLM=/path/to/model.gguf or http://127.0.0.1:PORT/v1 (or pass --llm)", "llm")
    from ..llm.server import Endpoint, is_url

    if is_url(path):
        try:
            ep = Endpoint(path, timeout=10)
            ep.check()
        except Exception as e:  # noqa: BLE001 - the check's finding, in one line
            return Check("LLM server", "missing", str(e).split("\n")[0].replace(f"--llm {path}: ", f"{path}: "),
                         "start the server (python -m stitchcuda.ship.serve --model MODEL.gguf --n_ctx 4096 --port PORT)", "llm")
        return Check("LLM server", "ok", f"{path}: {ep.model()} (grammars honoured)", "", "llm")
    p = Path(path).expanduser()
    if not p.is_file():
        return Check("LLM file", "missing", f"{p}: no such file", "point STITCHCUDA_LLM at a .gguf file", "llm")
    with p.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        return Check("LLM file", "missing", f"{p}: not a GGUF file", "point STITCHCUDA_LLM at a .gguf file", "llm")
    return Check("LLM file", "ok", f"{p} ({p.stat().st_size / 2**20:.0f} MiB)", "", "llm")


def run_checks() -> list[Check]:
    """Every check, in the order a person fixes them."""
    checks = [_driver(), _gpu(), _nvcc(), _cublas(), _cudnn(), _torch(),
              _module("cuda.bindings.runtime", "cuda-python", "pip install 'cuda-bindings>=13,<14'", "verify",
                      attr="__name__"),
              _cupti(),
              _module("llama_cpp", "llama.cpp", "pip install llama-cpp-python", "llm", missing="info"),
              _llm_file(),
              _module("matplotlib", "matplotlib", "pip install 'stitchcuda[bench]'  (bench plots)", "bench",
                      missing="info"),
              _module("ray", "Ray", "pip install ray  (bench --ray)", "cluster", missing="info")]
    return checks


__all__ = ["Check", "run_checks"]
