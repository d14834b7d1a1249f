"""Back into the loop: merge the LoRA adapter and write a GGUF that llama.cpp loads as ``--llm``.

::

    path = export_gguf(policy, "trained.gguf")          # policy: LoRA applied, trained
    stitchcuda optimize models/mlp.py --llm trained.gguf

The merged weights are written with ``gguf.GGUFWriter``: 2-D tensors in F16 (or F32), norms and
other 1-D tensors in F32, each named by gguf's own tensor-name map for the architecture
(``gguf.get_tensor_name_map``), and transformed back as llama.cpp's converter writes them
(Gemma's RMS-norm weights are stored as 1 + w; transformers' GGUF loader took the 1 off). When
the policy came from a GGUF file, every metadata key of that file is copied (tokenizer, chat
template, hyper-parameters), except the file type, which becomes F16 or F32, and the tensor set
must match the source's name for name; a model from a folder (or the tiny test model) gets the
architecture's hyper-parameters from its config and its tokenizer's vocabulary.

Only the Gemma 3 text architecture (the test model's) is mapped today; another architecture is
a :class:`ExportError` naming it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..llm import import_llama_cpp

#: transformers model_type -> (gguf architecture, HF tensor-name suffixes that get + 1)
ARCHS = {"gemma3_text": ("gemma3", ("norm.weight",)), "gemma3": ("gemma3", ("norm.weight",))}


class ExportError(ValueError):
    """The model cannot be written as a GGUF here; the message says why."""


def merged_model(policy: Any) -> Any:
    """The policy's model with its LoRA adapters merged into the weights (a plain transformers model)."""
    m = policy.model
    if hasattr(m, "merge_and_unload"):
        return m.merge_and_unload()
    return m


def export_gguf(policy: Any, out: str | os.PathLike, *, dtype: str = "f16", source_gguf: str | os.PathLike | None = None,
                merge: bool = True) -> Path:
    """Write ``policy`` (merged when ``merge``) as a GGUF at ``out``; see the module docstring.
    ``source_gguf`` (default: the file the policy was loaded from) gives the metadata to copy."""
    import numpy as np
    import gguf

    model = merged_model(policy) if merge else policy.model
    cfg = model.config
    arch_info = ARCHS.get(cfg.model_type)
    if arch_info is None:
        raise ExportError(f"exporting a {cfg.model_type} model to GGUF is not mapped (only {', '.join(ARCHS)})")
    arch, plus_one = arch_info
    src = Path(source_gguf) if source_gguf is not None else policy.gguf
    reader = gguf.GGUFReader(str(src)) if src is not None else None
    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH_NAMES_REVERSE[arch] if hasattr(gguf, "MODEL_ARCH_NAMES_REVERSE")
                                    else _arch_enum(gguf, arch), cfg.num_hidden_layers)
    tensors: dict[str, Any] = {}
    tied = getattr(cfg, "tie_word_embeddings", False)
    for name, t in model.state_dict().items():
        if tied and name.startswith("lm_head."):
            continue
        gname = tmap.get_name(name, try_suffixes=(".weight", ".bias"))
        if gname is None:
            raise ExportError(f"no GGUF name for tensor {name} of a {cfg.model_type} model")
        x = t.detach().to("cpu").float()
        if name.endswith(plus_one):
            x = x + 1.0
        a = x.numpy()
        if a.ndim >= 2 and dtype == "f16":
            a = a.astype(np.float16)
        tensors[gname] = np.ascontiguousarray(a)
    if reader is not None:
        want = {t.name for t in reader.tensors}
        if set(tensors) != want:
            raise ExportError(f"the merged model's tensors do not match {src.name}'s: missing "
                              f"{sorted(want - set(tensors))[:5]}, extra {sorted(set(tensors) - want)[:5]}")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".part")
    w = gguf.GGUFWriter(str(tmp), arch)
    if reader is not None:
        _copy_metadata(reader, w, gguf)
    else:
        _metadata_from_config(w, cfg, policy.tokenizer, arch)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    for name in sorted(tensors, key=_tensor_order):
        w.add_tensor(name, tensors[name])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(tmp, out)
    return out


def _arch_enum(gguf: Any, arch: str) -> Any:
    for k, v in gguf.MODEL_ARCH_NAMES.items():
        if v == arch:
            return k
    raise ExportError(f"gguf does not know the architecture {arch}")


def _tensor_order(name: str) -> tuple:
    parts = name.split(".")
    if parts[0] == "blk":
        return (1, int(parts[1]), name)
    return (0 if name.startswith("token_embd") else 2, 0, name)


def _copy_metadata(reader: Any, w: Any, gguf: Any) -> None:
    skip = ("GGUF.", "general.architecture", "general.file_type")
    for key, f in reader.fields.items():
        if key.startswith(skip):
            continue
        vtype = f.types[0]
        if vtype == gguf.GGUFValueType.ARRAY:
            w.add_key_value(key, list(f.contents()), vtype, sub_type=f.types[-1])
        else:
            w.add_key_value(key, f.contents(), vtype)


def _metadata_from_config(w: Any, cfg: Any, tok: Any, arch: str) -> None:
    """Hyper-parameters from a Gemma 3 config, and a byte-level BPE vocabulary of the tokenizer's
    tokens (llama.cpp's ``gpt2`` tokenizer model; one token per character, no merges)."""
    import gguf

    w.add_name("stitchcuda-trained")
    w.add_context_length(int(cfg.max_position_embeddings))
    w.add_embedding_length(int(cfg.hidden_size))
    w.add_block_count(int(cfg.num_hidden_layers))
    w.add_feed_forward_length(int(cfg.intermediate_size))
    w.add_head_count(int(cfg.num_attention_heads))
    w.add_head_count_kv(int(cfg.num_key_value_heads))
    w.add_key_length(int(cfg.head_dim))
    w.add_value_length(int(cfg.head_dim))
    w.add_layer_norm_rms_eps(float(cfg.rms_norm_eps))
    rope = getattr(cfg, "rope_parameters", None) or {}
    theta = (rope.get("full_attention") or rope).get("rope_theta", getattr(cfg, "rope_theta", 1e6)) \
        if isinstance(rope, dict) else getattr(cfg, "rope_theta", 1e6)
    w.add_rope_freq_base(float(theta))
    w.add_sliding_window(int(cfg.sliding_window))
    vocab = tok.get_vocab()
    by_id = sorted(vocab.items(), key=lambda kv: kv[1])
    if [i for _, i in by_id] != list(range(len(by_id))):
        raise ExportError("the tokenizer's ids are not 0..n-1")
    specials = set(tok.all_special_tokens)
    byte_map = _bytes_to_unicode()
    tokens, types = [], []
    for t, _ in by_id:
        if t in specials:
            tokens.append(t)
            types.append(gguf.TokenType.CONTROL)
        else:
            tokens.append("".join(byte_map[b] for b in t.encode("utf-8")))
            types.append(gguf.TokenType.NORMAL)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    # llama.cpp requires the key; one merge whose result is no token changes no tokenisation
    w.add_token_merges(["~ ~"])
    for key, tid in (("bos", tok.bos_token_id), ("eos", tok.eos_token_id), ("pad", tok.pad_token_id),
                     ("unk", tok.unk_token_id)):
        if tid is not None:
            getattr(w, f"add_{key}_token_id")(int(tid))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what byte-level BPE vocabularies store)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def read_gguf(path: str | os.PathLike) -> dict:
    """What a GGUF holds, read back with gguf's reader: architecture, file type, tensor names,
    shapes and types, and metadata keys (for tests and the export's own check)."""
    import gguf

    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"].contents()
    return {"architecture": arch, "file_type": int(r.fields["general.file_type"].contents()),
            "tensors": {t.name: (tuple(int(d) for d in t.shape), t.tensor_type.name) for t in r.tensors},
            "keys": sorted(r.fields), "reader": r}


def load_in_llama_cpp(path: str | os.PathLike, prompt: str = "Hello", max_tokens: int = 8, n_ctx: int = 256) -> str:
    """Load ``path`` in llama.cpp (llama-cpp-python) and complete ``prompt`` greedily: the model
    the loop's ``--llm`` would run."""
    llama_cpp = import_llama_cpp()
    m = llama_cpp.Llama(model_path=str(path), n_ctx=n_ctx, n_threads=2, verbose=False, seed=0)
    try:
        out = m.create_completion(prompt, max_tokens=max_tokens, temperature=0.0)
        return out["choices"][0]["text"]
    finally:
        close = getattr(m, "close", None)
        if close is not None:
            close()


__all__ = ["ARCHS", "ExportError", "merged_model", "export_gguf", "read_gguf", "load_in_llama_cpp"]
