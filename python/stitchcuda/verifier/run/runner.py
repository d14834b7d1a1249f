"""The real program on one CUDA stream: the :class:`~.session.Runner` the GPU child judges (GPU only)."""

from __future__ import annotations

from typing import Any

import torch


class StreamRunner:
    """A compiled program instance (``stitchcuda._rt``) on one CUDA stream (GPU only)."""

    def __init__(self, instance: Any, stream: "torch.cuda.Stream", hold_cycles: int = 200_000_000):
        self.instance, self.stream = instance, stream
        self.device = stream.device
        self.hold_cycles = hold_cycles

    def context(self):
        return torch.cuda.stream(self.stream)

    def run(self, inputs, outputs) -> None:
        self.instance.run(list(inputs), list(outputs), stream=self.stream.cuda_stream)

    def bind(self, inputs, outputs):
        """A callable that runs on fixed tensors with no DLPack exchange per call, as a deployed
        program is called; for timing and profiling, where the per-call Python cost of
        resolving tensors would otherwise be timed as program time."""
        bound = self.instance.bind(list(inputs), list(outputs), stream=self.stream.cuda_stream)
        stream = self.stream.cuda_stream
        return lambda: bound(stream)

    def sync(self) -> None:
        ev = torch.cuda.Event()
        ev.record(self.stream)
        ev.synchronize()

    def sync_device(self) -> None:
        torch.cuda.synchronize(self.device)

    def hold(self) -> None:
        with torch.cuda.stream(self.stream):
            torch.cuda._sleep(self.hold_cycles)

    def ordered(self, fn) -> None:
        with torch.cuda.stream(self.stream):
            fn()


__all__ = ["StreamRunner"]
