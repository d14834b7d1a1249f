"""The mutation check's fast subset, and its catalogue kept runnable.

``benchmarks/mutate.py`` applies deliberate faults (``benchmarks/mutants.py``) to a staged copy of
the sources and runs the tests that must catch each. Here: the catalogue has at least 20 faults a
CPU run catches, across the four areas, every patch still applies to today's sources (a moved
text fails here, not silently in a later run), and the mutants marked ``fast`` are run and caught
(a fresh staged copy each, the checkout never touched).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.bench_script import load

REPO = Path(__file__).resolve().parents[1]


mutate = load("mutate")
MUTANTS = mutate.MUTANTS


def test_catalogue_spans_the_four_areas():
    cpu = [m for m in MUTANTS if not m.device]
    assert len(cpu) >= 20
    assert {m.area for m in cpu} == set(mutate.AREAS)
    assert {m.area for m in MUTANTS if m.device} >= {"templates", "verifier"}
    assert len({m.name for m in MUTANTS}) == len(MUTANTS)
    assert 3 <= sum(m.fast for m in MUTANTS) <= 5 and not any(m.fast and m.device for m in MUTANTS)


@pytest.mark.parametrize("name", [m.name for m in MUTANTS])
def test_every_patch_applies_to_todays_sources(name):
    m = mutate.BY_NAME[name]
    mutate.check_applies(m, (REPO / m.path).read_text(encoding="utf-8"))
    files = [a for a in m.tests if a.startswith("tests/")]
    assert files and all((REPO / f.split("::")[0]).is_file() for f in files), m.tests
    assert all(f.startswith("tests/gpu/") == m.device for f in files), m.tests


def test_staging_leaves_the_checkout_alone(tmp_path):
    m = mutate.BY_NAME["relu-wrong-operator"]
    before = (REPO / m.path).read_text(encoding="utf-8")
    package = mutate.installed_package()
    installed = (package / "include" / "stitch" / "ops.cuh").read_text(encoding="utf-8")
    repo, site = mutate.stage(tmp_path, package)
    mutate.apply(m, repo, site)
    for p in mutate.targets(m, repo, site):
        assert m.new in p.read_text(encoding="utf-8")
    assert (REPO / m.path).read_text(encoding="utf-8") == before
    assert (package / "include" / "stitch" / "ops.cuh").read_text(encoding="utf-8") == installed


@pytest.mark.parametrize("name", [m.name for m in MUTANTS if m.fast])
def test_fast_mutant_is_caught(name, tmp_path, nvcc):
    out = mutate.run_mutant(mutate.BY_NAME[name], tmp_path / "stage", mutate.installed_package(), tmp_path / "cache",
                            timeout=300)
    assert out.status == "caught", f"{name}: {out.status} ({out.summary})\n{out.output}"
