"""A hand-written task body stored as a cached LLM response: inserted, replayed with no model,
extracted, and compiled by nvcc against the installed runtime headers (the flow the GPU
acceptance run uses to put a known kernel through the loop's LLM proposer)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from stitchcuda.llm import LLM, CodeBlock, ModelIdentity, ResponseCache, code_prompt, extract_code
from stitchcuda.paths import INCLUDE_DIR

FIXTURE = Path(__file__).parent / "fixtures" / "llm" / "task_gelu_response.md"
FN = "task_gelu"
CONTRACT = """\
st_status task_gelu(const float* x, float* out, void* stream)
  x    float32 [64, 256] strides [256, 1]  input, read only
  out  float32 [64, 256] strides [256, 1]  output, written whole, does not alias x"""
SUBGRAPH = "%gelu = aten.gelu.default(%x)   # [64, 256] float32"

# What the prompt promises: the runtime headers are included before the task's code.
PRELUDE = "\n".join(f'#include "{h}"' for h in ("stitchrt/stitchrt.h", "stitchrt/program.h", "stitch/common.cuh",
                                                "stitch/epilogue.cuh", "stitch/elementwise.cuh",
                                                "stitch/reduce.cuh", "stitch/attention.cuh"))


def test_inserted_kernel_replays_extracts_and_compiles(tmp_path, nvcc):
    prompt = code_prompt(FN, CONTRACT, SUBGRAPH)
    hand = ModelIdentity.scripted("hand-written")
    ResponseCache(tmp_path).insert(hand, prompt, FIXTURE.read_text())

    reply = LLM.replay(tmp_path).complete(prompt)          # no model file, no llama-cpp-python
    assert reply.cached and reply.source == "inserted"
    block = extract_code(reply.text, FN)
    assert isinstance(block, CodeBlock), block
    assert "one thread per" not in block.code              # the prose stays out

    src = tmp_path / "task.cu"
    src.write_text(f"{PRELUDE}\n\n{block.code}")
    out = subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", "-c", str(src), "-o", str(tmp_path / "task.o"),
                          f"-I{INCLUDE_DIR}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "task.o").stat().st_size > 0
