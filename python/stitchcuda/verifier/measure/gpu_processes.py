"""Device memory of one process, where the driver names it: the memory checks' own reading.

The ``memory_leak`` check and the program's memory cap read device memory in use. CUDA itself says
only how much of the whole device is free (``cudaMemGetInfo``), and every process on the device moves
that figure: three Verifiers sharing an H200 failed 11 of 55 correct programs as leaking, and one
as over its cap, each reading the others' trials (BENCHMARKS.md, "all.jsonl at tf32 begun"). NVML,
the driver's management library (``libnvidia-ml.so.1``, installed with the driver), lists the
processes computing on a device with the device memory each holds; where it lists the runner's
process under the PID this machine gives it, that figure is the program's alone, whatever else
runs on the device (the leak check reads it; the cap takes the lower of it and the device's figure,
since the runner's may also count the Verifier's buffers it maps).

Where it does not — no NVML, a device NVML does not match, or a container whose processes NVML
names by the host's PIDs — :func:`process_bytes` returns None and the checks read the whole device,
as before, and say so. :func:`visible` tells a caller (``benchmarks/verify_all.py``) whether this
machine's PIDs are NVML's, by looking for the calling process itself once it holds a CUDA context.

``query`` (a function of the device's UUID returning ``[(pid, bytes)]`` or None) replaces NVML in
the CPU tests.
"""

from __future__ import annotations

import ctypes
import os
from typing import Callable

#: NVML's "value not available" for a process's memory (Windows WDDM, some containers)
_NOT_AVAILABLE = (1 << 64) - 1
_INSUFFICIENT_SIZE = 7


class _ProcessInfo(ctypes.Structure):  # nvmlProcessInfo_v2_t: what ..._v3 fills, but on a few drivers
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong),
                ("gpuInstanceId", ctypes.c_uint), ("computeInstanceId", ctypes.c_uint)]


class _ProcessInfoCc(ctypes.Structure):  # the v3 struct those few fill (confidential-computing memory added)
    _fields_ = _ProcessInfo._fields_ + [("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


def _info_type(lib) -> type:
    """The struct ``nvmlDeviceGetComputeRunningProcesses_v3`` fills: the v3 one only on drivers that have
    the confidential-computing memory query and not yet the process-detail list (as nvidia-ml-py's
    users tell them apart); the v2 one on every other."""
    has = (lambda name: hasattr(lib, name))
    cc = has("nvmlDeviceGetConfComputeMemSizeInfo") and not has("nvmlDeviceGetRunningProcessDetailList")
    return _ProcessInfoCc if cc else _ProcessInfo


_lib: list = []  # [the loaded library] once initialised, [None] when NVML is not usable here


def _nvml():
    if not _lib:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            _lib.append(lib if lib.nvmlInit_v2() == 0 else None)
        except (OSError, AttributeError):
            _lib.append(None)
    return _lib[0]


def nvml_processes(uuid: str) -> list[tuple[int, int]] | None:
    """``[(pid, device bytes)]`` of the processes computing on the device ``uuid`` ("GPU-..."), from
    NVML; None where NVML cannot say."""
    lib = _nvml()
    if lib is None:
        return None
    try:
        handle = ctypes.c_void_p()
        if lib.nvmlDeviceGetHandleByUUID(uuid.encode(), ctypes.byref(handle)) != 0:
            return None
        info, n = _info_type(lib), 64
        for _ in range(4):  # the list may grow between the two calls
            infos = (info * (2 * n))()  # room for twice the entries asked for: a wider struct cannot overrun
            count = ctypes.c_uint(n)
            rc = lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos)
            if rc == 0:
                return [(int(p.pid), int(p.usedGpuMemory)) for p in infos[:min(count.value, n)]
                        if p.usedGpuMemory != _NOT_AVAILABLE]
            if rc != _INSUFFICIENT_SIZE:
                return None
            n = max(2 * n, count.value + 8)
    except (AttributeError, OSError, ValueError):  # a driver without these entry points
        return None
    return None


def device_uuid(device: int) -> str:
    """NVML's name of CUDA device ``device`` ("GPU-" and its UUID), from PyTorch's properties."""
    import torch

    return "GPU-" + str(torch.cuda.get_device_properties(device).uuid)


def process_bytes(pid: int, uuid: str, query: Callable[[str], list[tuple[int, int]] | None] = nvml_processes
                  ) -> int | None:
    """The device memory process ``pid`` holds on device ``uuid``; None where the driver does not
    name that process (module docstring)."""
    listed = query(uuid)
    if not listed:
        return None
    for p, used in listed:
        if p == pid:
            return used
    return None


def visible(uuid: str, query: Callable[[str], list[tuple[int, int]] | None] = nvml_processes) -> bool:
    """Whether NVML names this process (which must hold a CUDA context on the device) by its own PID."""
    return process_bytes(os.getpid(), uuid, query) is not None


__all__ = ["nvml_processes", "device_uuid", "process_bytes", "visible"]
