"""A local LLM server as the loop's model: an OpenAI-compatible endpoint on this machine.

``--llm http://127.0.0.1:8080/v1`` names a server instead of a GGUF file: llama.cpp's own
(``llama-server -m model.gguf``), llama-cpp-python's (``python -m llama_cpp.server --model
model.gguf``, the ``server`` extra), or any other that speaks ``/v1/completions``. Only a server
on this machine is accepted (``localhost``, ``127.0.0.0/8``, ``::1``): stitchcuda needs no
network, and a prompt (the reference, the runtime's API) does not leave the machine.

Planner decisions are sampled under a grammar (GBNF), as in process; the request carries it in
llama.cpp's ``grammar`` field. Whether the server honours it is not taken on trust: the first
grammar request is preceded by a probe whose grammar allows one word only, and a server that
answers anything else (or refuses the field) is refused with a one-line reason, since an
unconstrained decision may not parse. Task bodies need no grammar.

Prompts are sent as the in-process path sends them: ``chat="auto"`` uses the chat endpoint when
the server says its model has a chat template (llama.cpp's ``/props``) or does not say (the
server then applies its model's own format), and the plain completion endpoint when it says
there is none. The response cache keys on the server's model name, not its address, so a run
recorded against a server replays without one.

Standard library only (``urllib``): no client package to install.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from ..errors import ArgumentError, MachineError
from .model import ModelIdentity

GGUF_MAGIC = b"GGUF"
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")
#: The grammar of the probe: one short word no model writes by chance after the probe's prompt
#: (short, because a grammar costs a pass over the whole vocabulary per token).
PROBE_GRAMMAR = 'root ::= "QQ"'
PROBE_TEXT = "QQ"
#: What the probe found, per (API base, served model): one probe per server and process.
_GRAMMAR_SEEN: dict[tuple[str, str], bool] = {}


class ServerError(MachineError):
    """The server did not answer, or answered with an error (exit 3: start it, or free it)."""


class GrammarUnsupported(ArgumentError):
    """The server ignores or refuses grammars; decisions would not be constrained (exit 2)."""


def is_url(text: str) -> bool:
    return "://" in str(text)


def check_llm_arg(text: str) -> str:
    """``--llm``'s value, checked by its form alone: a GGUF file that exists (by its first bytes),
    or an http(s) address of a server on this machine. ArgumentError naming the problem."""
    text = os.fspath(text)
    if is_url(text):
        endpoint_base(text)
        return text
    p = Path(text).expanduser()
    if p.is_dir():
        raise ArgumentError(f"--llm {text}: is a folder; give a GGUF file or a server's address "
                            "(http://127.0.0.1:PORT/v1)")
    if not p.is_file():
        raise ArgumentError(f"--llm {text}: no such GGUF file (or give a server's address: http://127.0.0.1:PORT/v1)")
    with p.open("rb") as f:
        head = f.read(4)
    if head != GGUF_MAGIC:
        raise ArgumentError(f"--llm {text}: not a GGUF file (it does not start with 'GGUF'); "
                            "llama.cpp reads GGUF models only")
    return text


def check_llm_ready(text: str) -> str:
    """What ``--llm`` names, asked of the machine (after :func:`check_llm_arg`): llama-cpp-python for
    a file (LLMUnavailable, exit 3); for a server, that it answers (ServerError, exit 3) and
    honours grammars (GrammarUnsupported, exit 2)."""
    if is_url(text):
        Endpoint(text).check()
        return text
    from .client import _llama_cpp_installed, import_llama_cpp

    if not _llama_cpp_installed():
        import_llama_cpp()
    return text


def endpoint_base(url: str) -> str:
    """The API base (``http://127.0.0.1:8080/v1``) of ``url``; ArgumentError unless it is an http(s)
    address with a port on this machine. A URL without a path gets ``/v1``."""
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https"):
        raise ArgumentError(f"--llm {url}: a server's address starts with http:// (e.g. http://127.0.0.1:8080/v1)")
    host = u.hostname or ""
    if not host:
        raise ArgumentError(f"--llm {url}: no host; e.g. http://127.0.0.1:8080/v1")
    try:
        port = u.port
    except ValueError:
        raise ArgumentError(f"--llm {url}: the port is not a number") from None
    if not _loopback(host):
        raise ArgumentError(f"--llm {url}: {host} is not this machine; stitchcuda talks to a server on "
                            "localhost / 127.0.0.1 / ::1 only (its prompts stay on the machine)")
    if u.query or u.fragment:
        raise ArgumentError(f"--llm {url}: give the API's base address only (e.g. http://127.0.0.1:8080/v1)")
    path = u.path.rstrip("/") or "/v1"
    netloc = f"[{host}]" if ":" in host else host
    return f"{u.scheme}://{netloc}{':' + str(port) if port else ''}{path}"


def _loopback(host: str) -> bool:
    if host.lower() in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Endpoint:
    """An OpenAI-compatible server: its model, its chat template, and one completion at a time."""

    def __init__(self, url: str, timeout: float = 600.0):
        self.url = url
        self.base = endpoint_base(url)
        self.timeout = timeout
        self._model: str | None = None
        self._grammar_ok: bool | None = None
        self._chat: bool | None = None

    # ------------------------------------------------------------------ HTTP

    def _request(self, path: str, body: dict | None = None, *, timeout: float | None = None,
                 root: bool = False) -> tuple[int, Any]:
        base = self.base.rsplit("/v1", 1)[0] if root and self.base.endswith("/v1") else self.base
        data = None if body is None else json.dumps(body).encode("utf-8")
        req = urllib.request.Request(base + path, data=data, method="GET" if body is None else "POST",
                                     headers={"Content-Type": "application/json", "Accept": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as r:
                return r.status, json.loads(r.read().decode("utf-8") or "null")
        except urllib.error.HTTPError as e:
            try:
                detail = json.loads(e.read().decode("utf-8", "replace") or "null")
            except (ValueError, OSError):
                detail = None
            return e.code, detail
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise ServerError(f"--llm {self.url}: no server answers there ({reason}); start it first, e.g. "
                              f"python -m stitchcuda.ship.serve --model MODEL.gguf --n_ctx 4096 --port PORT") from None
        except ValueError:
            raise ServerError(f"--llm {self.url}: the server's answer to {path} is not JSON; "
                              "is it an OpenAI-compatible API (…/v1)?") from None

    # ------------------------------------------------------------------ what the server is

    def model(self) -> str:
        """The served model's name (``/v1/models``), the first when there are several."""
        if self._model is None:
            code, body = self._request("/models", timeout=min(self.timeout, 30.0))
            data = body.get("data") if isinstance(body, dict) else None
            if code != 200 or not data:
                raise ServerError(f"--llm {self.url}: {self.base}/models answered {code} with no model; "
                                  "is it an OpenAI-compatible API (…/v1) with a model loaded?")
            self._model = str(data[0].get("id") or "model")
        return self._model

    def identity(self) -> ModelIdentity:
        """What the response cache knows of the model: its name on the server (not the address)."""
        m = self.model()
        return ModelIdentity(Path(m).name or m, 0, hashlib.sha256(b"server:" + m.encode("utf-8")).hexdigest())

    def uses_chat(self) -> bool:
        """``chat="auto"``: the chat endpoint unless the server says its model has no chat template."""
        if self._chat is None:
            try:
                code, body = self._request("/props", timeout=min(self.timeout, 30.0), root=True)
            except ServerError:
                code, body = 0, None
            if code == 200 and isinstance(body, dict) and "chat_template" in body:
                self._chat = bool(body.get("chat_template"))
            else:
                self._chat = True
        return self._chat

    def check(self) -> None:
        """The server answers, has a model, and honours grammars (the probe)."""
        self.model()
        if not self.supports_grammar():
            raise GrammarUnsupported(
                f"--llm {self.url}: the server ignores grammars, and the loop's planner decisions need one; "
                "use llama.cpp's server (llama-server, or python -m llama_cpp.server) or a GGUF file")

    def supports_grammar(self) -> bool:
        if self._grammar_ok is None:
            self._grammar_ok = _GRAMMAR_SEEN.get((self.base, self.model()))
        if self._grammar_ok is None:
            body = {"model": self.model(), "prompt": "Write one word:", "max_tokens": 4, "temperature": 0.0,
                    "grammar": PROBE_GRAMMAR}
            code, out = self._request("/completions", body, timeout=min(self.timeout, 120.0))
            if code != 200:
                self._grammar_ok = False
            else:
                text = (out.get("choices") or [{}])[0].get("text") if isinstance(out, dict) else None
                self._grammar_ok = isinstance(text, str) and text.strip() == PROBE_TEXT
            _GRAMMAR_SEEN[(self.base, self.model())] = self._grammar_ok
        return self._grammar_ok

    # ------------------------------------------------------------------ calls

    def complete(self, *, prompt: str | None = None, messages: list[dict] | None = None, grammar: str | None = None,
                 sampling: Any) -> dict:
        """One completion (``prompt``) or chat completion (``messages``); the OpenAI-format answer.
        A grammar request on a server that does not honour grammars raises GrammarUnsupported."""
        if grammar is not None and not self.supports_grammar():
            raise GrammarUnsupported(f"--llm {self.url}: the server ignores grammars; a decision cannot be constrained")
        body: dict[str, Any] = {"model": self.model(), "temperature": sampling.temperature, "top_p": sampling.top_p,
                                "top_k": sampling.top_k, "min_p": sampling.min_p,
                                "repeat_penalty": sampling.repeat_penalty, "max_tokens": sampling.max_tokens,
                                "seed": sampling.seed, "stream": False}
        if grammar is not None:
            body["grammar"] = grammar
        if messages is not None:
            body["messages"] = messages
            path = "/chat/completions"
        else:
            body["prompt"] = prompt
            path = "/completions"
        code, out = self._request(path, body)
        if code != 200 or not isinstance(out, dict) or not out.get("choices"):
            detail = out.get("error", out) if isinstance(out, dict) else out
            text = json.dumps(detail)[:300] if detail is not None else "no body"
            if "context" in text.lower() and ("exceed" in text.lower() or "window" in text.lower()):
                from .client import ContextOverflow

                raise ContextOverflow(f"the server's context window is too small for the prompt: {text}")
            raise ServerError(f"--llm {self.url}: {path} answered {code}: {text}")
        return out


__all__ = ["Endpoint", "ServerError", "GrammarUnsupported", "check_llm_arg", "check_llm_ready", "endpoint_base",
           "is_url", "GGUF_MAGIC"]
