"""The references the planner / coder / build tests run over: models/*.py and the KernelBench
development problems (read at run time from ../shared/kernelbench/dev.jsonl; tests skip
without it), plus small versions of the development problems for the CPU plan simulator
(their module-level sizes replaced: the real ones run to gigabytes)."""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: The models that keep state between calls in a plain tensor attribute: their programs take the
#: state as an extra input and hand it back as an extra output (tests/test_stateful.py builds and
#: verifies them); the tests over MODELS call the reference as it is, one call at a time.
STATEFUL_MODELS = [REPO / "models" / "stateful_rnn_cell.py"]
MODELS = [p for p in sorted((REPO / "models").glob("*.py")) if p not in STATEFUL_MODELS]
#: The shared data beside the checkout (or where STITCHCUDA_SHARED says: e.g. a copy carried to
#: a GPU machine).
SHARED = Path(os.environ.get("STITCHCUDA_SHARED") or REPO.parent / "shared")
DEV_SET = SHARED / "kernelbench" / "dev.jsonl"
ALL_SET = SHARED / "kernelbench" / "all.jsonl"

#: The development problems stitchcuda covers (level, id).
SUPPORTED = [(1, 1), (1, 23), (1, 26), (1, 40), (1, 97), (2, 12), (2, 41), (2, 76), (2, 86), (2, 99),
             (3, 1), (3, 3), (3, 4), (3, 43), (3, 44)]
#: ... those that keep state between calls (lifted to an explicit input and output; tests/test_stateful.py) ...
STATEFUL = [(3, 33)]
#: ... and those it refuses, with what the refusal must name.
#: (3:35, nn.LSTM, was the last; recurrent layers are in: tests/test_recurrent.py)
UNSUPPORTED: dict[tuple[int, int], str] = {}

#: Small sizes for the simulator (name = value substitutions in the problem's source).
SMALL = {
    (1, 1): dict(N="64"),
    (1, 23): dict(batch_size="16", dim="300"),
    (1, 26): dict(batch_size="16", dim="300"),
    (1, 40): dict(batch_size="2", features="4", dim1="8", dim2="8"),
    (1, 97): dict(batch_size="2", num_heads="3", sequence_length="16", embedding_dimension="48"),
    (2, 12): dict(batch_size="16", in_features="32", out_features="48"),
    (2, 41): dict(batch_size="64", in_features="32", out_features="48"),
    (2, 76): dict(batch_size="16", in_features="32", out_features="48"),
    (2, 86): dict(batch_size="16", input_size="32", output_size="48"),
    (2, 99): dict(batch_size="16", in_features="32", out_features="48"),
    (3, 1): dict(batch_size="4", input_size="32", layer_sizes="[64, 64]", output_size="16"),
    (3, 3): dict(batch_size="8", input_size="32", hidden_layer_sizes="[16] * 4", output_size="24"),
    (3, 4): dict(batch_size="8"),
    (3, 43): dict(batch_size="2", max_seqlen="64", seq_len="16", n_embd="48", n_head="4"),
    (3, 44): dict(batch_size="2", max_seqlen="64", seq_len="16", n_embd="48", n_head="4"),
}
#: Variants whose head dim (32, 64) takes the fused attention template instead.
SMALL_FUSED = {
    (1, 97): dict(batch_size="2", num_heads="3", sequence_length="16", embedding_dimension="64"),
    (3, 43): dict(batch_size="2", max_seqlen="64", seq_len="16", n_embd="128", n_head="4"),
    (3, 44): dict(batch_size="2", max_seqlen="64", seq_len="16", n_embd="128", n_head="4"),
}


@functools.lru_cache(maxsize=None)
def _rows() -> dict[tuple[int, int], dict]:
    return {(r["level"], r["problem_id"]): r for r in map(json.loads, DEV_SET.read_text().splitlines() if
                                                          DEV_SET.is_file() else [])}


def dev_row(key: tuple[int, int]) -> dict:
    if not DEV_SET.is_file():
        pytest.skip(f"KernelBench development set not found at {DEV_SET}")
    return _rows()[key]


def shrink(source: str, sizes: dict[str, str]) -> str:
    for name, value in sizes.items():
        source, n = re.subn(rf"^{name}\s*=.*$", f"{name} = {value}", source, flags=re.M)
        assert n == 1, f"{name} not assigned once in the source"
    return source


def dev_reference(key: tuple[int, int], sizes: dict[str, str] | None = None, suffix: str = ""):
    from stitchcuda import frontend

    row = dev_row(key)
    source = shrink(row["source"], sizes) if sizes else row["source"]
    return frontend.load_reference(source, name=row["name"] + suffix)


def dev_id(key: tuple[int, int]) -> str:
    return f"L{key[0]}-{key[1]}"
