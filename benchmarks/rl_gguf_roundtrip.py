"""The real model's round trip: the test GGUF (Gemma 3 270M, Q4_K_M) -> transformers (dequantised)
-> LoRA (optionally a trained adapter) merged -> a GGUF with the source's metadata -> llama.cpp, which
must write greedily what transformers writes with the same weights.

    python benchmarks/rl_gguf_roundtrip.py --work train-rt [--adapter train-gpu/run/checkpoints/step-00300/adapter]

Minutes on a CPU (the GGUF's tokenizer conversion and dequantisation; the converted model is kept in
``WORK/base`` for the next time). Prints one JSON object; exit status 1 when the texts differ.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", default="train-rt")
    ap.add_argument("--model", default="test")
    ap.add_argument("--adapter", default=None, help="a saved LoRA adapter folder (default: fresh, random B)")
    ap.add_argument("--dtype", default="f32", choices=["f16", "f32"])
    ap.add_argument("--tokens", type=int, default=16)
    args = ap.parse_args(argv)
    from pathlib import Path

    import torch

    from stitchcuda.rl.export import export_gguf, load_in_llama_cpp, merged_model, read_gguf
    from stitchcuda.rl.model import load_policy_cached, with_lora

    t0 = time.monotonic()
    work = Path(args.work)
    pol = with_lora(load_policy_cached(args.model, work / "base"), adapter=args.adapter)
    if args.adapter is None:      # stand in for training: a small random update in every adapter
        torch.manual_seed(0)
        for n, p in pol.model.named_parameters():
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=1e-3)
    merged = merged_model(pol)
    path = export_gguf(dataclasses.replace(pol, model=merged), work / "roundtrip.gguf", dtype=args.dtype, merge=False)
    info = read_gguf(path)
    prompt = "```cuda\n__global__ void add(const float* a, const float* b, float* out, int n) {\n"
    ids = pol.tokenizer(prompt, add_special_tokens=True, return_tensors="pt").input_ids
    with torch.no_grad():
        out = merged.generate(ids, attention_mask=ids.new_ones(ids.shape), do_sample=False, max_new_tokens=args.tokens)
    want = pol.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    got = load_in_llama_cpp(path, prompt, max_tokens=args.tokens, n_ctx=512)
    res = {"gguf": str(path), "bytes": path.stat().st_size, "tensors": len(info["tensors"]), "file_type": info["file_type"],
           "transformers": want, "llama_cpp": got, "same": got == want, "seconds": round(time.monotonic() - t0, 1)}
    print(json.dumps(res, indent=1))
    return 0 if res["same"] else 1


if __name__ == "__main__":
    sys.exit(main())
