"""Every buffer the Verifier hands a program sits between two guard zones, checked after each call.

A program owns the bytes of its outputs and nothing else: not the slack an allocator rounds a buffer
up to, not its inputs or weights, not memory nobody gave it. :class:`GuardedBuffers` makes every
program-facing tensor (inputs, outputs, weights, staging copies) the middle of a block whose two
ends are filled with secret random bytes (the verification's seed), and :meth:`GuardedBuffers.check`
says which guard changed: a write past the end of an output, before the start of an input, into a
neighbour's slack. A read of a guard gives random bytes, which show as wrong outputs.

The guards are a few KiB on each side (64 KiB for buffers of 64 MiB and more), their size varied
with the buffer's index so that no two calls see the same addresses (a cache keyed by address
misses, as with :func:`.session.fresh_copy`). Blocks come from a factory: plain PyTorch memory for
the in-process runner and the CPU tests, CUDA IPC allocations for the native runner
(:mod:`.native`), which opens the same blocks in its own process.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

#: Guard bytes on each side of a buffer (before the variation by index), and for large buffers.
GUARD = 4096
GUARD_LARGE = 64 << 10
LARGE = 64 << 20
#: The largest variation added to a guard (bytes): 31 steps of 256.
VARY = 256 * 31

BlockFactory = Callable[[int], tuple[torch.Tensor, Any]]


def torch_blocks(device: torch.device) -> BlockFactory:
    """Blocks from PyTorch's allocator (the in-process runner, the CPU tests): ``(uint8 tensor, None)``."""
    return lambda n: (torch.empty(n, dtype=torch.uint8, device=device), None)


@dataclass
class _Block:
    base: torch.Tensor  # the whole block (held while the buffer handed out lives)
    front: int
    nbytes: int
    back: int
    owner: Any  # what the factory returned besides the tensor (an IPC allocation), or None
    label: str = ""


class GuardedBuffers:
    """Program-facing tensors inside guarded blocks (module docstring)."""

    def __init__(self, device: torch.device | str, seed: int, factory: BlockFactory | None = None):
        self.device = torch.device(device)
        self.factory = factory or torch_blocks(self.device)
        gen = torch.Generator(device="cpu").manual_seed(int(seed) & ((1 << 62) - 1))
        self.pattern = torch.randint(0, 256, (GUARD_LARGE + VARY,), generator=gen, dtype=torch.uint8).to(self.device)
        self._blocks: dict[int, _Block] = {}  # data_ptr of the buffer -> its block
        self.violations = 0

    # -------------------------------------------------------------- making buffers

    def empty(self, shape: Sequence[int], dtype: torch.dtype, k: int = 0, label: str = "") -> torch.Tensor:
        """A new tensor (contents undefined) between fresh guards; ``k`` varies the guards' size."""
        numel = 1
        for s in shape:
            numel *= int(s)
        elem = torch.empty((), dtype=dtype).element_size()
        nbytes = numel * elem
        guard = (GUARD_LARGE if nbytes >= LARGE else GUARD) + 256 * (k % 31)
        block, owner = self.factory(guard + nbytes + guard)
        block[:guard].copy_(self.pattern[:guard])
        block[guard + nbytes:].copy_(self.pattern[:guard])
        view = block[guard:guard + nbytes].view(dtype).view(tuple(int(s) for s in shape))
        key = view.data_ptr() if nbytes else id(view)
        self._blocks[key] = _Block(block, guard, nbytes, guard, owner, label)
        weakref.finalize(view, self._blocks.pop, key, None)  # the block goes when the buffer handed out does
        return view

    def copy(self, t: torch.Tensor, k: int = 0, label: str = "") -> torch.Tensor:
        """A guarded copy of ``t`` (contiguous, same dtype and shape)."""
        out = self.empty(tuple(t.shape), t.dtype, k, label)
        out.copy_(t)
        return out

    def like(self, t: torch.Tensor, k: int = 0, label: str = "") -> torch.Tensor:
        return self.empty(tuple(t.shape), t.dtype, k, label)

    # -------------------------------------------------------------- finding a tensor's block

    def block_of(self, t: torch.Tensor) -> tuple[_Block, torch.Tensor] | None:
        """The block a buffer handed out lives in (its first byte), with the block's tensor."""
        b = self._blocks.get(t.data_ptr()) if t.numel() else None
        return (b, b.base) if b is not None else None

    def owns(self, t: torch.Tensor) -> bool:
        return self.block_of(t) is not None and t.is_contiguous()

    # -------------------------------------------------------------- checking

    def check(self, named: Sequence[tuple[str, torch.Tensor]] | None = None) -> list[str]:
        """The guards of the buffers ``named`` ((name, tensor) pairs; default: every live buffer) that
        changed since they were written, one line each; they are written again, so one overrun is
        reported once."""
        if named is None:
            items = [(b.label or "a buffer", b, b.base) for b in list(self._blocks.values())]
        else:
            items = []
            for name, t in named:
                found = self.block_of(t)
                if found is not None:
                    items.append((name, found[0], found[1]))
        out = []
        for name, b, base in items:
            if base is None:
                continue
            front = base[:b.front]
            back = base[b.front + b.nbytes:]
            bad_front = int((front != self.pattern[:b.front]).sum().item())
            bad_back = int((back != self.pattern[:b.back]).sum().item())
            if bad_front or bad_back:
                where = []
                if bad_back:
                    last = int(torch.nonzero(back != self.pattern[:b.back])[-1, 0].item())
                    where.append(f"{bad_back} byte(s) after its end changed (up to {last + 1} bytes past it)")
                if bad_front:
                    where.append(f"{bad_front} byte(s) before its start changed")
                out.append(f"{name}: " + ", ".join(where))
                front.copy_(self.pattern[:b.front])
                back.copy_(self.pattern[:b.back])
        self.violations += len(out)
        return out

    def live(self) -> int:
        return len(self._blocks)


__all__ = ["GuardedBuffers", "torch_blocks", "GUARD", "GUARD_LARGE", "BlockFactory"]
