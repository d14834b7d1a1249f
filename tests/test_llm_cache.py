"""The response cache and the client around it, with no model: keys, hits, misses, replay,
insertion, and the generation path against a scripted stand-in for llama-cpp-python."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest

from stitchcuda.llm import (LLM, CacheMiss, LLMError, LLMUnavailable, ModelIdentity, ModelNotFound, Prompt,
                            ResponseCache, Sampling, constraints_grammar, request_key)
from stitchcuda.llm import client as client_mod
from stitchcuda.llm.cache import FILE_NAME

MODEL = ModelIdentity("m.gguf", 1000, "ab" * 32)
PROMPT = Prompt("system text", "user text")
GRAMMAR = constraints_grammar(["a"], ["fp32"], {}, []).text


def test_key_changes_with_every_part():
    base = request_key(MODEL, PROMPT, GRAMMAR, Sampling())
    assert base == request_key(ModelIdentity("m.gguf", 1000, "ab" * 32), Prompt("system text", "user text"),
                               GRAMMAR, Sampling())
    variants = [
        request_key(dataclasses.replace(MODEL, name="n.gguf"), PROMPT, GRAMMAR, Sampling()),
        request_key(dataclasses.replace(MODEL, size=1001), PROMPT, GRAMMAR, Sampling()),
        request_key(dataclasses.replace(MODEL, head_sha256="cd" * 32), PROMPT, GRAMMAR, Sampling()),
        request_key(MODEL, Prompt("system text!", "user text"), GRAMMAR, Sampling()),
        request_key(MODEL, Prompt("system text", "user text!"), GRAMMAR, Sampling()),
        request_key(MODEL, PROMPT, None, Sampling()),
        request_key(MODEL, PROMPT, GRAMMAR + " ", Sampling()),
    ]
    changed = {"temperature": 0.5, "seed": 7, "top_k": 1, "top_p": 0.5, "min_p": 0.0, "repeat_penalty": 1.1,
               "max_tokens": 9, "chat": "off"}
    assert set(changed) == {f.name for f in dataclasses.fields(Sampling)}   # every field is tried
    for name, value in changed.items():
        variants.append(request_key(MODEL, PROMPT, GRAMMAR, dataclasses.replace(Sampling(), **{name: value})))
    assert len(set(variants)) == len(variants) and base not in variants


def test_model_identity_reads_name_size_and_first_mib(tmp_path):
    f = tmp_path / "x.gguf"
    f.write_bytes(b"A" * (1 << 20) + b"tail")
    a = ModelIdentity.of(f)
    assert (a.name, a.size) == ("x.gguf", (1 << 20) + 4)
    f.write_bytes(b"A" * (1 << 20) + b"TAIL")            # same size, same head: same identity
    assert ModelIdentity.of(f) == a
    f.write_bytes(b"B" + b"A" * ((1 << 20) - 1) + b"tail")
    assert ModelIdentity.of(f) != a
    assert ModelIdentity.from_json(json.loads(json.dumps(a.to_json()))) == a


def test_insert_then_replay_serves_it_and_a_miss_fails_clearly(tmp_path):
    cache = ResponseCache(tmp_path)
    rec = cache.insert(MODEL, PROMPT, "```cuda\nvoid f() {}\n```")
    assert rec.source == "inserted" and len(cache) == 1

    llm = LLM.replay(tmp_path)                       # the cache's only model identity
    assert llm.identity == MODEL
    c = llm.complete(PROMPT)
    assert c.text == rec.text and c.cached and c.source == "inserted" and c.key == rec.key
    with pytest.raises(CacheMiss) as e:
        llm.complete(Prompt("system text", "another"))
    assert "no cached response" in str(e.value) and e.value.key != rec.key
    with pytest.raises(CacheMiss):                   # the grammar is part of the request
        llm.complete(PROMPT, grammar=GRAMMAR)
    with pytest.raises(CacheMiss):                   # and so is max_tokens
        llm.complete(PROMPT, max_tokens=7)
    assert llm.usage()["calls"] == 1 and llm.usage()["cached"] == 1


def test_replay_with_two_models_needs_one_named(tmp_path):
    cache = ResponseCache(tmp_path)
    other = ModelIdentity.scripted("hand")
    cache.insert(MODEL, PROMPT, "one")
    cache.insert(other, PROMPT, "two")
    with pytest.raises(LLMError, match="2 models"):
        LLM.replay(tmp_path)
    assert LLM.replay(tmp_path, identity=other).complete(PROMPT).text == "two"
    with pytest.raises(LLMError, match="0 models"):
        LLM.replay(tmp_path / "empty")


def test_records_persist_last_write_wins_and_damage_is_skipped(tmp_path):
    cache = ResponseCache(tmp_path)
    cache.insert(MODEL, PROMPT, "first")
    cache.insert(MODEL, PROMPT, "second")            # same key: replaces
    cache.insert(MODEL, Prompt("s", "u"), "other", grammar=GRAMMAR, sampling=Sampling(max_tokens=5))
    path = tmp_path / FILE_NAME
    lines = path.read_text().splitlines()
    assert len(lines) == 3
    tampered = json.loads(lines[2])
    tampered["prompt"]["user"] = "edited"            # no longer matches its key
    with path.open("a") as f:
        f.write(json.dumps(tampered) + "\n")
        f.write('{"key": "cut short by a cra')          # a write cut short
    again = ResponseCache(tmp_path)
    assert len(again) == 2 and again.skipped_lines == 2
    assert again.get(request_key(MODEL, PROMPT, None, Sampling())).text == "second"
    rec = again.get(request_key(MODEL, Prompt("s", "u"), GRAMMAR, Sampling(max_tokens=5)))
    assert rec.text == "other" and rec.grammar == GRAMMAR and rec.sampling.max_tokens == 5


def test_sampling_rejects_nonsense():
    with pytest.raises(ValueError):
        Sampling(chat="maybe")
    with pytest.raises(ValueError):
        Sampling(max_tokens=0)


def test_importing_the_package_needs_no_llama_cpp():
    code = "import sys, stitchcuda.llm; assert 'llama_cpp' not in sys.modules; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_without_llama_cpp_one_clear_error(tmp_path, monkeypatch):
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(client_mod, "_llama_cpp_installed", lambda: False)
    monkeypatch.setitem(sys.modules, "llama_cpp", None)       # import fails as when absent
    with pytest.raises(LLMUnavailable, match=r"pip install 'stitchcuda\[llm\]'"):
        LLM(f)
    # Replay needs neither the package nor the file.
    ResponseCache(tmp_path).insert(MODEL, PROMPT, "x")
    assert LLM.replay(tmp_path).complete(PROMPT).text == "x"


def test_model_path_from_argument_or_environment(tmp_path, monkeypatch):
    monkeypatch.setattr(client_mod, "_llama_cpp_installed", lambda: True)
    monkeypatch.delenv("STITCHCUDA_LLM", raising=False)
    with pytest.raises(ModelNotFound, match="STITCHCUDA_LLM"):
        LLM()
    with pytest.raises(ModelNotFound, match="not found"):
        LLM(tmp_path / "missing.gguf")
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setenv("STITCHCUDA_LLM", str(f))
    assert LLM().identity == ModelIdentity.of(f)


# ---------------------------------------------------------------------------- the generation path


class _FakeLlama:
    """Stands in for llama_cpp.Llama: answers from a script, counts its calls."""

    instances: list["_FakeLlama"] = []

    def __init__(self, model_path, **kw):
        self.kw, self.calls, self.resets = kw, [], 0
        self.metadata: dict = {}
        _FakeLlama.instances.append(self)

    def reset(self):
        self.resets += 1

    def tokenize(self, data, add_bos=False, special=False):
        return list(range(len(data.split())))

    def create_completion(self, prompt, **kw):
        self.calls.append(("completion", prompt, kw))
        return {"choices": [{"text": "generated", "finish_reason": "length"}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 3}}

    def create_chat_completion(self, messages, **kw):
        self.calls.append(("chat", messages, kw))
        return {"choices": [{"message": {"content": "chatted"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 12, "completion_tokens": 4}}


@pytest.fixture
def fake_llama(monkeypatch, tmp_path):
    fake = types.SimpleNamespace(Llama=_FakeLlama,
                                 LlamaGrammar=types.SimpleNamespace(from_string=lambda text, verbose=False: ("G", text)))
    _FakeLlama.instances = []
    monkeypatch.setattr(client_mod, "_llama_cpp_installed", lambda: True)
    monkeypatch.setattr(client_mod, "import_llama_cpp", lambda: fake)
    f = tmp_path / "model.gguf"
    f.write_bytes(b"GGUF" + bytes(range(256)) * 8)
    return f


def test_a_miss_generates_records_and_the_next_call_hits(fake_llama, tmp_path):
    llm = LLM(fake_llama, cache=tmp_path / "run", n_ctx=512)
    assert not _FakeLlama.instances                 # loaded on the first miss, not before
    c = llm.complete(PROMPT, grammar=GRAMMAR, max_tokens=3)
    (inst,) = _FakeLlama.instances
    kind, text, kw = inst.calls[0]
    assert kind == "completion" and text == PROMPT.text()
    assert kw["temperature"] == 0.0 and kw["max_tokens"] == 3 and kw["seed"] == 1234
    assert kw["grammar"] == ("G", GRAMMAR) and inst.kw["n_ctx"] == 512 and inst.resets == 1
    assert (c.text, c.finish_reason, c.truncated, c.cached) == ("generated", "length", True, False)
    assert (c.prompt_tokens, c.completion_tokens) == (11, 3) and 0 < c.generated_wall_s <= c.wall_s

    again = llm.complete(PROMPT, grammar=GRAMMAR, max_tokens=3)
    assert again.cached and again.text == "generated" and len(inst.calls) == 1
    assert (again.prompt_tokens, again.completion_tokens) == (11, 3)
    assert llm.usage() == {"calls": 2, "cached": 1, "prompt_tokens": 11, "completion_tokens": 3,
                           "wall_s": pytest.approx(c.wall_s + again.wall_s)}

    # The record is on disk: a replay elsewhere, with no model, gives the same answer.
    r = LLM.replay(tmp_path / "run").complete(PROMPT, grammar=GRAMMAR, max_tokens=3)
    assert r.text == "generated" and r.cached and r.generated_wall_s == pytest.approx(c.generated_wall_s)


def test_chat_template_is_used_when_the_model_has_one(fake_llama):
    llm = LLM(fake_llama)
    llm.load().metadata["tokenizer.chat_template"] = "{{ messages }}"
    c = llm.complete(PROMPT)
    kind, messages, _ = _FakeLlama.instances[0].calls[-1]
    assert kind == "chat" and c.text == "chatted"
    assert messages == [{"role": "user", "content": "system text\n\nuser text"}]
    off = LLM(fake_llama, sampling=Sampling(chat="off"))
    off.load().metadata["tokenizer.chat_template"] = "{{ messages }}"
    assert off.complete(PROMPT).text == "generated"


def test_an_opening_primes_a_plain_model_and_begins_the_reply(fake_llama, tmp_path):
    """A prompt's opening is sent after the text to a model without a chat template and the reply
    read back begins with it (also from the cache); a chat model is asked without it; the opening
    is part of the request's key."""
    primed = Prompt("system text", "user text", "```cuda\n")
    assert request_key(MODEL, primed, None, Sampling()) != request_key(MODEL, PROMPT, None, Sampling())
    llm = LLM(fake_llama, cache=tmp_path / "run")
    c = llm.complete(primed)
    kind, text, _ = _FakeLlama.instances[0].calls[-1]
    assert kind == "completion" and text == PROMPT.text() + "```cuda\n"
    assert c.text == "```cuda\ngenerated"
    assert LLM.replay(tmp_path / "run").complete(primed).text == "```cuda\ngenerated"
    chat = LLM(fake_llama)
    chat.load().metadata["tokenizer.chat_template"] = "{{ messages }}"
    assert chat.complete(primed).text == "chatted"
    assert _FakeLlama.instances[-1].calls[-1][1] == [{"role": "user", "content": "system text\n\nuser text"}]


def test_count_tokens_uses_the_tokenizer_once_loaded(fake_llama):
    llm = LLM(fake_llama)
    assert llm.count_tokens("a b c d e f") == 4          # estimate: 11 chars / 3, rounded up
    llm.load()
    assert llm.count_tokens("a b c d e f") == 6


def test_inserted_response_for_a_model_run_is_served_without_loading(fake_llama, tmp_path):
    llm = LLM(fake_llama, cache=tmp_path)
    ResponseCache(tmp_path).insert(llm.identity, PROMPT, "hand-written")
    llm = LLM(fake_llama, cache=tmp_path)
    assert llm.complete(PROMPT).text == "hand-written" and not _FakeLlama.instances


# ---------------------------------------------------------------------------- the test model's file


def test_default_test_model_assembles_once_and_reverifies_a_changed_file(tmp_path, monkeypatch):
    from stitchcuda.llm import default_test_model
    from stitchcuda.llm import model as model_mod

    calls = []

    def assemble(output_path=None, overwrite=False):
        calls.append((Path(output_path).name, overwrite))
        p = Path(output_path)
        if not p.exists() or overwrite:
            p.write_bytes(b"GGUF fake")
        return p

    fake = types.SimpleNamespace(MODEL_NAME="tiny.gguf", EXPECTED_SHA256="0" * 64, assemble=assemble)
    monkeypatch.setenv("STITCHCUDA_CACHE", str(tmp_path))
    monkeypatch.setitem(sys.modules, model_mod._TEST_MODEL_MODULE, fake)
    default_test_model.cache_clear()
    try:
        p = default_test_model()
        assert p == tmp_path / "models" / "tiny.gguf" and p.read_bytes() == b"GGUF fake"
        assert len(calls) == 1 and calls[0][0].endswith(".tmp") and calls[0][1]
        assert not list(p.parent.glob("*.tmp"))
        default_test_model.cache_clear()
        assert default_test_model() == p and len(calls) == 1          # the note says: verified
        os.utime(p, ns=(1, 1))                                         # changed since: check again
        default_test_model.cache_clear()
        assert default_test_model() == p and calls[-1] == ("tiny.gguf", False)

        monkeypatch.setitem(sys.modules, model_mod._TEST_MODEL_MODULE, None)   # not installed
        default_test_model.cache_clear()
        assert default_test_model() is None
    finally:
        default_test_model.cache_clear()
