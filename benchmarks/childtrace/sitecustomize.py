"""Line coverage of stitchcuda's code in every Python process started with this folder on
PYTHONPATH and ``STITCHCUDA_COVERAGE_DIR`` set (``benchmarks/verifier_coverage.py`` sets both), the
Verifier's worker child included: ``run.child.clean_env`` keeps PYTHONPATH and ``STITCHCUDA_*``.

Standard library only (the GPU machine may have no coverage.py): ``sys.monitoring`` on Python 3.12
and later (each line reported once, then its event disabled: near-zero cost), ``sys.settrace``
before. Only files under a ``stitchcuda`` folder are recorded. Each process writes
``trace-<pid>-<ns>.json`` (its argv and the lines it ran) at exit, and also on ``os._exit``, which the
worker leaves by; a process killed by a signal (a crash, a timeout) writes nothing.
"""

from __future__ import annotations

import os

_OUT = os.environ.get("STITCHCUDA_COVERAGE_DIR")

if _OUT:
    import atexit
    import json
    import sys
    import time

    _MARK = os.sep + "stitchcuda" + os.sep
    _hits: dict[str, set[int]] = {}
    _done = [False]

    def _dump() -> None:
        if _done[0]:
            return
        _done[0] = True
        try:
            data = {"pid": os.getpid(), "argv": list(sys.argv),
                    "files": {f: sorted(lines) for f, lines in _hits.items()}}
            os.makedirs(_OUT, exist_ok=True)
            path = os.path.join(_OUT, f"trace-{os.getpid()}-{time.time_ns()}.json")  # runs may share a folder
            with open(path + ".tmp", "w") as fh:
                json.dump(data, fh)
            os.replace(path + ".tmp", path)
        except Exception:  # noqa: BLE001  (measurement must never change how the process ends)
            pass

    _real_exit = os._exit

    def _exit(code: int) -> None:
        _dump()
        _real_exit(code)

    os._exit = _exit
    atexit.register(_dump)

    _mon = getattr(sys, "monitoring", None)
    if _mon is not None:
        try:
            _mon.use_tool_id(_mon.COVERAGE_ID, "stitchcuda-childtrace")
        except ValueError:  # the coverage slot is taken (coverage.py itself): trace the old way
            _mon = None
    if _mon is not None:
        _TOOL = _mon.COVERAGE_ID

        def _start(code, offset):
            if _MARK in code.co_filename:
                _mon.set_local_events(_TOOL, code, _mon.events.LINE)
            return _mon.DISABLE

        def _line(code, line):
            _hits.setdefault(code.co_filename, set()).add(line)
            return _mon.DISABLE

        _mon.register_callback(_TOOL, _mon.events.PY_START, _start)
        _mon.register_callback(_TOOL, _mon.events.LINE, _line)
        _mon.set_events(_TOOL, _mon.events.PY_START)
    else:
        import threading

        def _local(frame, event, arg):
            if event == "line":
                _hits.setdefault(frame.f_code.co_filename, set()).add(frame.f_lineno)
            return _local

        def _global(frame, event, arg):
            return _local if _MARK in frame.f_code.co_filename else None

        sys.settrace(_global)
        threading.settrace(_global)
