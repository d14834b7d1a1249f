"""Back into the loop: a tiny Gemma 3 model with trained (here: random) LoRA adapters is merged and
written as a GGUF; gguf's reader reads it back name for name, and llama.cpp loads it and writes,
greedily, the same tokens transformers does with the merged weights (so the name map and the
Gemma norm convention are right, not only the file format)."""

from __future__ import annotations

import dataclasses
import importlib.util

import pytest

pytest.importorskip("transformers", reason="needs transformers (pip install 'stitchcuda[train]')")
pytest.importorskip("peft", reason="needs peft (pip install 'stitchcuda[train]')")
pytest.importorskip("gguf", reason="needs gguf (pip install 'stitchcuda[train]')")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import torch

    from stitchcuda.rl.export import export_gguf, merged_model
    from stitchcuda.rl.model import tiny_policy, with_lora

    pol = with_lora(tiny_policy(seed=1))
    for n, p in pol.model.named_parameters():
        if "lora_B" in n:            # as if trained: the merged weights differ from the base's
            torch.nn.init.normal_(p, std=0.5)
    merged = merged_model(pol)
    path = export_gguf(dataclasses.replace(pol, model=merged), tmp_path_factory.mktemp("gguf") / "tiny.gguf",
                       dtype="f32", merge=False)
    return pol, merged, path


def test_the_gguf_reads_back_name_for_name(exported):
    from stitchcuda.rl.export import read_gguf

    pol, merged, path = exported
    info = read_gguf(path)
    assert info["architecture"] == "gemma3" and info["file_type"] == 0
    cfg = merged.config
    t = info["tensors"]
    assert t["token_embd.weight"][0] == (cfg.hidden_size, cfg.vocab_size)
    assert t["blk.1.ffn_down.weight"][0] == (cfg.intermediate_size, cfg.hidden_size)
    assert {n for n in t if n.startswith("blk.0.")} == {f"blk.0.{x}.weight" for x in (
        "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm", "attn_norm", "post_attention_norm",
        "ffn_norm", "post_ffw_norm", "ffn_gate", "ffn_up", "ffn_down")}
    assert not any("lora" in n for n in t)
    # Gemma's norms are stored as 1 + w
    r = info["reader"]
    stored = next(x for x in r.tensors if x.name == "output_norm.weight").data
    want = merged.model.norm.weight.detach().numpy() + 1.0
    assert abs(stored - want).max() < 1e-6


def test_llama_cpp_runs_it_as_transformers_does(exported):
    if importlib.util.find_spec("llama_cpp") is None:
        pytest.skip("needs llama-cpp-python (the 'test' extra)")
    from stitchcuda.rl.export import load_in_llama_cpp

    pol, merged, path = exported
    prompt = "__global__ void add("
    ids = pol.tokenizer(prompt, add_special_tokens=True, return_tensors="pt").input_ids
    out = merged.generate(ids, attention_mask=ids.new_ones(ids.shape), do_sample=False, max_new_tokens=12)
    want = pol.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    got = load_in_llama_cpp(path, prompt, max_tokens=12)
    assert got == want and len(got) > 0
    # and as the loop's --llm: its client loads the file and answers a request
    from stitchcuda.llm import LLM, Prompt

    done = LLM(path, n_ctx=512).complete(Prompt("You write CUDA.", "Add two vectors."), max_tokens=6)
    assert done.completion_tokens > 0 and not done.cached


def test_an_unmapped_architecture_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    from stitchcuda.rl.export import ExportError, export_gguf
    from stitchcuda.rl.model import PolicyModel

    m = LlamaForCausalLM(LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1))
    with pytest.raises(ExportError, match="llama"):
        export_gguf(PolicyModel(m, None, "x"), "never.gguf", merge=False)


def test_loading_a_gguf_parses_its_header_once(exported, monkeypatch):
    """transformers reads a GGUF's header for the tokenizer, the config and the weights, and the
    chat template is read from it too: inside ``load_policy`` each path is parsed once (a 262k-token
    vocabulary takes tens of seconds a parse), and ``gguf.GGUFReader`` is itself again after."""
    import gguf

    from stitchcuda.rl.model import _gguf_chat_template, _one_parse_per_gguf

    _, _, path = exported
    parsed = []

    class Counting(gguf.GGUFReader):
        def __init__(self, p, mode="r"):
            parsed.append(p)
            super().__init__(p, mode)

    monkeypatch.setattr(gguf, "GGUFReader", Counting)
    with _one_parse_per_gguf():
        first = gguf.GGUFReader(str(path))
        assert gguf.GGUFReader(path) is first             # str or Path, the same file
        assert _gguf_chat_template(path) == ""            # the tiny model has no template
    assert len(parsed) == 1 and gguf.GGUFReader is Counting
    with pytest.raises(RuntimeError):
        with _one_parse_per_gguf():
            raise RuntimeError("a failed load")
    assert gguf.GGUFReader is Counting
    assert gguf.GGUFReader(str(path)) is not first and len(parsed) == 2
