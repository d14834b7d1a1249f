"""benchmarks/perf_table.py: the performance set's table counts only verified programs' times."""

from __future__ import annotations

import json

from tests.bench_script import load

CEILINGS = {"name": "a GPU", "bandwidth": 4e12, "peak": 5e13}


def _result(pid: int, status: str, program_ms: float, compile_ms: float) -> dict:
    return {"id": f"L1_{pid}_p", "level": 1, "problem_id": pid, "precision": "tf32", "status": status,
            "ms": {"program": program_ms, "compile_policy": compile_ms, "eager_fp32": compile_ms},
            "flops": 0, "io_bytes": 4_000_000_000, "ceilings": CEILINGS}


def test_a_wrong_answer_has_no_speed(tmp_path, capsys):
    """A program that did not verify keeps its status in the table, but its time is no speed: its row
    shows none, and the geometric means are over the verified rows only."""
    suite = tmp_path / "suite.jsonl"
    suite.write_text("".join(json.dumps({"level": 1, "problem_id": i, "name": f"{i}_p", "source": ""}) + "\n"
                             for i in (1, 2)))
    res = tmp_path / "res"
    res.mkdir()
    # the wrong program is "fast" (4x): counted, it would lift the mean from 2.00x to 2.83x
    res.joinpath("results.jsonl").write_text(json.dumps(_result(1, "passed", 1.0, 2.0)) + "\n"
                                             + json.dumps(_result(2, "wrong_answer", 0.5, 2.0)) + "\n")
    assert load("perf_table").main([str(res), "--suite", str(suite)]) == 0
    lines = capsys.readouterr().out.splitlines()
    ok = next(line for line in lines if line.startswith("| 1:1 "))
    wrong = next(line for line in lines if line.startswith("| 1:2 "))
    mean = next(line for line in lines if "geometric mean" in line)
    assert "| 1.000 | 1.000 | 1.0 |" in ok and "2.00x" in ok  # floor 4 GB / 4 TB/s = 1 ms
    cells = [c.strip() for c in wrong.strip("|").split("|")]
    assert cells[1] == "wrong_answer" and cells[2] == "" and all(not c.endswith("x") for c in cells[4:])
    assert "**2.00x** (1)" in mean and "2.83x" not in mean
