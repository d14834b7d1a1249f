"""Workers of one host take turns (stitchcuda.hostlock): a timing loop waits for the compiles in
flight, no compile starts while it waits, and nothing waits without the variable; workers that
share a GPU hold it alone in turn, and a verification holds it from its child's start to its end."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from stitchcuda import hostlock

HOLD = """
import sys, time
from stitchcuda import hostlock
with hostlock.{kind}() as h:
    print("held", time.time(), flush=True)
    time.sleep({seconds})
print("released", time.time(), flush=True)
"""


def _holder(kind: str, seconds: float, env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOLD.format(kind=kind, seconds=seconds)], env=env,
                            stdout=subprocess.PIPE, text=True)


def _wait_held(p: subprocess.Popen) -> float:
    line = p.stdout.readline().split()
    assert line and line[0] == "held", line
    return float(line[1])


@pytest.fixture
def lock_env(tmp_path, monkeypatch):
    import os

    monkeypatch.setenv(hostlock.ENV, str(tmp_path / "sub" / "host.lock"))  # its folder made on first use
    return dict(os.environ)


def test_without_the_variable_nothing_waits(monkeypatch):
    monkeypatch.delenv(hostlock.ENV, raising=False)
    with hostlock.quiet() as a, hostlock.busy() as b:
        assert (a.acquired, b.acquired, a.seconds, b.seconds) == (False, False, 0.0, 0.0)


def test_a_timing_loop_waits_for_the_compile_in_flight(lock_env):
    compiling = _holder("busy", 1.0, lock_env)
    _wait_held(compiling)
    t0 = time.monotonic()
    with hostlock.quiet() as h:
        waited = time.monotonic() - t0
        assert h.acquired and waited >= 0.5 and h.seconds == pytest.approx(waited, abs=0.05)
        with hostlock.busy() as inner:  # this process's own compile inside its window does not wait for itself
            assert inner.seconds == 0.0
    compiling.wait(10)
    # two compiles share the host
    a, b = _holder("busy", 1.0, lock_env), _holder("busy", 1.0, lock_env)
    ta, tb = _wait_held(a), _wait_held(b)
    assert abs(ta - tb) < 0.8, "the second compile waited for the first"
    a.wait(10), b.wait(10)


def test_no_compile_starts_while_a_timing_loop_waits(lock_env):
    """A stream of compiles cannot starve the timing loop: the turnstile holds new ones back."""
    first = _holder("busy", 3.0, lock_env)
    _wait_held(first)
    released = []

    def timer():
        with hostlock.quiet() as h:
            assert h.acquired
            time.sleep(0.5)
        released.append(time.time())

    t = threading.Thread(target=timer)
    t.start()
    time.sleep(0.3)  # the timing loop is now waiting for the first compile
    second = _holder("busy", 0.1, lock_env)
    started = _wait_held(second)
    t.join(10)
    assert released and started >= released[0] - 0.05, "a compile started while the timing loop waited"
    first.wait(10), second.wait(10)


def test_a_wait_too_long_gives_up_and_says_so(lock_env):
    compiling = _holder("busy", 2.0, lock_env)
    _wait_held(compiling)
    with hostlock.quiet(max_wait_s=0.3) as h:
        assert not h.acquired and 0.25 <= h.seconds < 1.5
    compiling.wait(10)


def test_workers_sharing_a_gpu_hold_it_in_turn(tmp_path, monkeypatch):
    import os

    monkeypatch.delenv(hostlock.GPU_ENV, raising=False)
    with hostlock.gpu_alone() as h:
        assert (h.acquired, h.seconds) == (False, 0.0)                   # no variable: nothing waits
    monkeypatch.setenv(hostlock.GPU_ENV, str(tmp_path / "gpu-0.lock"))
    env = dict(os.environ)
    other = _holder("gpu_alone", 1.0, env)
    _wait_held(other)
    t0 = time.monotonic()
    with hostlock.gpu_alone() as h:
        waited = time.monotonic() - t0
        assert h.acquired and waited >= 0.5, "ran on the GPU beside the other worker"
        with hostlock.gpu_alone() as inner:                               # its own nested use does not wait for itself
            assert inner.seconds == 0.0
    other.wait(10)
    holder = _holder("gpu_alone", 2.0, env)
    _wait_held(holder)
    with hostlock.gpu_alone(max_wait_s=0.3) as h:
        assert not h.acquired and 0.25 <= h.seconds < 1.5                # gave up
    holder.wait(10)


def test_a_verification_child_has_the_gpu_alone_from_its_start_to_its_end(tmp_path, monkeypatch):
    """The parent takes the lock before the child starts (the child's phase clocks do not count the
    wait) and keeps it until it ends; the child does not inherit the variable (it would wait for its
    own parent). The child itself finds the lock taken."""
    from stitchcuda.verifier.run.child import clean_env, run_child

    lock = tmp_path / "gpu-0.lock"
    monkeypatch.setenv(hostlock.GPU_ENV, str(lock))
    probe = ("import fcntl, os\n"
             "fd = os.open(os.environ.get('LOCK_FILE'), os.O_RDWR)\n"
             "try:\n    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB); print('free')\n"
             "except BlockingIOError:\n    print('held by the parent')\n"
             f"print('variable', os.environ.get('{hostlock.GPU_ENV}'))\n")
    out = run_child([sys.executable, "-c", probe], env=clean_env({"LOCK_FILE": str(lock)}))
    assert "held by the parent" in out.log_tail and "variable None" in out.log_tail, out.log_tail
    assert hostlock._gpu_held[0] == 0
    with hostlock.gpu_alone() as h:                                      # released after the child
        assert h.acquired and h.seconds < 0.5


def test_the_loops_clock_leaves_out_what_it_waited_for_the_gpu(tmp_path, monkeypatch):
    """An ``optimize`` budget is of the loop's own work: ``own_clock`` (the loop's clock) stands still
    while its process waits for a GPU another worker holds, and runs while it holds the GPU itself."""
    import os

    from stitchcuda.workflow.loop import Loop

    assert Loop.__init__.__kwdefaults__["clock"] is hostlock.own_clock
    monkeypatch.setenv(hostlock.GPU_ENV, str(tmp_path / "gpu-0.lock"))
    other = _holder("gpu_alone", 1.0, dict(os.environ))
    _wait_held(other)
    waited0, own0, wall0 = hostlock.gpu_waited(), hostlock.own_clock(), time.monotonic()
    with hostlock.gpu_alone() as h:
        assert h.acquired and h.seconds >= 0.5
        time.sleep(0.3)                                                   # its own work on the GPU
    other.wait(10)
    wall, own = time.monotonic() - wall0, hostlock.own_clock() - own0
    assert hostlock.gpu_waited() - waited0 == pytest.approx(h.seconds)
    assert wall >= 0.8 and 0.25 <= own <= wall - h.seconds + 0.05, (wall, own, h.seconds)
