"""benchmarks/childtrace: the standard-library tracer behind benchmarks/verifier_coverage.py records
the stitchcuda lines a child process runs, also when it leaves by ``os._exit`` as the Verifier's
worker does, and the report counts them against the module's executable lines."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _coverage_module():
    spec = importlib.util.spec_from_file_location("_stitchcuda_verifier_coverage",
                                                  REPO / "benchmarks" / "verifier_coverage.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_child_leaving_by_os_exit_is_traced(tmp_path):
    import inspect

    from stitchcuda import serial

    env = dict(os.environ, STITCHCUDA_COVERAGE_DIR=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(REPO / "benchmarks" / "childtrace"), os.environ.get("PYTHONPATH", "")]))
    code = "import os, stitchcuda.serial as s; s.to_jsonable({'a': 1}); os._exit(3)"
    r = subprocess.run([sys.executable, "-c", code], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 3, r.stderr
    (trace,) = tmp_path.glob("trace-*.json")
    data = json.loads(trace.read_text())
    ran = set(data["files"][serial.__file__])
    exe = _coverage_module().executable_lines(Path(serial.__file__))
    assert ran and ran <= exe, (ran - exe)
    body, first = inspect.getsourcelines(serial.to_jsonable)
    assert ran & set(range(first + 1, first + len(body))), "no line of to_jsonable's body recorded"
    assert not [f for f in data["files"] if os.sep + "stitchcuda" + os.sep not in f]  # only the package's lines
