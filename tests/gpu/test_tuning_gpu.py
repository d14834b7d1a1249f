"""Tuning files on the GPU: a second process's first call as fast as its tenth.

A convolutional program (models/resnet_block.py at tf32: cuDNN engines and cuBLASLt algorithms
chosen by timing on a plan's first call) is verified, which writes the folder's tuning file; then
fresh processes load the program, create its instance (which prepares it: one call on zeros, its
plans made and its kernels loaded) and time their first and tenth calls (host clock around a device
synchronise). With the tuning file the preparing call takes the recorded choices instead of timing
them; without it, it times them; without preparing, the first call pays for all of it.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

REPO = Path(__file__).resolve().parents[2]

sys.path.insert(0, str(REPO / "benchmarks"))
import first_call  # noqa: E402 - benchmarks/first_call.py: its probe, one fresh process per variant


def _probe(folder: Path, prepare: bool = True) -> dict:
    r = first_call.probe(folder, {}, prepare)
    assert "error" not in r, r["error"]
    return r


def test_a_second_process_first_call_is_as_fast_as_its_tenth(tmp_path):
    from stitchcuda.pipeline import build_program
    from stitchcuda.verifier.verification import VerifyOptions, verify_program

    out = build_program(str(REPO / "models" / "resnet_block.py"), precision="tf32", out=tmp_path / "prog", quiet=True)
    assert out.ok, out
    v = verify_program(out.directory, options=VerifyOptions(trials=2, compile=False, profile=False,
                                                            reference_profile=False))
    assert v.result.ok, v.result.verdict.summary()
    tuning_file = out.directory / "tuning.txt"
    assert tuning_file.is_file(), "a passed verification writes the choices its timed calls made"
    lines = [ln for ln in tuning_file.read_text().splitlines() if ln and not ln.startswith("#")]
    assert any(ln.startswith("c ") for ln in lines), lines
    tuned = _probe(out.directory)
    unprepared = _probe(out.directory, prepare=False)
    tuning_file.rename(tmp_path / "kept.txt")
    untuned = _probe(out.directory)
    print(f"prepared in / first / tenth call: with the tuning file {tuned['prepared_ms']:.1f} / "
          f"{tuned['first_ms']:.2f} / {tuned['tenth_ms']:.2f} ms ({tuned['tuned']} choices), without it "
          f"{untuned['prepared_ms']:.1f} / {untuned['first_ms']:.2f} / {untuned['tenth_ms']:.2f} ms; "
          f"with it, not prepared: first {unprepared['first_ms']:.1f} ms")
    assert tuned["tuned"] == len(lines) and tuned["note"] == ""
    assert untuned["tuned"] == 0
    # prepared: the first call is launches only (eager: the graph is captured on the second)
    assert tuned["first_ms"] <= 2 * tuned["tenth_ms"] + 2.0, tuned
    assert unprepared["prepared_ms"] is None and unprepared["first_ms"] > 10 * tuned["first_ms"], unprepared
    # the file spares the preparing call the timing of every candidate
    assert untuned["prepared_ms"] > 1.3 * tuned["prepared_ms"], (tuned, untuned)
