"""A script of ``benchmarks/`` imported as a module, for the tests of its CPU half (the scripts are
not a package: they run as ``python benchmarks/<name>.py``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load(name: str):
    """``benchmarks/<name>.py`` as the module ``_stitchcuda_bench_<name>``, loaded once."""
    key = f"_stitchcuda_bench_{name}"
    if key in sys.modules:
        return sys.modules[key]
    spec = importlib.util.spec_from_file_location(key, REPO / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
