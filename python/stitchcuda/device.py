"""One description of what a GPU can do, for the planner's cost model and the Verifier's roofline.

:class:`Ceilings` holds memory bandwidth (a device-to-device copy, bytes read plus written),
dense FLOP/s per precision policy and the host cost of one launch. :data:`H100` and :data:`H200`
are leads (MEASURING.md); :func:`measure` takes the real numbers on a device (PyTorch needed)
and :func:`measured` / :func:`for_planning` read them back from ``<cache>/ceilings.json``, so a
machine that has verified once plans with its own numbers.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .fsutil import atomic_write_text
from .paths import cache_dir
from .precision import get as _policy


def has_gpu() -> bool:
    """True when a CUDA device is usable (``STITCHCUDA_FORCE_NO_GPU=1`` says there is none)."""
    from . import _rt  # the native binding: loaded when a device is asked about

    if os.environ.get("STITCHCUDA_FORCE_NO_GPU") == "1":
        return False
    return _rt.device_count() > 0


@dataclass(frozen=True)
class Ceilings:
    """Roofline ceilings: ``bandwidth`` (bytes/s), dense FLOP/s per policy, ``launch_s`` (s)."""

    name: str
    bandwidth: float
    fp32: float
    tf32: float
    bf16: float
    fp16: float
    launch_s: float = 4e-6

    def peak(self, policy: Any, tensor_cores: bool = True) -> float:
        """FLOP/s of matrix work under ``policy``; without tensor cores, fp32 SIMT."""
        name = _policy(policy).name
        if not tensor_cores or name == "fp32":
            return self.fp32
        return getattr(self, name)

    def gemm_peak(self, policy: Any) -> float:
        return self.peak(policy, True)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Ceilings":
        return cls(**{f.name: d[f.name] for f in dataclasses.fields(cls) if f.name in d})


#: H100 SXM (80 GB): ~3.0 TB/s copy bandwidth; datasheet dense fp32 / TF32 / bf16 / fp16.
H100 = Ceilings("H100 SXM (leads)", 3.0e12, 67e12, 495e12, 790e12, 790e12)
#: H200 (141 GB): ~4.3 TB/s, the H100's compute.
H200 = Ceilings("H200 (leads)", 4.3e12, 67e12, 495e12, 790e12, 790e12)
DEFAULT = H100

CEILINGS_FILE = "ceilings.json"


def _key(device_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", device_name).strip("_")


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def measured(device_name: str | None = None, directory: Path | None = None) -> Ceilings | None:
    """Ceilings measured earlier on a device of this name (any, when None), or None."""
    data = _read((directory or cache_dir()) / CEILINGS_FILE)
    if device_name is not None:
        data = {k: v for k, v in data.items() if k == _key(device_name)}
    for entry in data.values():
        try:
            return Ceilings.from_dict(entry)
        except (TypeError, KeyError):
            continue
    return None


def for_planning(device_name: str | None = None) -> Ceilings:
    """What the planner costs against: this machine's measured ceilings, else :data:`DEFAULT`."""
    return measured(device_name) or DEFAULT


def device_ceilings(device: int = 0, *, directory: Path | None = None, remeasure: bool = False) -> Ceilings:
    """Measured ceilings of CUDA device ``device``: from the cache, or measured now and cached."""
    import torch

    name = torch.cuda.get_device_name(device)
    path = (directory or cache_dir()) / CEILINGS_FILE
    if not remeasure:
        found = measured(name, directory)
        if found is not None:
            return found
    c = measure(device)
    data = _read(path)
    data[_key(name)] = c.to_dict()
    try:
        atomic_write_text(path, json.dumps(data, indent=1) + "\n")
    except OSError:
        pass
    return c


def measure(device: int = 0) -> Ceilings:
    """A 1 GiB device-to-device copy (bytes read + written) and 8192^3 GEMMs under each policy,
    through PyTorch; the best of a few repetitions each."""
    import torch

    from .precision import POLICIES

    dev = torch.device("cuda", device)
    name = torch.cuda.get_device_name(device)

    def best_ms(fn: Callable[[], Any], reps: int) -> float:
        fn()
        torch.cuda.synchronize(dev)
        best = float("inf")
        for _ in range(reps):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            best = min(best, s.elapsed_time(e))
        return best

    free = torch.cuda.mem_get_info(dev)[0]
    nbytes = int(min(1 << 30, free // 8)) // 16 * 16
    a = torch.empty(nbytes // 4, dtype=torch.float32, device=dev)
    b = torch.empty_like(a)
    bw = 2 * nbytes / (best_ms(lambda: b.copy_(a), 10) * 1e-3)
    n = 8192
    flops = {}
    for p in POLICIES.values():
        dtype = getattr(torch, p.storage)
        x = torch.randn(n, n, device=dev).to(dtype)
        y = torch.randn(n, n, device=dev).to(dtype)
        with p.baseline():
            ms = best_ms(lambda: torch.mm(x, y), 3 if p.name == "fp32" else 5)
        flops[p.name] = 2 * n ** 3 / (ms * 1e-3)
    torch.cuda.empty_cache()
    return Ceilings(f"{name} (measured {time.strftime('%Y-%m-%d')})", bw, flops["fp32"], flops["tf32"],
                    flops["bf16"], flops["fp16"])


__all__ = ["Ceilings", "H100", "H200", "DEFAULT", "CEILINGS_FILE", "measured", "for_planning", "device_ceilings",
           "measure"]
