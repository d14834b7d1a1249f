"""Long commands the suite knows it will need, run in the background from the start of the session.

Most of the suite runs on one core (Python, torch.export, the plan interpreter), while nvcc for
the template units and the adversarial programs, and the coverage sweep over KernelBench, need
minutes of their own. A test module declares such commands in ``ahead_commands(out) -> {key:
argv}`` (each writes what it makes under the folder ``out``); when the session starts, one
background worker (the lane) runs the commands of the selected modules, in the order the modules
run, at the lowest CPU priority (``nice -n 19``): it takes a core the tests leave idle and yields
it to them otherwise. The module's fixture reads :func:`results`: a command the lane finished is
read, one in flight is waited for, the rest run there and then, two at a time. What each test
asserts is unchanged; only when the work is done changes.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

#: The foreground's width when a test needs results the lane has not started.
WORKERS = 2


@dataclass(frozen=True)
class Done:
    """One command's outcome: its exit status, stdout and stderr together, its wall time, and the
    folder it was given for what it writes."""

    returncode: int
    output: str
    seconds: float
    out: Path


def run(argv: list[str], out: Path, nice: bool = False, started=None) -> Done:
    """Run ``argv`` to its end (``nice``: at the lowest CPU priority); ``started(process)`` is
    called once it runs."""
    t0 = time.monotonic()
    if nice and shutil.which("nice"):
        argv = ["nice", "-n", "19", *argv]
    # A process group of its own: ending it ends nvcc's cicc / ptxas too, not only the driver.
    with subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          start_new_session=True) as p:
        if started is not None:
            started(p)
        output, _ = p.communicate()
    return Done(p.returncode, output, time.monotonic() - t0, out)


def _end(process: subprocess.Popen) -> None:
    """Kill ``process`` and its group (what it started)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)


class Lane:
    """One background worker over an ordered queue of commands; see the module docstring."""

    def __init__(self, root: Path):
        self.root = root
        self._lock = threading.Lock()
        self._pending: OrderedDict[tuple[str, str], list[str]] = OrderedDict()
        self._futures: dict[tuple[str, str], Future] = {}
        self._commands: dict[str, dict[str, list[str]]] = {}
        self._out: dict[str, Path] = {}
        self._stop = False
        self._running: set[subprocess.Popen] = set()
        self._thread = threading.Thread(target=self._work, name="ahead", daemon=True)

    def add(self, module: ModuleType) -> None:
        out = self.root / module.__name__.rpartition(".")[2]
        out.mkdir(parents=True, exist_ok=True)
        commands = module.ahead_commands(out)
        with self._lock:
            self._commands[module.__name__], self._out[module.__name__] = commands, out
            for key, argv in commands.items():
                self._pending[(module.__name__, key)] = argv

    def start(self) -> None:
        self._thread.start()

    def _take(self, wanted=None) -> tuple[tuple[str, str], list[str], Future] | None:
        with self._lock:
            if self._stop:
                return None
            key = next((k for k in self._pending if wanted is None or k in wanted), None)
            if key is None:
                return None
            argv = self._pending.pop(key)
            future = self._futures[key] = Future()
            future.set_running_or_notify_cancel()
            return key, argv, future

    def _run(self, wanted=None, nice: bool = False) -> None:
        """Take commands (of ``wanted``, else any) off the queue and run them, until none is left."""
        while (job := self._take(wanted)) is not None:
            key, argv, future = job
            try:
                future.set_result(run(argv, self._out[key[0]], nice, self._started))
            except BaseException as e:  # noqa: BLE001 - the test that reads it re-raises
                future.set_exception(e)

    def _work(self) -> None:
        self._run(nice=True)

    def _started(self, process: subprocess.Popen) -> None:
        with self._lock:
            self._running = {p for p in self._running if p.poll() is None} | {process}
            if self._stop:
                _end(process)

    def _kill(self) -> None:
        """Stop taking commands and end those running (call with the lock held)."""
        self._stop = True
        self._pending.clear()
        for p in self._running:
            _end(p)

    def has(self, module: ModuleType) -> bool:
        with self._lock:
            return module.__name__ in self._commands

    def results(self, module: ModuleType) -> dict[str, Done]:
        """Every command of ``module``: those still queued run here, ``WORKERS`` at a time (less
        one while the lane runs another module's command), then all are waited for."""
        name = module.__name__
        keys = {(name, k) for k in self._commands[name]}
        with self._lock:
            busy = any(not f.done() for k, f in self._futures.items() if k not in keys)
        width = max(1, WORKERS - busy)
        pool = ThreadPoolExecutor(width)
        try:
            for f in [pool.submit(self._run, keys) for _ in range(width)]:
                f.result()
        except BaseException:  # Ctrl-C: end the running commands, or the pool waits for each of them
            with self._lock:
                self._kill()
            raise
        finally:
            pool.shutdown(wait=True)
        return {k: self._futures[(name, k)].result() for k in self._commands[name]}

    def close(self) -> None:
        """Drop what is queued and end the command in flight (a session cut short leaves nothing running)."""
        with self._lock:
            self._kill()
        self._thread.join(timeout=60)
        shutil.rmtree(self.root, ignore_errors=True)


_LANE: Lane | None = None


def nvcc() -> str | None:
    """nvcc as the package finds it, for the commands (None without one: no command is declared)."""
    from stitchcuda.toolchain import find_nvcc

    found = find_nvcc()
    return str(found) if found else None


def start(modules: list[ModuleType]) -> None:
    """Queue the commands of ``modules`` (in this order) and start the lane."""
    global _LANE
    modules = [m for m in modules if hasattr(m, "ahead_commands")]
    if not modules or _LANE is not None:
        return
    _LANE = Lane(Path(tempfile.mkdtemp(prefix="stitchcuda-ahead-")))
    for m in modules:
        _LANE.add(m)
    _LANE.start()


def stop() -> None:
    global _LANE
    if _LANE is not None:
        _LANE.close()
        _LANE = None


def results(module: ModuleType, out: Path) -> dict[str, Done]:
    """``module.ahead_commands``'s outcomes, {key: Done}: from the lane where the session queued
    them, else run here (writing under ``out``), ``WORKERS`` at a time."""
    if _LANE is not None and _LANE.has(module):
        return _LANE.results(module)
    commands = module.ahead_commands(out)
    with ThreadPoolExecutor(WORKERS) as pool:
        futures = {k: pool.submit(run, argv, out) for k, argv in commands.items()}
        return {k: f.result() for k, f in futures.items()}
