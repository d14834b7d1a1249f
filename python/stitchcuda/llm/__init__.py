"""The local LLM of the optimisation loop: llama.cpp in process, grammars, prompts, a response cache.

Planner decisions come back as JSON that a grammar keeps valid (:func:`constraints_grammar`,
:func:`parse_constraints`); task bodies come back as a fenced CUDA block (:func:`code_prompt`,
:func:`extract_code`); every response is cached by what produced it, so a run replays with no
model (:class:`LLM`, :class:`ResponseCache`). The model is a GGUF file the user names (a path or
``$STITCHCUDA_LLM``); :func:`default_test_model` is the tiny one from PyPI, for tests.

Importing this package needs no llama-cpp-python; calling a model without it raises
:class:`LLMUnavailable` with the install command (``pip install 'stitchcuda[llm]'``).

Modules: ``model`` (which file, its identity), ``grammar`` (decisions), ``apiref`` (the runtime
headers as reference), ``prompts`` (requests, code extraction), ``cache`` (responses), ``client``
(llama.cpp).
"""

from __future__ import annotations

from .apiref import ApiEntry, ApiExcerpt, api_entries, api_reference, estimate_tokens
from .cache import Record, ResponseCache, Sampling, request_key
from .client import (INSTALL_HINT, LLM, CacheMiss, Completion, ContextOverflow, LLMError, LLMUnavailable,
                     import_llama_cpp)
from .grammar import DecisionFailure, DecisionSpec, Grammar, constraints_grammar, parse_constraints
from .model import ENV_VAR, ModelIdentity, ModelNotFound, default_test_model, resolve_model_path
from .prompts import Attempt, CodeBlock, NoCode, Prompt, code_prompt, decision_prompt, extract_code

__all__ = [
    "LLM", "Completion", "Sampling", "LLMError", "LLMUnavailable", "CacheMiss", "ContextOverflow",
    "INSTALL_HINT", "import_llama_cpp",
    "ResponseCache", "Record", "request_key",
    "Grammar", "DecisionSpec", "DecisionFailure", "constraints_grammar", "parse_constraints",
    "Prompt", "Attempt", "CodeBlock", "NoCode", "code_prompt", "decision_prompt", "extract_code",
    "ApiEntry", "ApiExcerpt", "api_entries", "api_reference", "estimate_tokens",
    "ModelIdentity", "ModelNotFound", "ENV_VAR", "default_test_model", "resolve_model_path",
]
