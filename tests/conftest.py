"""Test tiers: plain tests run anywhere (CI has no GPU); `gpu` tests need a CUDA device."""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

if os.environ.get("PYTEST_XDIST_WORKER"):
    # one of several test processes (pytest-xdist): PyTorch's own thread pool in each would spin on
    # the cores the others use (two processes x two threads on two cores doubled the CPU time)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MKL_NUM_THREADS", "1")
SHARED = Path(os.environ.get("STITCHCUDA_SHARED") or REPO.parent / "shared")
DEV_SET = SHARED / "kernelbench" / "dev.jsonl"


def in_ci() -> bool:
    """``CI`` set to true (as CI services set it): a missing dataset is then a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") and "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    # pytest-xdist's --dist loadfile hands out the modules with the most tests first, which put
    # the long ones (LONG_MODULES, a few tests each) last: the run ended on one worker's nvcc while
    # the other sat idle. Keep the collection's order, where they come first.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_sessionstart(session):
    """In CI, the KernelBench development set must be there (``../shared`` beside the checkout, or
    ``$STITCHCUDA_SHARED``): without it some 120 tests would skip and the run still read green."""
    if in_ci() and not DEV_SET.is_file():
        pytest.exit(f"CI=true and the KernelBench development set is missing ({DEV_SET}): put the shared data "
                    "beside the checkout or set STITCHCUDA_SHARED; in CI a missing dataset is a failure, not a skip",
                    returncode=pytest.ExitCode.USAGE_ERROR)


def _gpu_available() -> bool:
    if os.environ.get("STITCHCUDA_FORCE_NO_GPU") == "1":
        return False
    try:
        import stitchcuda
    except ImportError:
        return False
    return stitchcuda.has_gpu()


#: Modules that take minutes (nvcc over many units, the coverage sweep, a trained tiny model):
#: they go first, so that under pytest-xdist (``-n 2 --dist loadfile``, the README's test command)
#: no long module starts last while the other worker sits idle.
LONG_MODULES = ("test_build.py", "test_templates_compile.py", "test_coverage.py", "test_rl_cli.py",
                "test_bench.py", "test_cli_readme.py", "test_verifier_static.py", "test_runtime_cpu.py")


def pytest_collection_modifyitems(config, items):
    """The long modules first (a stable sort: the order within a module is kept); without a
    device the GPU tests are skipped."""
    rank = {name: i for i, name in enumerate(LONG_MODULES)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0].rsplit("/", 1)[-1], len(rank)))
    if _gpu_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _one_gpu_test_at_a_time(request):
    """Under pytest-xdist, a GPU test holds a lock shared by the workers: two tests never time or
    fill one device at once (each file runs on one worker, but two files may run together)."""
    if not os.environ.get("PYTEST_XDIST_WORKER") or request.node.get_closest_marker("gpu") is None:
        yield
        return
    import fcntl
    import tempfile

    with open(Path(tempfile.gettempdir()) / f"stitchcuda-pytest-gpu-{os.getuid()}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def find_nvcc() -> str | None:
    """nvcc as the package finds it (stitchcuda.toolchain.find_nvcc)."""
    from stitchcuda.toolchain import find_nvcc as _find

    found = _find()
    return str(found) if found else None


@pytest.fixture(scope="session")
def nvcc() -> str:
    path = find_nvcc()
    if path is None:
        pytest.skip("nvcc not found")
    return path


@pytest.fixture(scope="session")
def dev_set_path() -> Path:
    if not DEV_SET.is_file():
        pytest.skip("KernelBench dev set not present beside the checkout")
    return DEV_SET


# ---------------------------------------------------------------------- what the run is doing


def pytest_collection_finish(session):
    """The long commands the selected modules declare (``ahead_commands``, tests/ahead.py) start in
    the background, in the order the modules run."""
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return   # under pytest-xdist every core runs tests already; each worker would queue every module's commands
    from tests import ahead

    modules = list(dict.fromkeys(item.module for item in session.items if getattr(item, "module", None)))
    ahead.start(modules)


def pytest_sessionfinish(session):
    from tests import ahead

    ahead.stop()


def pytest_unconfigure(config):
    """The run's last line says why tests were skipped, grouped by reason (instead of a bare count):
    written after pytest's own counts, so it is the line a reader sees last."""
    terminalreporter = config.pluginmanager.get_plugin("terminalreporter")
    if terminalreporter is None:
        return
    reasons: dict[str, int] = {}
    for rep in terminalreporter.stats.get("skipped", []):
        longrepr = rep.longrepr
        reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
        reason = reason.removeprefix("Skipped: ")
        reasons[reason] = reasons.get(reason, 0) + 1
    if reasons:
        parts = [f"{n} {r}" for r, n in sorted(reasons.items(), key=lambda kv: -kv[1])]
        terminalreporter.write_line("skipped: " + "; ".join(parts))


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A module or session fixture still setting up after 3 s says what it is doing (the first
    line of its docstring), and how long it took when done: no silent minutes of dots."""
    if fixturedef.scope not in ("module", "session", "package"):
        yield
        return
    import threading
    import time

    doc = (fixturedef.func.__doc__ or "").strip().splitlines()
    what = doc[0].rstrip(".") if doc else "setting up"
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    announced = []

    worker = os.environ.get("PYTEST_XDIST_WORKER")

    def say(text: str) -> None:
        if worker:  # a pytest-xdist worker's reporter writes nowhere; its own stderr is the terminal's
            with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
                sys.__stderr__.write(f"{text.strip()} ({worker})\n")
                sys.__stderr__.flush()
            return
        if reporter is None:
            return
        if capture is None:
            reporter.write_line(text)
            return
        with capture.global_and_fixture_disabled():  # past the output capture of the running test
            reporter.write_line(text)

    def announce():
        say(f"\n[{fixturedef.argname}] {what} ...")
        announced.append(True)

    timer = threading.Timer(float(os.environ.get("STITCHCUDA_TEST_ANNOUNCE_S", "3")), announce)
    t0 = time.monotonic()
    timer.start()
    try:
        yield
    finally:
        timer.cancel()
        if announced:
            say(f"[{fixturedef.argname}] done in {time.monotonic() - t0:.0f} s")
