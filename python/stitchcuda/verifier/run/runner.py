"""The real program on one CUDA stream in the Verifier's own process: the :class:`~.session.Runner`
the worker falls back to where the native runner (:mod:`.native`) cannot run (GPU only)."""

from __future__ import annotations

from typing import Any

import torch


class StreamRunner:
    """A compiled program instance (``stitchcuda._rt``) on one CUDA stream (GPU only)."""

    pressure_ok = True
    where = "in process"

    def __init__(self, instance: Any, stream: "torch.cuda.Stream", hold_cycles: int = 200_000_000):
        self.instance, self.stream = instance, stream
        self.device = stream.device
        self.hold_cycles = hold_cycles
        self._side: torch.cuda.Stream | None = None
        self._busy: torch.Tensor | None = None
        self._graph: Any = None

    def context(self):
        return torch.cuda.stream(self.stream)

    def run(self, inputs, outputs, *, pressure: bool = False) -> None:
        if pressure:
            self._pressure()
        self.instance.run(list(inputs), list(outputs), stream=self.stream.cuda_stream)

    def _pressure(self) -> None:
        """A busy GEMM on another stream, launched just before the program: its blocks share the SMs."""
        if self._side is None:
            self._side = torch.cuda.Stream(self.device)
            self._busy = torch.randn(2048, 2048, device=self.device)
        self._side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(self._side):
            self._busy @ self._busy

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

    # -------------------------------------------------------------- captured calls

    def capture(self, inputs, outputs) -> None:
        """One call captured from the stream into a CUDA graph (as a caller that captures would)."""
        torch.cuda.synchronize(self.device)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.stream, capture_error_mode="thread_local"):
            self.instance.run(list(inputs), list(outputs), stream=self.stream.cuda_stream)
        self._graph = g

    def replay(self) -> None:
        torch.cuda.synchronize(self.device)
        with torch.cuda.stream(self.stream):
            self._graph.replay()
        self.sync()

    def drop_capture(self) -> None:
        self._graph = None

    # -------------------------------------------------------------- memory over many calls

    def repeat(self, inputs, outputs, k: int) -> None:
        call = self.bind(inputs, outputs)
        for _ in range(k):
            call()
        self.sync()

    def memory(self) -> Any:
        """Device memory in use beyond what PyTorch holds (the program's, and the runtime's)."""
        from ..measure.memory import MemoryReading

        torch.cuda.synchronize(self.device)
        free, total = torch.cuda.mem_get_info(self.device)
        return MemoryReading(device=(total - free) - torch.cuda.memory_reserved(self.device))


__all__ = ["StreamRunner"]
