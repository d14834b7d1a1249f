"""The Python tables (precision policies, dtypes) agree with the runtime's C enums."""

from __future__ import annotations

import re

import pytest

from stitchcuda import dtypes, precision
from stitchcuda.paths import INCLUDE_DIR

HEADER = INCLUDE_DIR / "stitchrt" / "stitchrt.h"


def _enum(name: str) -> dict[str, int]:
    text = HEADER.read_text()
    m = re.search(r"typedef enum " + name + r" \{(.*?)\}", text, re.S)
    assert m, f"enum {name} not found in {HEADER}"
    out = {}
    for k, v in re.findall(r"(ST_\w+)\s*=\s*(\d+)", m.group(1)):
        out[k] = int(v)
    return out


def test_policy_enum_matches_the_policy_table():
    c = _enum("st_policy")
    assert c == {p.c_enum: p.c_value for p in precision.POLICIES.values()}


def test_dtype_enum_matches_the_dtype_table():
    c = _enum("st_dtype")
    assert c == {d.st_enum: d.st_value for d in dtypes.DTYPES.values() if d.abi}


def test_policy_lookup_names_the_choices():
    assert precision.get("tf32") is precision.TF32 and precision.get(precision.BF16) is precision.BF16
    with pytest.raises(ValueError, match="fp32, tf32, bf16, fp16"):
        precision.get("fp8")
    assert precision.BF16.storage_of("float32") == "bfloat16" and precision.BF16.storage_of("int64") == "int64"
    assert [p.tolerance for p in precision.POLICIES.values()] == [1e-4, 1e-2, 1e-2, 1e-2]
