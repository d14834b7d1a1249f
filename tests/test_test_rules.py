"""The test run's own rules (tests/conftest.py), run as a user would run pytest: in CI (``CI=true``)
a missing KernelBench set stops the run with a failure naming the path; elsewhere the tests that
need it skip, and the last line says why tests were skipped, grouped by reason."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
NEEDS_DATA = "tests/test_bench.py::test_dev_set_loads"


def _pytest(tmp_path: Path, *args: str, ci: str | None, shared: Path, **extra: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["STITCHCUDA_SHARED"] = str(shared)
    env.update(extra)
    if ci is not None:
        env["CI"] = ci
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)


def test_in_ci_a_missing_dataset_is_a_failure(tmp_path):
    r = _pytest(tmp_path, NEEDS_DATA, ci="true", shared=tmp_path / "no-shared")
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "KernelBench development set is missing" in out and str(tmp_path / "no-shared") in out, out


def test_outside_ci_it_skips_and_the_summary_says_why(tmp_path):
    r = _pytest(tmp_path, NEEDS_DATA, ci=None, shared=tmp_path / "no-shared")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    # The summary is the last line pytest writes to stdout; a plugin's warning at start-up (as
    # pytest-benchmark's under xdist) goes to stderr, after it in ``out``.
    last = [ln for ln in r.stdout.splitlines() if ln.strip()][-1]
    assert last == "skipped: 1 KernelBench dev set not present beside the checkout", out


def test_in_ci_with_the_dataset_the_test_runs(tmp_path, dev_set_path):
    shared = tmp_path / "shared"
    (shared / "kernelbench").mkdir(parents=True)
    (shared / "kernelbench" / "dev.jsonl").write_bytes(dev_set_path.read_bytes())
    r = _pytest(tmp_path, NEEDS_DATA, ci="true", shared=shared)
    assert r.returncode == 0 and "1 passed" in r.stdout, r.stdout + r.stderr


def test_under_xdist_a_slow_fixture_still_says_what_it_is_doing(tmp_path, dev_set_path):
    """The README's test command runs two pytest-xdist workers, whose own reporters write nowhere:
    a module fixture past the threshold (0 s here) is still announced, naming the worker."""
    r = _pytest(tmp_path, "-n", "2", "--dist", "loadfile", "tests/test_conv_cpu.py", ci=None,
                shared=dev_set_path.parents[1], STITCHCUDA_TEST_ANNOUNCE_S="0")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "[lib] setting up ... (gw" in out, out
