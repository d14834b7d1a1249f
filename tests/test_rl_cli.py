"""`stitchcuda train` end to end on the CPU with a tiny model folder: dataset -> run -> eval -> export."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="needs transformers (pip install 'stitchcuda[train]')")
pytest.importorskip("peft", reason="needs peft (pip install 'stitchcuda[train]')")
pytest.importorskip("gguf", reason="needs gguf (pip install 'stitchcuda[train]')")

from stitchcuda.cli import main  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def _json(capsys, argv) -> dict:
    capsys.readouterr()
    assert main(["--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_train_dataset_run_eval_export(tmp_path, capsys):
    from stitchcuda.rl.model import tiny_policy

    tiny = tiny_policy(seed=0)
    tiny.model.save_pretrained(tmp_path / "tiny")
    tiny.tokenizer.save_pretrained(tmp_path / "tiny")
    data, run = str(tmp_path / "data"), str(tmp_path / "run")
    d = _json(capsys, ["train", "dataset", str(REPO / "models" / "mlp.py"), str(REPO / "models" / "gemm_row_sum.py"),
                       "--eval", "gemm_row_sum", "--out", data])
    assert d["counts"]["eval"]["plan"] == 1 and d["counts"]["train"]["plan"] == 1
    common = ["--data", data, "--model", str(tmp_path / "tiny"), "--out", run, "--max-new-tokens", "8",
              "--judge-device", "cpu", "--workers", "1", "--kinds", "plan"]
    r = _json(capsys, ["train", "run", *common, "--steps", "2", "--group", "3"])
    assert r["step"] == 2 and r["done"] and "format" in r["last"]["components"]
    r = _json(capsys, ["train", "run", *common, "--steps", "3", "--group", "3", "--resume"])
    assert r["step"] == 3
    assert len((Path(run) / "curve.jsonl").read_text().splitlines()) == 3
    e = _json(capsys, ["train", "eval", *common])
    assert e["eval"]["plan"]["n"] == 1 and Path(e["file"]).name == "eval-step-00003.json"
    x = _json(capsys, ["train", "export", "--model", str(tmp_path / "tiny"), "--out", run, "--gguf",
                       str(tmp_path / "t.gguf")] + (["--check"] if importlib.util.find_spec("llama_cpp") else []))
    assert x["architecture"] == "gemma3" and x["checkpoint"] == "step-00003" and (tmp_path / "t.gguf").is_file()
    capsys.readouterr()
    assert main(["train", "run", "--out", run]) == 2          # no --data: one line, bad input
