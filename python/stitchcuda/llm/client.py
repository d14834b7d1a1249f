"""The local LLM: llama.cpp in this process, through llama-cpp-python, behind a response cache.

::

    llm = LLM("model.gguf", cache="run/dir")             # or $STITCHCUDA_LLM
    c = llm.complete(prompt, grammar=constraints_grammar(...))
    c.text, c.prompt_tokens, c.completion_tokens, c.wall_s, c.cached

    llm = LLM.replay("run/dir")                          # no model file, no llama-cpp-python
    llm = LLM("http://127.0.0.1:8080/v1", cache=...)     # a llama.cpp server on this machine (llm.server)

Every call goes through the cache first: a hit needs neither the model nor llama-cpp-python, so
the model is loaded (and the package imported) on the first miss only. In replay mode a miss
raises :class:`CacheMiss` naming the key. Each model call starts from an empty KV cache (no
prefix reuse between calls), so a response depends on its request alone.

Nothing here touches a network: llama.cpp reads the GGUF file and computes on this machine, or
a server on this machine does (:mod:`.server`: loopback addresses only).
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import MachineError
from .apiref import estimate_tokens
from .cache import Record, ResponseCache, Sampling, request_key
from .grammar import Grammar
from .model import ENV_VAR, ModelIdentity, ModelNotFound, resolve_model_path
from .prompts import Prompt

INSTALL_HINT = "pip install 'stitchcuda[llm]'  (builds llama-cpp-python from source; CMAKE_ARGS=\"-DGGML_NATIVE=OFF\" for a portable build)"


class LLMError(RuntimeError):
    """Base of the LLM layer's errors."""


class LLMUnavailable(LLMError, MachineError):
    """llama-cpp-python is not installed."""


class CacheMiss(LLMError):
    """Replay mode, and the cache holds no response for this request."""

    def __init__(self, key: str, prompt: Prompt, model: ModelIdentity):
        self.key, self.prompt, self.model = key, prompt, model
        super().__init__(f"replay: no cached response for request {key[:16]} (model {model}); "
                         f"record it with a model, or insert one with ResponseCache.insert")


class ContextOverflow(LLMError):
    """The prompt does not fit the context window."""


def _llama_cpp_installed() -> bool:
    return importlib.util.find_spec("llama_cpp") is not None


def import_llama_cpp() -> Any:
    """The ``llama_cpp`` module, or :class:`LLMUnavailable` with the install command."""
    try:
        import llama_cpp
    except ImportError as e:
        raise LLMUnavailable(f"the local LLM needs llama-cpp-python, which is not installed: {INSTALL_HINT}") from e
    return llama_cpp


def _cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return any(ln.startswith("flags") and " amx_int8" in ln for ln in f)
    except OSError:
        return False


@contextlib.contextmanager
def safe_cpu_buffers(llama_cpp: Any):
    """Load models without llama.cpp's extra CPU buffer types (weight repacking) on CPUs with AMX.

    llama.cpp's AMX path crashes the process (a segmentation fault in ``ggml_backend_amx_mul_mat``,
    llama.cpp issue 20824) on the first completion with the Q4_K test model on such CPUs (Sapphire
    Rapids and later); without the extra buffer types the same weights run on the plain CPU kernels.
    llama-cpp-python takes the setting from ``llama_model_default_params()`` only, so that is what
    is wrapped while a model loads. ``STITCHCUDA_LLM_REPACK=1`` keeps repacking."""
    if (os.environ.get("STITCHCUDA_LLM_REPACK", "") not in ("", "0") or not _cpu_has_amx()
            or not hasattr(llama_cpp, "llama_model_default_params")):
        yield
        return
    orig = llama_cpp.llama_model_default_params

    def params():
        p = orig()
        if hasattr(p, "use_extra_bufts"):
            p.use_extra_bufts = False
        return p

    llama_cpp.llama_model_default_params = params
    try:
        yield
    finally:
        llama_cpp.llama_model_default_params = orig


@dataclass(frozen=True)
class Completion:
    """One call's answer. ``wall_s`` is this call's time (cache look-up included);
    ``generated_wall_s`` the time the model took to produce the text, in this call or the one
    that recorded it (0 for an inserted response). Token counts are the model's, from when it
    generated the text."""

    text: str
    finish_reason: str          #: "stop" (the model or the grammar ended it), "length" (max tokens)
    prompt_tokens: int
    completion_tokens: int
    wall_s: float
    generated_wall_s: float
    cached: bool
    source: str                 #: "model" or "inserted"
    key: str

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class LLM:
    """A GGUF model behind a response cache.

    model: GGUF path (else ``$STITCHCUDA_LLM``), or the address of an OpenAI-compatible server on
    this machine (``http://127.0.0.1:PORT/v1``, :mod:`.server`); not needed in replay mode.
    cache: a folder (or a :class:`ResponseCache`) for the responses; None keeps none.
    replay: serve only from the cache; a miss raises :class:`CacheMiss`.
    identity: the model identity to key on; in replay mode without it, the cache's only one.
    sampling: settings of every call (deterministic by default); ``complete`` may override
    max_tokens. n_ctx, n_threads, n_batch, n_gpu_layers: llama.cpp's, at load time.
    """

    def __init__(self, model: str | Path | None = None, *, cache: str | Path | ResponseCache | None = None,
                 replay: bool = False, identity: ModelIdentity | None = None, sampling: Sampling = Sampling(),
                 n_ctx: int = 4096, n_threads: int | None = None, n_batch: int = 512, n_gpu_layers: int = 0,
                 verbose: bool = False):
        self.cache = cache if isinstance(cache, ResponseCache) or cache is None else ResponseCache(cache)
        self.replay_only = replay
        self.sampling = sampling
        self.n_ctx, self.n_threads, self.n_batch, self.n_gpu_layers = n_ctx, n_threads, n_batch, n_gpu_layers
        self.verbose = verbose
        self.calls: list[Completion] = []
        self._llama: Any = None
        self._grammars: dict[str, Any] = {}
        self.path: Path | None = None
        self.endpoint: Any = None
        from .server import Endpoint, is_url

        url = model if model is not None else os.environ.get(ENV_VAR) or None
        if replay:
            if self.cache is None:
                raise ValueError("replay needs a cache folder")
            if identity is None and model is not None and not is_url(str(model)):
                identity = ModelIdentity.of(resolve_model_path(model))
            if identity is None:
                models = self.cache.models()
                if len(models) != 1:
                    raise LLMError(f"replay: the cache holds responses of {len(models)} models; "
                                   f"name one with identity= ({', '.join(sorted(map(str, models))) or 'none'})")
                identity = next(iter(models))
        elif url is not None and is_url(str(url)):
            self.endpoint = Endpoint(str(url))
            identity = identity or self.endpoint.identity()   # fails now (ServerError) when nobody answers
        else:
            if not _llama_cpp_installed():       # fail now, not at the first miss
                import_llama_cpp()
            self.path = resolve_model_path(model)
            identity = identity or ModelIdentity.of(self.path)
        self.identity: ModelIdentity = identity

    @classmethod
    def replay(cls, cache: str | Path | ResponseCache, identity: ModelIdentity | None = None,
               sampling: Sampling = Sampling()) -> "LLM":
        """Serve a recorded run from ``cache`` alone."""
        return cls(None, cache=cache, replay=True, identity=identity, sampling=sampling)

    # ------------------------------------------------------------------------ calls

    def complete(self, prompt: Prompt, *, grammar: Grammar | str | None = None,
                 max_tokens: int | None = None) -> Completion:
        """The response to ``prompt``, from the cache or the model (then cached).

        ``grammar`` (a :class:`Grammar` or GBNF text) constrains sampling; ``max_tokens``
        overrides the client's for this call (and is part of the key).
        """
        t0 = time.perf_counter()
        gtext = grammar.text if isinstance(grammar, Grammar) else grammar
        sampling = self.sampling if max_tokens is None else replace(self.sampling, max_tokens=max_tokens)
        key = request_key(self.identity, prompt, gtext, sampling)
        rec = self.cache.get(key) if self.cache is not None else None
        if rec is None:
            if self.replay_only:
                raise CacheMiss(key, prompt, self.identity)
            rec = self._generate(key, prompt, gtext, sampling)
            if self.cache is not None:
                self.cache.put(rec)
            cached = False
        else:
            cached = True
        wall = time.perf_counter() - t0
        c = Completion(rec.text, rec.finish_reason, rec.prompt_tokens, rec.completion_tokens,
                       wall, rec.wall_s, cached, rec.source, key)
        self.calls.append(c)
        return c

    def usage(self) -> dict:
        """Totals over this client's calls: calls, cache hits, tokens, wall seconds."""
        return {
            "calls": len(self.calls),
            "cached": sum(c.cached for c in self.calls),
            "prompt_tokens": sum(c.prompt_tokens for c in self.calls if not c.cached),
            "completion_tokens": sum(c.completion_tokens for c in self.calls if not c.cached),
            "wall_s": sum(c.wall_s for c in self.calls),
        }

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text``: the model's tokenizer once the model is loaded, else an estimate."""
        if self._llama is None:
            return estimate_tokens(text)
        return len(self._llama.tokenize(text.encode("utf-8"), add_bos=False, special=False))

    def load(self) -> Any:
        """The llama.cpp model, loaded on first use (needs llama-cpp-python and the file); for a
        server, its :class:`~.server.Endpoint`, checked (it answers and honours grammars)."""
        if self.endpoint is not None:
            self.endpoint.check()
            return self.endpoint
        if self._llama is None:
            if self.path is None:
                raise ModelNotFound("replay mode has no model file to load")
            llama_cpp = import_llama_cpp()
            with safe_cpu_buffers(getattr(llama_cpp, "llama_cpp", None)):
                self._llama = llama_cpp.Llama(model_path=str(self.path), n_ctx=self.n_ctx, n_threads=self.n_threads,
                                              n_batch=self.n_batch, n_gpu_layers=self.n_gpu_layers,
                                              seed=self.sampling.seed, verbose=self.verbose)
        return self._llama

    def close(self) -> None:
        """Free the model (llama.cpp's memory); a later miss loads it again."""
        if self._llama is not None:
            close = getattr(self._llama, "close", None)
            if close is not None:
                close()
            self._llama = None
            self._grammars.clear()

    # ------------------------------------------------------------------------ the model

    def _use_chat(self, llama: Any, sampling: Sampling) -> bool:
        if sampling.chat == "auto":
            return bool(getattr(llama, "metadata", {}).get("tokenizer.chat_template"))
        return sampling.chat == "on"

    def _grammar(self, text: str) -> Any:
        g = self._grammars.get(text)
        if g is None:
            llama_cpp = import_llama_cpp()
            g = llama_cpp.LlamaGrammar.from_string(text, verbose=self.verbose)
            self._grammars[text] = g
        return g

    def _generate(self, key: str, prompt: Prompt, gtext: str | None, sampling: Sampling) -> Record:
        if self.endpoint is not None:
            return self._generate_on_server(key, prompt, gtext, sampling)
        llama = self.load()
        kw = dict(temperature=sampling.temperature, top_k=sampling.top_k, top_p=sampling.top_p,
                  min_p=sampling.min_p, repeat_penalty=sampling.repeat_penalty, max_tokens=sampling.max_tokens,
                  seed=sampling.seed, grammar=self._grammar(gtext) if gtext is not None else None)
        llama.reset()          # no KV-cache prefix shared with an earlier call
        t0 = time.perf_counter()
        try:
            if self._use_chat(llama, sampling):
                out = llama.create_chat_completion(messages=[{"role": "user", "content": prompt.user_turn()}], **kw)
                text = out["choices"][0]["message"]["content"] or ""
            else:
                out = llama.create_completion(prompt.plain(), **kw)
                text = prompt.reply(out["choices"][0]["text"])
        except ValueError as e:
            if "context window" in str(e) or "exceed" in str(e):
                raise ContextOverflow(f"{e} (n_ctx = {self.n_ctx})") from e
            raise
        wall = time.perf_counter() - t0
        usage = out.get("usage") or {}
        return Record(key, self.identity, prompt, gtext, sampling, text,
                      str(out["choices"][0].get("finish_reason") or "stop"),
                      int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), wall, "model")

    def _generate_on_server(self, key: str, prompt: Prompt, gtext: str | None, sampling: Sampling) -> Record:
        """The same request as in process, sent to the server (chat or plain as :mod:`.server` says)."""
        ep = self.endpoint
        chat = sampling.chat == "on" or (sampling.chat == "auto" and ep.uses_chat())
        t0 = time.perf_counter()
        if chat:
            out = ep.complete(messages=[{"role": "user", "content": prompt.user_turn()}], grammar=gtext,
                              sampling=sampling)
            text = (out["choices"][0].get("message") or {}).get("content") or ""
        else:
            out = ep.complete(prompt=prompt.plain(), grammar=gtext, sampling=sampling)
            text = prompt.reply(out["choices"][0].get("text") or "")
        wall = time.perf_counter() - t0
        usage = out.get("usage") or {}
        return Record(key, self.identity, prompt, gtext, sampling, text,
                      str(out["choices"][0].get("finish_reason") or "stop"),
                      int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0)), wall, "model")


__all__ = ["LLM", "Completion", "LLMError", "LLMUnavailable", "CacheMiss", "ContextOverflow",
           "INSTALL_HINT", "import_llama_cpp"]
