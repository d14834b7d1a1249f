"""Running untrusted candidates in a child process: clean environment, time limits, typed outcomes.

A candidate runs in ``python -m stitchcuda.verifier.run.worker`` (or any command given), in its own
process group, with a clean environment (:func:`clean_env`), in an empty working directory of
its own. It reads its job from stdin and reports over a pipe (the write end's number is put in
its argv where ``{channel}`` stands): JSON lines, ``{"t": TOKEN, "phase": NAME}`` when a phase
starts and ``{"t": TOKEN, "result": {...}}`` after each phase (the whole result so far, so what
was finished survives a later crash). Lines without the job's token are ignored. No file the
candidate could read or forge carries the job or the results; its output goes to a log the
parent keeps outside that directory.

The parent watches the phase: each phase has a budget, and a child over budget — or over the
total limit — has its whole process group killed. Whatever happens to the child becomes a value:

=================  =============================================================================
``ok``             exit status 0 and a result
``crash``          killed by a signal, or a non-zero exit: ``verdict.classify_crash`` on the
                   output (illegal address / CUDA error 700, segfault, abort, out of memory ...)
``timeout``        a phase or the whole run over its limit: ``verdict.Timeout(stage=phase)``
=================  =============================================================================

The parent itself never touches CUDA here, so a child that wrecks its CUDA context (error 700 is
sticky) cannot take the parent down, and the next candidate starts in a fresh process.
"""

from __future__ import annotations

import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from ...hostlock import GPU_ENV, gpu_alone
from ..report.verdict import Crash, Timeout, classify_crash, trim

#: Variables a child may inherit besides the prefixes below.
ENV_KEEP = ("PATH", "HOME", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES", "PYTHONPATH", "TMPDIR")
#: Prefixes of variables a child may inherit: the project's own switches, and PyTorch / NCCL /
#: Triton settings that keep a run safe or its caches in place (NCCL_NVLS_ENABLE=0, TORCHINDUCTOR_CACHE_DIR ...).
ENV_PREFIXES = ("STITCHCUDA_", "NCCL_", "TORCH_", "TORCHINDUCTOR_", "PYTORCH_", "TRITON_")

CHANNEL = "{channel}"


def clean_env(extra: Mapping[str, str] | None = None, base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The child's environment: ENV_KEEP and ENV_PREFIXES from ``base`` (os.environ), the folder
    of this stitchcuda package first on PYTHONPATH (so the child imports the same code), unbuffered
    output, and ``extra``."""
    base = os.environ if base is None else base
    # not the GPU's lock: the parent holds it for the child (run_child), which would wait for it
    env = {k: v for k, v in base.items() if (k in ENV_KEEP or k.startswith(ENV_PREFIXES)) and k != GPU_ENV}
    pkg_root = str(Path(__file__).resolve().parents[3])
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != pkg_root]
    env["PYTHONPATH"] = os.pathsep.join([pkg_root] + paths)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("PATH", os.defpath)
    # Multi-GiB draws freed and made again fragment PyTorch's caching allocator: on an 80 GB GPU a
    # 16 GiB problem had 15.6 GiB reserved but unusable when its next draw ran out of memory.
    env.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    if extra:
        env.update(extra)
    return env


@dataclass(frozen=True)
class Limits:
    """Seconds per phase, and in all. A phase not named gets ``default``."""

    phases: Mapping[str, float] = field(default_factory=lambda: {
        "setup": 300.0, "correctness": 300.0, "sanitizer": 900.0, "timing": 900.0, "reference_profile": 300.0,
        "profile": 300.0})
    default: float = 300.0
    total: float = 2700.0

    def budget(self, phase: str) -> float:
        return float(self.phases.get(phase, self.default))

    @classmethod
    def scaled(cls, factor: float) -> "Limits":
        base = cls()
        return cls({k: v * factor for k, v in base.phases.items()}, base.default * factor, base.total * factor)


@dataclass(frozen=True)
class ChildOutcome:
    status: str  # ok | crash | timeout
    returncode: int | None
    result: dict[str, Any] | None  # the last result.json the child wrote (partial after a crash)
    phase: str  # the phase the child was in at the end
    seconds: float
    log_tail: str = ""
    crash: Crash | None = None
    timeout: Timeout | None = None
    phase_seconds: tuple[tuple[str, float], ...] = ()  # as the parent saw them

    @property
    def ok(self) -> bool:
        return self.status == "ok"


class Channel:
    """The child's end of the report pipe: JSON lines marked with the job's token."""

    def __init__(self, fd: int, token: str = ""):
        self.fd, self.token = fd, token

    def send(self, **message: Any) -> None:
        data = (json.dumps({"t": self.token, **message}, allow_nan=False, default=str) + "\n").encode()
        view = memoryview(data)
        while view:
            n = os.write(self.fd, view)
            view = view[n:]


class _Reader:
    """The parent's end: splits the pipe into lines, keeps the last phase and the last result."""

    def __init__(self, fd: int, token: str | None):
        self.fd, self.token = fd, token
        self.buf = b""
        self.phase: str | None = None
        self.result: dict[str, Any] | None = None
        self.ignored = 0

    def pump(self, timeout: float) -> bool:
        """Read what arrives within ``timeout`` seconds and take its whole lines; False when
        nothing came (no data in time, or the pipe closed)."""
        ready, _, _ = select.select([self.fd], [], [], timeout)
        if not ready:
            return False
        chunk = os.read(self.fd, 1 << 20)
        if not chunk:
            return False
        self.buf += chunk
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self._line(line)
        return True

    def drain(self) -> None:
        while self.pump(0):
            pass

    def _line(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            self.ignored += 1
            return
        if not isinstance(msg, dict) or (self.token is not None and msg.get("t") != self.token):
            self.ignored += 1
            return
        if isinstance(msg.get("phase"), str):
            self.phase = msg["phase"]
        if isinstance(msg.get("result"), dict):
            self.result = msg["result"]


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to SIGKILL it when the parent dies. A parent killed by
    SIGTERM runs no cleanup, and a child in its own session would otherwise keep its GPU memory
    (seen on an H200: a timed-out benchmark left a child holding 112 GiB)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # noqa: BLE001 - not Linux: the parent's own cleanup is all there is
        pass


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    try:
        proc.kill()
    except ProcessLookupError:
        pass


def _tail(path: Path, chars: int = 8000) -> str:
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - chars))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_child(argv: Sequence[str], workdir: str | os.PathLike | None = None, *, stdin: str = "",
              limits: Limits = Limits(), env: Mapping[str, str] | None = None, token: str | None = None,
              poll: float = 0.05, first_phase: str = "setup",
              on_phase: Callable[[str], None] | None = None) -> ChildOutcome:
    """Run ``argv`` (``{channel}`` replaced by the report pipe's descriptor) in an empty working
    directory (``workdir``, created and removed here, or a fresh temporary one), ``stdin`` written
    to it, under ``limits``; never raises for anything the child does. ``on_phase(name)`` is told
    each phase the child enters (a command's progress display). Where workers share the GPU, the
    child has it alone (``hostlock.gpu_alone``), taken before its clocks start."""
    with gpu_alone("a verification child"):
        return _run_child(argv, workdir, stdin, limits, env, token, poll, first_phase, on_phase)


def _run_child(argv: Sequence[str], workdir: str | os.PathLike | None, stdin: str, limits: Limits,
               env: Mapping[str, str] | None, token: str | None, poll: float, first_phase: str,
               on_phase: Callable[[str], None] | None) -> ChildOutcome:
    wd = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="stitchcuda-child-"))
    wd.mkdir(parents=True, exist_ok=True)
    logdir = Path(tempfile.mkdtemp(prefix="stitchcuda-log-"))
    log = logdir / "child.log"
    r_fd, w_fd = os.pipe()
    reader = _Reader(r_fd, token)
    args = [str(w_fd) if a == CHANNEL else a for a in argv]
    t0 = time.monotonic()
    phase, phase_t0 = first_phase, t0
    seen: list[tuple[str, float]] = []
    timeout: Timeout | None = None
    try:
        with log.open("wb") as logf:
            proc = subprocess.Popen(args, cwd=str(wd), env=dict(env) if env is not None else clean_env(),
                                    stdin=subprocess.PIPE, stdout=logf, stderr=subprocess.STDOUT, pass_fds=(w_fd,),
                                    start_new_session=True, preexec_fn=_die_with_parent)
            os.close(w_fd)
            w_fd = -1
            feeder = threading.Thread(target=_feed, args=(proc, stdin), daemon=True)
            feeder.start()
            try:
                while proc.poll() is None:
                    reader.pump(poll)
                    now = time.monotonic()
                    if reader.phase and reader.phase != phase:
                        seen.append((phase, now - phase_t0))
                        phase, phase_t0 = reader.phase, now
                        if on_phase is not None:
                            on_phase(phase)
                    if now - phase_t0 > limits.budget(phase):
                        timeout = Timeout(round(limits.budget(phase), 3), phase)
                    elif now - t0 > limits.total:
                        timeout = Timeout(round(limits.total, 3), phase)
                    if timeout is not None:
                        _kill_group(proc)
                        proc.wait()
                        break
            except BaseException:
                _kill_group(proc)
                proc.wait()
                raise
            finally:
                # nothing the child started may outlive it
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        end = time.monotonic()
        reader.drain()
        if reader.phase and reader.phase != phase and timeout is None:  # entered after the last poll
            seen.append((phase, end - phase_t0))
            phase, phase_t0 = reader.phase, end
        seen.append((phase, end - phase_t0))
        tail = _tail(log)
    finally:
        if w_fd >= 0:
            os.close(w_fd)
        os.close(r_fd)
        shutil.rmtree(logdir, ignore_errors=True)
        if workdir is None:
            shutil.rmtree(wd, ignore_errors=True)
    data = reader.result
    rc = proc.returncode
    common = dict(returncode=rc, result=data, phase=phase, seconds=end - t0, log_tail=trim(tail, 8000),
                  phase_seconds=tuple(seen))
    if timeout is not None:
        return ChildOutcome("timeout", timeout=timeout, **common)
    if rc == 0 and data is not None:
        return ChildOutcome("ok", **common)
    reported = (data or {}).get("crash")
    if isinstance(reported, dict):  # the child caught its own failure and said what it was
        text = str(reported.get("message", ""))
        crash = classify_crash(rc, text + "\n" + tail, reported.get("trial"))
        crash = Crash(crash.kind, trim(_key_line(text) or crash.message, 600), crash.trial)
    else:
        msg = tail
        if rc is not None and rc < 0:
            try:
                msg = f"killed by signal {signal.Signals(-rc).name}\n" + tail
            except ValueError:
                msg = f"killed by signal {-rc}\n" + tail
        elif rc == 0:
            msg = "the child exited without reporting its result\n" + tail
        crash = classify_crash(rc, msg)
        crash = Crash(crash.kind, trim(_key_line(msg) or crash.message, 600), crash.trial)
    return ChildOutcome("crash", crash=crash, **common)


def _feed(proc: subprocess.Popen, text: str) -> None:
    try:
        assert proc.stdin is not None
        proc.stdin.write(text.encode())
        proc.stdin.close()
    except (BrokenPipeError, OSError, ValueError):
        pass


_KEY = re.compile(r"CUDA error|illegal (memory|address)|out of memory|MemoryError|Segmentation fault|Aborted|"
                  r"terminate called|killed by signal|\w+(Error|Exception): |failed", re.I)


def _key_line(text: str) -> str:
    """The line that says what went wrong: the last one naming a CUDA error, a signal or an exception."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    hits = [ln for ln in lines if _KEY.search(ln) and not ln.startswith(("File ", "Traceback"))]
    if not hits:
        return ""
    strong = [ln for ln in hits if re.search(r"CUDA error|illegal|out of memory|MemoryError|signal", ln, re.I)]
    return (strong or hits)[-1]


def worker_argv() -> list[str]:
    return [sys.executable, "-m", "stitchcuda.verifier.run.worker", CHANNEL]


__all__ = ["ENV_KEEP", "ENV_PREFIXES", "CHANNEL", "Channel", "clean_env", "Limits", "ChildOutcome", "run_child",
           "worker_argv"]
