"""Where the Verifier keeps its own copies: on the device, on the host, or nowhere.

Verification needs the inputs, the program's outputs and the reference's outputs on the device;
those are the problem's own working set. Everything else it keeps is its own: the previous
call's outputs (to name stale outputs), the last plain trial's outputs (the sensitivity trials'
starting point), copies of the inputs handed to the reference (a reference may write them), the
reference at two precisions side by side. On a 141 GB card these fit beside any problem; on a
24-80 GB workstation card several input-sized copies do not (a 16 GiB input once needed four).

So each such copy is placed by :func:`place`: on the device when it is small (at most
:data:`EXTRA_DEVICE_BYTES`) and fits the device's free memory; else on the host (pinned, one
transfer each way) when the host has room; else nowhere, and the check that wanted it works
without (a keyed hash, a recomputation, or a weaker name for a failure; the note says which).
The peak device memory of a verification is then the inputs, the program's and the reference's
outputs, and a bounded amount besides (chunked temporaries, copies up to 1 GiB).

:class:`CopyBudget` makes these decisions for one verification and keeps the notes that say which
checks used host copies; the CPU tests give it a fake :class:`Room` to drive every path.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

#: A copy of the Verifier's own stays on the device up to this many bytes (env override, in GiB:
#: ``STITCHCUDA_VERIFY_COPY_GIB``).
EXTRA_DEVICE_BYTES = 1 << 30

#: Of the host's available memory, at most this fraction is taken by the Verifier's copies.
HOST_FRACTION = 0.5

#: Elements compared per chunk when a copy lives on the host (32 MiB of fp32 per transfer).
HOST_CHUNK = 1 << 23

GiB = float(1 << 30)


@dataclass(frozen=True)
class Room:
    """Bytes free now: on the device (None: no limit known, a CPU device) and on the host (None:
    unknown)."""

    device_free: int | None
    host_free: int | None


def host_available() -> int | None:
    """The host's available memory (``MemAvailable``), or None where it cannot be read."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def indexed(device: torch.device | str) -> torch.device:
    """``device`` with its index: a bare ``"cuda"`` is the current CUDA device (the memory queries
    here, ``torch.cuda.mem_get_info`` among them, refuse a CUDA device without an index)."""
    d = torch.device(device)
    return torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d


def device_free(device: torch.device) -> int | None:
    """What this process may still allocate on ``device``: the driver's free memory plus PyTorch's
    unused cache, bounded by the per-process fraction; None on a CPU device."""
    if device.type != "cuda":
        return None
    free, total = torch.cuda.mem_get_info(device)
    free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    fraction = getattr(torch.cuda, "get_per_process_memory_fraction", lambda d: 1.0)(device)
    return int(min(free, fraction * total - torch.cuda.memory_allocated(device)))


def room(device: torch.device) -> Room:
    return Room(device_free(device), host_available())


def extra_device_bytes() -> int:
    v = os.environ.get("STITCHCUDA_VERIFY_COPY_GIB", "")
    try:
        return int(float(v) * (1 << 30)) if v else EXTRA_DEVICE_BYTES
    except ValueError:
        return EXTRA_DEVICE_BYTES


def place(nbytes: int, r: Room, limit: int = EXTRA_DEVICE_BYTES) -> str:
    """``"device"``, ``"host"`` or ``"none"`` for a copy of ``nbytes`` (module docstring): the device
    when there is no limit (a CPU device) or the copy is at most ``limit`` and takes at most 90 %
    of the free device memory; else the host when at most :data:`HOST_FRACTION` of its available
    memory (or its room is unknown); else none."""
    if r.device_free is None:
        return "device"
    if nbytes <= limit and nbytes <= 0.9 * r.device_free:
        return "device"
    if r.host_free is None or nbytes <= HOST_FRACTION * r.host_free:
        return "host"
    return "none"


class CopyBudget:
    """The placement decisions of one verification, and the notes naming those not on the device."""

    def __init__(self, device: torch.device | str, *, limit: int | None = None,
                 room_fn: Callable[[], Room] | None = None):
        self.device = indexed(device)
        self.limit = extra_device_bytes() if limit is None else int(limit)
        self._room = room_fn or (lambda: room(self.device))
        self.notes: list[str] = []

    def on_device(self, nbytes: int) -> bool:
        """Whether an optional copy of ``nbytes`` (one a check can do without) goes on the device."""
        return place(int(nbytes), self._room(), self.limit) == "device"

    def place(self, what: str, nbytes: int) -> str:
        where = place(int(nbytes), self._room(), self.limit)
        if where != "device":
            line = (f"{what}: {nbytes / GiB:.2f} GiB kept on the host (over the device budget of "
                    f"{self.limit / GiB:.2f} GiB for a copy)" if where == "host" else
                    f"{what}: {nbytes / GiB:.2f} GiB fits neither the device budget nor the host; done without a copy")
            if line not in self.notes:
                self.notes.append(line)
        return where


def nbytes(ts: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in ts)


def _host_empty(like: torch.Tensor) -> torch.Tensor:
    """A host tensor for ``like``: pinned when it lives on a CUDA device (one fast transfer each way),
    pageable when pinning fails or is switched off (``STITCHCUDA_NO_PINNED=1``)."""
    if like.device.type == "cuda" and os.environ.get("STITCHCUDA_NO_PINNED", "") != "1":
        try:
            return torch.empty(like.shape, dtype=like.dtype, pin_memory=True)
        except RuntimeError:
            pass
    return torch.empty(like.shape, dtype=like.dtype, device="cpu")


class Stash:
    """Copies of a list of tensors, kept where the budget put them (``device``, ``host`` or
    ``none``: only the shapes). ``save`` may be called again with tensors of the same shapes; the
    buffers are reused (a pinned buffer is allocated once)."""

    def __init__(self, where: str):
        self.where = where
        self._bufs: list[torch.Tensor] = []

    @property
    def available(self) -> bool:
        return self.where != "none" and bool(self._bufs)

    def save(self, ts: Sequence[torch.Tensor]) -> "Stash":
        if self.where == "none":
            return self
        if len(self._bufs) != len(ts) or any(b.shape != t.shape or b.dtype != t.dtype for b, t in zip(self._bufs, ts)):
            self._bufs = [torch.empty_like(t) if self.where == "device" else _host_empty(t) for t in ts]
        for b, t in zip(self._bufs, ts):
            b.copy_(t, non_blocking=False)
        return self

    def restore_into(self, ts: Sequence[torch.Tensor]) -> None:
        if not self.available:
            raise RuntimeError("Stash.restore_into: nothing was kept")
        for t, b in zip(ts, self._bufs):
            t.copy_(b)

    def chunks(self, k: int, device: torch.device):
        """``(lo, hi, chunk)`` over tensor ``k``'s flat elements, each chunk on ``device``."""
        flat = self._bufs[k].reshape(-1)
        step = HOST_CHUNK if self.where == "host" else max(flat.numel(), 1)
        for lo in range(0, flat.numel(), step):
            hi = min(flat.numel(), lo + step)
            yield lo, hi, flat[lo:hi].to(device)

    def tensor(self, k: int) -> torch.Tensor | None:
        """Tensor ``k`` itself when it is on the device, else None (use :meth:`chunks`)."""
        return self._bufs[k] if self.where == "device" and self._bufs else None

    def drop(self) -> None:
        self._bufs = []


def count_same(mask: torch.Tensor, out: torch.Tensor, stash: Stash, k: int, exclude=None) -> int:
    """Elements where ``mask`` holds and ``out`` is bit-identical to the stash's tensor ``k``
    (and, with ``exclude(chunk) -> bool mask``, where that does not hold), in chunks."""
    from .compare import bits

    m, o = mask.reshape(-1), out.reshape(-1)
    total = torch.zeros((), dtype=torch.int64, device=o.device)
    for lo, hi, p in stash.chunks(k, o.device):
        hit = m[lo:hi] & (bits(o[lo:hi]) == bits(p))
        if exclude is not None:
            hit &= ~exclude(o[lo:hi])
        total += hit.sum()
    return int(total.item())


__all__ = ["EXTRA_DEVICE_BYTES", "HOST_FRACTION", "Room", "room", "place", "CopyBudget", "Stash", "count_same", "nbytes",
           "host_available", "device_free"]
