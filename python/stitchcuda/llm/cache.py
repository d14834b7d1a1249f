"""Every LLM response, kept by what produced it, so a run replays exactly.

A response is keyed by the SHA-256 of (schema version, model identity, prompt, grammar text,
sampling settings) as canonical JSON. The records live as JSON lines in
``<folder>/llm_responses.jsonl`` (the folder is the caller's: the loop's run directory); a line
holds the key, everything the key was made of, the reply, its token counts and the wall time of
the call that produced it. Lines are only appended; for a key written twice the last line wins
(so a hand-written response can replace a recorded one). A line cut short by a crash is skipped
when the file is read.

:meth:`ResponseCache.insert` stores a response nobody generated (tests; a hand-written kernel
served to the loop as if a model had written it): replaying the same request then returns it.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Iterator

from .model import ModelIdentity
from .prompts import Prompt

SCHEMA = 1
FILE_NAME = "llm_responses.jsonl"


@dataclass(frozen=True)
class Sampling:
    """Sampling settings; part of the cache key. Deterministic by default: temperature 0 is
    greedy decoding (the seed then changes nothing, and is fixed anyway).

    chat: ``"auto"`` renders the prompt with the model's chat template when its GGUF has one,
    ``"on"`` always (llama-cpp-python's fallback format without one), ``"off"`` never.
    """

    temperature: float = 0.0
    seed: int = 1234
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    max_tokens: int = 1024
    chat: str = "auto"

    def __post_init__(self) -> None:
        if self.chat not in ("auto", "on", "off"):
            raise ValueError(f"chat must be 'auto', 'on' or 'off', not {self.chat!r}")
        if self.max_tokens < 1:
            raise ValueError("max_tokens must be at least 1")

    def to_json(self) -> dict:
        return asdict(self)


def request_key(model: ModelIdentity, prompt: Prompt, grammar: str | None, sampling: Sampling) -> str:
    """SHA-256 (hex) of everything that decides a response."""
    blob = json.dumps({"schema": SCHEMA, "model": model.to_json(), "prompt": prompt.to_json(),
                       "grammar": grammar, "sampling": sampling.to_json()},
                      sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Record:
    """One response and what produced it. ``source`` is ``"model"`` or ``"inserted"``."""

    key: str
    model: ModelIdentity
    prompt: Prompt
    grammar: str | None
    sampling: Sampling
    text: str
    finish_reason: str = "stop"
    prompt_tokens: int = 0
    completion_tokens: int = 0
    wall_s: float = 0.0
    source: str = "model"
    created: str = field(default_factory=lambda: _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "key": self.key, "model": self.model.to_json(), "prompt": self.prompt.to_json(),
                "grammar": self.grammar, "sampling": self.sampling.to_json(), "text": self.text,
                "finish_reason": self.finish_reason, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "wall_s": self.wall_s, "source": self.source,
                "created": self.created}

    @classmethod
    def from_json(cls, d: dict) -> "Record":
        return cls(str(d["key"]), ModelIdentity.from_json(d["model"]),
                   Prompt.from_json(d["prompt"]), d.get("grammar"),
                   Sampling(**d["sampling"]), str(d["text"]), str(d.get("finish_reason", "stop")),
                   int(d.get("prompt_tokens", 0)), int(d.get("completion_tokens", 0)),
                   float(d.get("wall_s", 0.0)), str(d.get("source", "model")), str(d.get("created", "")))


class ResponseCache:
    """The responses of one folder; reads the file once, appends as it goes."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / FILE_NAME
        self._by_key: dict[str, Record] = {}
        self.skipped_lines = 0          #: unreadable lines (a write cut short), ignored
        if self.path.is_file():
            for line in self.path.read_text(encoding="utf-8").splitlines():
                if not line.strip():
                    continue
                try:
                    rec = Record.from_json(json.loads(line))
                except (ValueError, KeyError, TypeError):
                    self.skipped_lines += 1
                    continue
                if rec.key != request_key(rec.model, rec.prompt, rec.grammar, rec.sampling):
                    self.skipped_lines += 1     # edited by hand out of step with its key
                    continue
                self._by_key[rec.key] = rec

    def __len__(self) -> int:
        return len(self._by_key)

    def __contains__(self, key: str) -> bool:
        return key in self._by_key

    def __iter__(self) -> Iterator[Record]:
        return iter(self._by_key.values())

    def get(self, key: str) -> Record | None:
        return self._by_key.get(key)

    def models(self) -> set[ModelIdentity]:
        """The model identities the folder holds responses of."""
        return {r.model for r in self._by_key.values()}

    def put(self, record: Record) -> None:
        """Append ``record`` (one write of one line) and index it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record.to_json(), ensure_ascii=False) + "\n"
        with self.path.open("a", encoding="utf-8") as f:
            f.write(line)
        self._by_key[record.key] = record

    def insert(self, model: ModelIdentity, prompt: Prompt, text: str, *, grammar: str | None = None,
               sampling: Sampling = Sampling(), finish_reason: str = "stop") -> Record:
        """Store ``text`` as the response to this request, as if ``model`` had written it."""
        rec = Record(request_key(model, prompt, grammar, sampling), model, prompt, grammar, sampling, text,
                     finish_reason, source="inserted")
        self.put(rec)
        return rec


__all__ = ["SCHEMA", "FILE_NAME", "Sampling", "request_key", "Record", "ResponseCache"]
