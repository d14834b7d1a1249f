"""Where the candidate runs, for the worker: the native runner if it can, the worker's own process if not.

:func:`start` makes the program instance a verification judges: in the native runner
(:mod:`.native`: a process with no interpreter and no PyTorch, fed through CUDA IPC) when the job
names one and the machine can share device memory between processes, else in the worker's process
(``stitchcuda._rt``), the report saying why. Either way the weights create() gets and every buffer
the program sees are guarded (:mod:`.guards`), and every call of the program that fails — a status,
a CUDA error, a runner that died — raises :class:`CandidateFailure`: a verdict on the candidate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from .guards import GuardedBuffers


class CandidateFailure(RuntimeError):
    """The program's own call (or the wait for its stream) failed."""


class CreateFailed(RuntimeError):
    """The program's create() failed (or the runner could not load it): the candidate's fault."""


#: Methods of a runner that call the program (or wait for it): their failures are the program's.
PROGRAM_CALLS = ("run", "sync", "ordered_run", "timed", "wall", "wall_empty", "repeat", "capture", "replay", "memory",
                 "library_calls", "sync_device", "hold", "ordered")


class Guarded:
    """A runner whose program calls raise :class:`CandidateFailure` (``bind`` too: the callable it returns)."""

    def __init__(self, runner: Any):
        self._r = runner
        self.device = runner.device

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._r, name)
        if name not in PROGRAM_CALLS or not callable(attr):
            return attr

        def call(*a: Any, **k: Any) -> Any:
            try:
                return attr(*a, **k)
            except CandidateFailure:
                raise
            except Exception as e:  # noqa: BLE001
                raise CandidateFailure(f"the program's {name} failed: {type(e).__name__}: {e}") from e
        return call

    def run(self, inputs, outputs, **kw) -> None:
        try:
            self._r.run(inputs, outputs, **kw)
        except Exception as e:  # noqa: BLE001
            raise CandidateFailure(f"the program's run failed: {type(e).__name__}: {e}") from e

    def sync(self) -> None:
        try:
            self._r.sync()
        except Exception as e:  # noqa: BLE001
            raise CandidateFailure(f"waiting for the program's stream failed: {type(e).__name__}: {e}") from e

    def bind(self, inputs, outputs):
        call = self._r.bind(inputs, outputs) if hasattr(self._r, "bind") else (lambda: self._r.run(inputs, outputs))

        def run() -> None:
            try:
                call()
            except Exception as e:  # noqa: BLE001
                raise CandidateFailure(f"the program's run failed: {type(e).__name__}: {e}") from e
        return run


@dataclass
class Instance:
    """The program a verification judges, ready: its runner (guarded), the buffers its tensors come
    from, the weights it was created with, where it runs, and how much device memory it holds."""

    runner: Any
    buffers: GuardedBuffers
    weights: list[torch.Tensor]
    isolation: str
    memory: Callable[[], int]
    remote: Any = None  # the RemoteRunner, when it runs in the native runner
    close: Callable[[], None] = lambda: None
    runner_exe: str = ""  # the native runner's executable, where there is one


def _weights(problem: Any, buffers: GuardedBuffers) -> list[torch.Tensor]:
    names = [w.name for w in problem.manifest.weights]
    guarded = [buffers.copy(w, k, f"weight {names[k] if k < len(names) else k}") for k, w in enumerate(problem.weights)]
    problem.weights = guarded  # the unguarded copies go
    return guarded


def start(job: Any, problem: Any, dev: int, stream: "torch.cuda.Stream", secret_seed: int, runner_exe: str = "",
          why: str = "") -> Instance:
    """The instance of the module docstring (in the native runner ``runner_exe`` when it is given;
    ``why`` says why not otherwise); raises :class:`CreateFailed` when create() fails."""
    torch.cuda.synchronize(dev)
    free0, total = torch.cuda.mem_get_info(dev)
    reserved0 = torch.cuda.memory_reserved(dev)
    if runner_exe:
        try:
            inst = _native(job, problem, dev, secret_seed, free0, reserved0, runner_exe)
            inst.runner_exe = runner_exe
            return inst
        except _Unavailable as e:
            why = str(e)
    inst = _in_process(job, problem, dev, stream, secret_seed, free0, reserved0, why or "no native runner")
    inst.runner_exe = runner_exe  # the sanitizer still runs the program there (host buffers, no IPC)
    return inst


class _Unavailable(RuntimeError):
    pass


def _native(job: Any, problem: Any, dev: int, seed: int, free0: int, reserved0: int, exe: str) -> Instance:
    from .native import NativeRunner, RemoteRunner, RunnerDied, RunnerError, RunnerUnavailable, ipc_blocks

    device = torch.device(f"cuda:{dev}")
    try:
        from cuda.bindings import runtime as cudart

        del cudart
    except ImportError:
        raise _Unavailable("cuda-python's runtime bindings are not installed (CUDA IPC needs them)") from None
    try:
        native = NativeRunner(exe, job.library, device=dev)
    except OSError as e:
        raise _Unavailable(f"the native runner did not start ({e})") from None
    remote = RemoteRunner(native, device)
    try:
        buffers = GuardedBuffers(device, seed, factory=ipc_blocks(device, remote))
        remote.buffers = buffers
        weights = _weights(problem, buffers)
        remote.create(weights, dev)
    except RunnerUnavailable as e:
        native.close()
        raise _Unavailable(str(e)) from None
    except RunnerError as e:
        remote.close()
        raise CreateFailed(f"program create failed (in the native runner): {e}") from e
    except RunnerDied as e:
        raise CreateFailed(f"program create crashed the native runner: {e}") from e
    except RuntimeError as e:  # cudaMalloc / cudaIpcGetMemHandle here: this machine's, not the program's
        native.close()
        raise _Unavailable(f"CUDA IPC is not usable here ({e})") from None

    def memory() -> int:
        """The program's device memory: what the device lost since the runner started, less the Verifier's
        own (another process on the device counts too), and, where NVML names the runner, no more than
        that process's own figure (which may count the Verifier's buffers it maps: both read high, each
        for its own reason, so the lower is kept)."""
        torch.cuda.synchronize(dev)
        free, _ = torch.cuda.mem_get_info(dev)
        ours = (torch.cuda.memory_reserved(dev) - reserved0) + sum(
            b.base.numel() for b in buffers._blocks.values())
        device = max(0, (free0 - free) - ours)
        own = remote.own_device_bytes()
        return device if own is None else min(device, own)

    return Instance(Guarded(remote), buffers, weights, "in the native runner: a process of its own with no Python "
                                                       "interpreter and no PyTorch (CUDA IPC buffers)",
                    memory, remote, remote.close)


def _in_process(job: Any, problem: Any, dev: int, stream: "torch.cuda.Stream", seed: int, free0: int,
                reserved0: int, why: str) -> Instance:
    from stitchcuda import _rt as rt

    from .runner import StreamRunner

    buffers = GuardedBuffers(torch.device(f"cuda:{dev}"), seed)
    weights = _weights(problem, buffers)
    try:
        lib = rt.ProgramLibrary(job.library)
        instance = lib.create(weights, device=dev)
    except Exception as e:  # noqa: BLE001 - create failed: the candidate's fault
        raise CreateFailed(f"program create failed: {type(e).__name__}: {e}") from e

    def memory() -> int:
        torch.cuda.synchronize(dev)
        free, _ = torch.cuda.mem_get_info(dev)
        return max(0, (free0 - free) - (torch.cuda.memory_reserved(dev) - reserved0))

    return Instance(Guarded(StreamRunner(instance, stream)), buffers, weights,
                    f"in the Verifier's own process, beside Python and PyTorch ({why})", memory)


class RemoteClock:
    """A :class:`~..measure.timing.ProgramClock` over the native runner, on fixed buffers."""

    where = "timed by the native runner in its own process"

    def __init__(self, remote: Any, inputs: list[torch.Tensor], outputs: list[torch.Tensor]):
        self.remote, self.inputs, self.outputs = remote, inputs, outputs

    def time(self) -> float:
        return self.remote.timed(self.inputs, self.outputs)

    def wall(self) -> float:
        return self.remote.wall(self.inputs, self.outputs)

    def overhead(self) -> float:
        return self.remote.wall_empty()


__all__ = ["CandidateFailure", "CreateFailed", "Guarded", "Instance", "start", "RemoteClock", "PROGRAM_CALLS"]
