"""The native runner: the candidate runs in a process with no Python interpreter and no PyTorch.

``stitch-runner`` (``runtime/runner/runner.cu``) loads libstitchrt and the program and nothing else,
and is fed and read by the Verifier over two pipes (the protocol is in the source's header). A
program that walks the dynamic linker's list of loaded libraries there finds the runtime, the CUDA
libraries and libc: no interpreter to call, no PyTorch to compute with, no Verifier to patch, no
reference outputs in its address space.

Here, the Verifier's side:

- :func:`runner_binary` finds the runner the package installed (when its source hash matches the
  source beside it) or builds it with nvcc into the build cache, once per source.
- :class:`NativeRunner` is the process: commands and their JSON replies; a runner that dies (the
  program crashed it) raises :class:`RunnerDied` with the tail of its log.
- :class:`IpcBlock` is a device allocation the runner opens by CUDA IPC handle (cuda-python's
  runtime bindings): the blocks of :class:`~.guards.GuardedBuffers`, so every tensor the program
  sees is guarded and shared, never copied.
- :class:`RemoteRunner` is a :class:`~.session.Runner` over it: the program's calls, stream-ordered
  calls, timed calls, wall-clock calls, captured replays, repeated calls and memory readings, and
  the log of the runtime calls the program made (entry point, precision policy, dtypes, stream).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Sequence

import torch

from ...paths import INCLUDE_DIR, LIB_DIR, PACKAGE_DIR, cache_dir

#: ST dtype enum values (stitchrt.h) by torch dtype.
ST_DTYPE = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3, torch.int32: 4,
            torch.int64: 5, torch.uint8: 6, torch.bool: 7, torch.int8: 8}


class RunnerUnavailable(RuntimeError):
    """The runner cannot be built or started here (no nvcc, no source): the Verifier's problem."""


class RunnerDied(RuntimeError):
    """The runner process ended while serving a command: the program crashed it."""


class RunnerTimeout(RunnerDied):
    """A command got no reply within the runner's time limit (the sanitizer's tools may be slow)."""


class RunnerError(RuntimeError):
    """A command failed: the program's status, a CUDA error, a load error."""

    def __init__(self, message: str, reply: dict[str, Any]):
        super().__init__(message)
        self.reply = reply


# ------------------------------------------------------------------ the binary


def runner_source() -> Path:
    """``runner.cu``: installed beside the package (``stitchcuda/runner``), else in the checkout."""
    for p in (PACKAGE_DIR / "runner" / "runner.cu", PACKAGE_DIR.parents[1] / "runtime" / "runner" / "runner.cu"):
        if p.is_file():
            return p
    raise RunnerUnavailable("the native runner's source (runtime/runner/runner.cu) is not installed")


def source_hash(source: Path | None = None) -> str:
    return hashlib.sha256((source or runner_source()).read_bytes()).hexdigest()


def _installed(digest: str) -> Path | None:
    exe = LIB_DIR / "stitch-runner"
    if not exe.is_file():
        return None
    try:
        out = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return exe if out.split()[-1:] == [digest] else None


def runner_binary(*, timeout: float = 600.0) -> Path:
    """The runner for this package's source: installed, cached, or built now (nvcc, locked)."""
    from ...toolchain import find_nvcc, nvcc_version

    src = runner_source()
    digest = source_hash(src)
    installed = _installed(digest)
    if installed is not None:
        return installed
    nvcc = find_nvcc()
    if nvcc is None:
        raise RunnerUnavailable("nvcc not found: the native runner cannot be built")
    key = hashlib.sha256(f"{digest}|{nvcc_version(nvcc)}|{LIB_DIR.resolve()}".encode()).hexdigest()[:24]
    folder = cache_dir() / "runner" / key
    exe = folder / "stitch-runner"
    if exe.is_file():
        return exe
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if exe.is_file():
            return exe
        tmp = folder / f"stitch-runner.{os.getpid()}.tmp"
        cmd = [str(nvcc), "-std=c++17", "-O2", f"-DSTITCH_RUNNER_HASH=\"{digest}\"", "-o", str(tmp), str(src),
               f"-I{INCLUDE_DIR}", f"-L{LIB_DIR}", "-lstitchrt", "-ldl", f"-Xlinker=-rpath,{LIB_DIR.resolve()}",
               "-Xlinker=--export-dynamic", "-gencode", "arch=compute_80,code=compute_80"]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.SubprocessError) as e:
            raise RunnerUnavailable(f"building the native runner failed: {e}") from None
        if r.returncode != 0 or not tmp.is_file():
            raise RunnerUnavailable("building the native runner failed:\n" + (r.stderr or r.stdout)[-2000:])
        os.replace(tmp, exe)
    return exe


# ------------------------------------------------------------------ the process


class NativeRunner:
    """One ``stitch-runner`` process serving one program (module docstring)."""

    def __init__(self, exe: str | os.PathLike, library: str | os.PathLike, *, device: int = 0,
                 host_fd: int | None = None, prefix: Sequence[str] = (), token: str = "", cwd: str | None = None,
                 timeout: float | None = None, env: dict[str, str] | None = None):
        self.token = token or hashlib.sha256(os.urandom(16)).hexdigest()[:24]
        self.prefix = tuple(prefix)
        cmd_r, self._cmd_w = os.pipe()
        self._rep_r, rep_w = os.pipe()
        self._logdir = tempfile.mkdtemp(prefix="stitchcuda-runner-")
        self.log_path = Path(self._logdir) / "runner.log"
        argv = [*prefix, str(exe), "--program", str(library), "--in", str(cmd_r), "--out", str(rep_w),
                "--device", str(device)]
        fds = [cmd_r, rep_w]
        if host_fd is not None:
            argv += ["--host-fd", str(host_fd)]
            fds.append(host_fd)
        with open(self.log_path, "wb") as log:
            # the runner dies with whatever started it (runner.cu's main asks Linux); no preexec_fn here: this
            # process has threads, and code between fork and exec may deadlock on a lock one of them held
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         pass_fds=fds, cwd=cwd or self._logdir, env={**_runner_env(), **(env or {})})
        os.close(cmd_r)
        os.close(rep_w)
        self._buf = b""
        self.timeout = timeout  # seconds a reply may take (None: as long as it takes)
        self._lock = threading.Lock()
        self._send(f"token {self.token}")
        self.pending_free: list[int] = []

    def _send(self, line: str) -> None:
        data = (line + "\n").encode()
        try:
            while data:
                n = os.write(self._cmd_w, data)
                data = data[n:]
        except (BrokenPipeError, OSError):
            raise RunnerDied(self._died("the runner stopped reading its commands")) from None

    def _died(self, what: str) -> str:
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        rc = self.proc.returncode
        tail = self.log_tail()
        how = f"exit status {rc}" if rc is not None and rc >= 0 else f"killed by signal {-rc}" if rc else "running"
        return f"{what} ({how})" + (f"\n{tail}" if tail else "")

    def log_tail(self, chars: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-chars:].decode("utf-8", "replace").strip()

    def call(self, *words: Any, check: bool = True) -> dict[str, Any]:
        """Send one command and read its reply; :class:`RunnerError` when it failed (``check``)."""
        with self._lock:
            for bid in self.pending_free:
                self._send(f"free {bid}")
                self._read()
            self.pending_free.clear()
            self._send(" ".join(str(w) for w in words))
            reply = self._read()
        if check and not reply.get("ok"):
            raise RunnerError(_describe(words[0] if words else "", reply), reply)
        return reply

    def _line(self) -> bytes:
        deadline = None if self.timeout is None else time.monotonic() + self.timeout
        while b"\n" not in self._buf:
            wait = None if deadline is None else max(0.0, deadline - time.monotonic())
            ready, _, _ = select.select([self._rep_r], [], [], wait)
            if not ready:
                raise RunnerTimeout(f"no reply from the runner in {self.timeout:g} s")
            chunk = os.read(self._rep_r, 1 << 16)
            if not chunk:
                return b""
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return line + b"\n"

    def _read(self) -> dict[str, Any]:
        while True:
            line = self._line()
            if not line:
                raise RunnerDied(self._died("the runner ended during a command"))
            text = line.decode("utf-8", "replace").strip()
            head, _, body = text.partition(" ")
            if head != self.token:
                continue  # not the runner's reply (nothing else should write here)
            try:
                return json.loads(body)
            except ValueError:
                continue

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                self.call("quit", check=False)
        except (RunnerDied, OSError):
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for fd in (self._cmd_w, self._rep_r):
            try:
                os.close(fd)
            except OSError:
                pass
        shutil.rmtree(self._logdir, ignore_errors=True)


def _describe(command: str, reply: dict[str, Any]) -> str:
    for key in ("load", "cuda", "error"):
        if reply.get(key):
            return f"{command}: {reply[key]}"
    return f"{command}: failed ({reply})"


def _runner_env() -> dict[str, str]:
    """The runner's environment: the child's, less what points at Python (it loads no Python)."""
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


# ------------------------------------------------------------------ IPC blocks


def _cudart():
    from cuda.bindings import runtime as cudart

    return cudart


def _check(result: Any, what: str) -> Any:
    cudart = _cudart()
    err = result[0] if isinstance(result, tuple) else result
    if int(err) != int(cudart.cudaError_t.cudaSuccess):
        name = cudart.cudaGetErrorName(err)[1]
        raise RuntimeError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return result[1] if isinstance(result, tuple) and len(result) == 2 else None


class IpcBlock:
    """``nbytes`` of device memory from cudaMalloc with its IPC handle; a ``__cuda_array_interface__``
    of bytes, so ``torch.as_tensor`` views it without a copy (and keeps it alive)."""

    def __init__(self, nbytes: int, runner: "RemoteRunner | None" = None):
        cudart = _cudart()
        self.nbytes = max(int(nbytes), 1)
        self.ptr = int(_check(cudart.cudaMalloc(self.nbytes), "cudaMalloc"))
        handle = _check(cudart.cudaIpcGetMemHandle(self.ptr), "cudaIpcGetMemHandle")
        self.hex = _handle_bytes(handle).hex()
        self.runner = runner
        self.buffer_ids: list[int] = []

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": (self.nbytes,), "typestr": "|u1", "data": (self.ptr, False), "version": 3}

    def __del__(self) -> None:
        r = self.runner
        if r is not None and self.buffer_ids:
            r.release(self.ptr, self.buffer_ids)  # freed once the runner has closed its handle
            return
        try:
            _cudart().cudaFree(self.ptr)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass


def _handle_bytes(handle: Any) -> bytes:
    """The 64 bytes of a ``cudaIpcMemHandle_t`` (read at the struct's address: the same in every
    version of the bindings, whatever ``reserved`` returns)."""
    import ctypes

    if hasattr(handle, "getPtr"):
        return ctypes.string_at(int(handle.getPtr()), 64)
    raw = handle.reserved
    return bytes(raw) if isinstance(raw, (bytes, bytearray)) else bytes(int(v) & 0xFF for v in raw)


def ipc_blocks(device: torch.device, runner: "RemoteRunner") -> Any:
    """A :class:`~.guards.GuardedBuffers` block factory of :class:`IpcBlock` s."""

    def make(n: int) -> tuple[torch.Tensor, Any]:
        blk = IpcBlock(n, runner)
        return torch.as_tensor(blk, device=device), blk

    return make


# ------------------------------------------------------------------ the Runner over it


class RemoteRunner:
    """The :class:`~.session.Runner` protocol over a :class:`NativeRunner` (module docstring).

    Every tensor handed to the program must come from ``buffers`` (a :class:`~.guards.GuardedBuffers`
    over :func:`ipc_blocks`); one that does not is copied into a guarded staging block first (and its
    outputs copied back), which ``staged`` counts."""

    def __init__(self, native: NativeRunner, device: torch.device):
        self.native = native
        self.device = torch.device(device)
        self.buffers: Any = None  # set by the worker: GuardedBuffers over ipc_blocks(device, self)
        self._buf_ids: dict[tuple[str, int, int], int] = {}
        self._tensor_ids: dict[tuple[int, int, tuple[int, ...]], int] = {}
        self._tid_buf: dict[int, int] = {}
        self._next = 1
        self._to_free: list[tuple[int, list[int]]] = []
        self.staged = 0
        self.pressure = False

    pressure_ok = True
    where = "the native runner"

    # -------------------------------------------------------------- buffers and descriptors

    def release(self, ptr: int, ids: list[int]) -> None:
        self._to_free.append((ptr, ids))

    def _collect(self) -> None:
        if not self._to_free:
            return
        todo, self._to_free = self._to_free, []
        for ptr, ids in todo:
            for bid in ids:
                self._buf_ids = {k: v for k, v in self._buf_ids.items() if v != bid}
                self._tensor_ids = {k: v for k, v in self._tensor_ids.items() if k[0] != bid}
                self.native.call("free", bid, check=False)
            _cudart().cudaFree(ptr)

    def _tid(self, t: torch.Tensor) -> int:
        found = self.buffers.block_of(t) if self.buffers is not None else None
        if found is None or not t.is_contiguous():
            raise KeyError("not a guarded buffer")
        block, base = found
        blk = block.owner
        offset = t.data_ptr() - blk.ptr
        nbytes = t.numel() * t.element_size()
        bkey = (blk.hex, offset, nbytes)
        bid = self._buf_ids.get(bkey)
        if bid is None:
            bid = self._next
            self._next += 1
            try:
                self.native.call("buf", bid, "ipc", blk.hex, offset, nbytes)
            except RunnerError as e:  # the runner cannot open the Verifier's memory: this machine's limit
                raise RunnerUnavailable(f"the native runner cannot open CUDA IPC memory ({e})") from None
            self._buf_ids[bkey] = bid
            blk.buffer_ids.append(bid)
        tkey = (bid, ST_DTYPE[t.dtype], tuple(t.shape))
        tid = self._tensor_ids.get(tkey)
        if tid is None:
            tid = self._next
            self._next += 1
            self.native.call("tensor", tid, bid, ST_DTYPE[t.dtype], t.dim(), *t.shape)
            self._tensor_ids[tkey] = tid
            self._tid_buf[tid] = bid
        return tid

    def _args(self, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor]
              ) -> tuple[list[Any], list[tuple[torch.Tensor, torch.Tensor]]]:
        """The words of ARGS, and (staging, original) pairs of outputs to copy back."""
        self._collect()
        words: list[Any] = []
        back: list[tuple[torch.Tensor, torch.Tensor]] = []
        for group, is_out in ((inputs, False), (outputs, True)):
            words.append(len(group))
            for t in group:
                try:
                    words.append(self._tid(t))
                except KeyError:
                    self.staged += 1
                    s = self.buffers.copy(t.contiguous(), label="staging")
                    words.append(self._tid(s))
                    if is_out:
                        back.append((s, t))
        torch.cuda.synchronize(self.device)  # what this process wrote is there before the runner reads it
        return words, back

    @staticmethod
    def _copy_back(back: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        for s, t in back:
            t.copy_(s)

    # -------------------------------------------------------------- the Runner protocol

    def create(self, weights: Sequence[torch.Tensor], device: int) -> None:
        self._collect()
        ids = [self._tid(w) for w in weights]
        torch.cuda.synchronize(self.device)
        self.native.call("create", device, len(ids), *ids)

    def context(self):
        import contextlib

        return contextlib.nullcontext()

    def run(self, inputs, outputs, *, pressure: bool = False) -> None:
        words, back = self._args(inputs, outputs)
        self.native.call("run", *words, *(["pressure"] if pressure or self.pressure else []))
        self._copy_back(back)

    def sync(self) -> None:
        pass  # every command returns once the runner's stream has finished

    def sync_device(self) -> None:
        self.native.call("syncall")
        torch.cuda.synchronize(self.device)

    def ordered_run(self, inputs, outputs, sources, snapshot) -> None:
        """Stream order: the runner's stream held, ``sources`` copied into ``inputs`` on it, the
        program run, ``outputs`` copied into ``snapshot`` on it, then the stream awaited."""
        words, _ = self._args(inputs, outputs)
        src = [self._tid(t) for t in sources]
        snap = [self._tid(t) for t in snapshot]
        torch.cuda.synchronize(self.device)
        n_in = len(inputs)
        in_ids, out_ids = words[1:1 + n_in], words[2 + n_in:2 + n_in + len(outputs)]
        self.native.call("hold", 20000)
        for t, dst, s in zip(inputs, in_ids, src):
            self.native.call("copy", self._tid_buf[dst], self._tid_buf[s], t.numel() * t.element_size())
        self.native.call("run", *words, "nosync")
        for t, o, s in zip(outputs, out_ids, snap):
            self.native.call("copy", self._tid_buf[s], self._tid_buf[o], t.numel() * t.element_size())
        self.native.call("sync")

    def timed(self, inputs, outputs, flush: bool = True) -> float:
        words, back = self._args(inputs, outputs)
        ms = float(self.native.call("time", 1 if flush else 0, *words)["ms"])
        self._copy_back(back)
        return ms

    def wall(self, inputs, outputs) -> float:
        words, back = self._args(inputs, outputs)
        ms = float(self.native.call("wall", *words)["ms"])
        self._copy_back(back)
        return ms

    def wall_empty(self) -> float:
        """The host clock around one empty kernel on the runner's stream between two device-wide
        synchronisations, in the runner: what waiting for any launch costs there."""
        return float(self.native.call("wall_empty")["ms"])

    def repeat(self, inputs, outputs, k: int) -> None:
        words, back = self._args(inputs, outputs)
        self.native.call("repeat", k, *words)
        self._copy_back(back)

    def capture(self, inputs, outputs) -> None:
        words, _ = self._args(inputs, outputs)
        self.native.call("capture", *words)

    def replay(self) -> None:
        torch.cuda.synchronize(self.device)
        self.native.call("replay")

    def drop_capture(self) -> None:
        self.native.call("drop_graph", check=False)

    def memory(self) -> Any:
        """A :class:`~..measure.memory.MemoryReading` of the runner's process."""
        from ..measure.memory import MemoryReading

        r = self.native.call("memory")
        device = int(r["device_total"]) - int(r["device_free"]) if int(r.get("device_total", 0)) else None
        own = self.own_device_bytes()
        return MemoryReading(device=device if own is None else own, host=int(r["rss"]),
                             pinned=int(r["pinned"]) + int(r["pool_live"]),
                             device_scope="device" if own is None else "process")

    def own_device_bytes(self) -> int | None:
        """The runner process's own device memory, where NVML names it (:mod:`..measure.gpu_processes`)."""
        from ..measure import gpu_processes

        if self.device.type != "cuda" or self.native.prefix:  # under a tool the process is the tool's
            return None
        try:
            uuid = gpu_processes.device_uuid(self.device.index if self.device.index is not None else 0)
        except Exception:  # noqa: BLE001 - no properties, no per-process figure
            return None
        return gpu_processes.process_bytes(self.native.proc.pid, uuid)

    def library_calls(self) -> dict[str, Any]:
        return self.native.call("calls")

    def tuning(self) -> dict[str, str]:
        """The runtime's choices by timing in the runner ({"text", "identity"}: stitchrt/tuning.h)."""
        r = self.native.call("tuning")
        return {"text": str(r.get("text", "")), "identity": str(r.get("identity", ""))}

    def close(self) -> None:
        try:
            self.native.call("destroy", check=False)
        except RunnerDied:
            pass
        self.native.close()


__all__ = ["RunnerUnavailable", "RunnerDied", "RunnerTimeout", "RunnerError", "runner_source", "source_hash", "runner_binary",
           "NativeRunner", "IpcBlock", "ipc_blocks", "RemoteRunner", "ST_DTYPE"]
