"""`frink-mlx chat` when things go wrong, through a pseudo-terminal and real sockets:
Ctrl-C mid-answer (daemon and in process), the daemon killed mid-session and started
again, a daemon that accepts connections but does not answer yet."""

from __future__ import annotations

import json
import socket
import subprocess
import time

import httpx
import pytest
from cli_support import ROOT, AccessLines, Pty, cli, env, free_port, make_long_talker
from daemon_support import generation_factory, start_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

LONG = "3000"      # the talker's answers run to max_tokens: seconds of streaming


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory):
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("chat_faults")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    talker = make_long_talker(root / "talker")
    return write_registry(root, a, b, extra=f'\n[models.talker]\nsource = "{talker}"\n')


def _running(url: str) -> int | None:
    return httpx.get(url + "/health", timeout=10).json().get("running")


def _saved(term: Pty, path) -> list[dict]:
    assert "[saved " in term.turn(f"/save {path}")
    return json.loads(path.read_text())["messages"]


@pytest.mark.parametrize("where", ["daemon", "local"])
def test_ctrl_c_stops_the_answer_and_keeps_the_history(where, registry_file, tmp_path):
    live, access = None, AccessLines().attach()
    if where == "daemon":
        settings = Settings.load(models_path=str(registry_file), access_log=True)
        live = start_server(create_app(settings, registry=load_registry(settings),
                                       factory=generation_factory()))
        how = ["--url", live.url]
    else:
        how = ["--local", "--models", str(registry_file)]
    try:
        term = Pty(cli("chat", *how, "--model", "talker", "--max-tokens", LONG))
        term.expect_prompt_after("Type /help")
        term.out = ""
        term.send("Hello there")
        term.expect("Hello there\r\n")
        term.expect_chars(len(term.out) + 40)            # the answer is streaming
        term.ctrl_c()
        out = term.expect_prompt_after("[stopped; the partial answer is kept]")
        assert "Traceback" not in out
        if live is not None:   # the daemon stopped decoding it, long before 3000 tokens
            deadline = time.monotonic() + 10
            while _running(live.url) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert _running(live.url) == 0
            [served] = access.posts("/v1/chat/completions", at_least=1)
            assert 0 < served["completion_tokens"] < int(LONG)
        partial = _saved(term, tmp_path / "one.json")
        assert [m["role"] for m in partial] == ["user", "assistant"]
        assert partial[0]["content"] == "Hello there" and partial[1]["content"]
        # the session goes on, history included: a model that ends its answers
        assert "[now talking to tiny-a" in term.turn("/model tiny-a")
        term.turn("And then?")
        messages = _saved(term, tmp_path / "two.json")
        assert messages[:2] == partial
        assert [m["content"] for m in messages if m["role"] == "user"] == ["Hello there",
                                                                            "And then?"]
        # Ctrl-C at the prompt warns, a second one ends the session cleanly
        term.ctrl_c()
        term.expect("[Ctrl-C again (or Ctrl-D) to quit]\r\n>> ")
        term.ctrl_c()
        assert term.close() == 0, term.out
        assert "Traceback" not in term.out
    finally:
        access.detach()
        if live is not None:
            live.stop()


def _start_daemon(registry_file, port: int, log) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen(cli("serve", "--port", str(port), "--models", str(registry_file)),
                            stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT, env=env())
    line = proc.stdout.readline()
    assert line, f"the daemon did not start (exit {proc.poll()})"
    return proc, json.loads(line)["url"]


def _between(out: str, sent: str) -> list[str]:
    """The lines the REPL printed after echoing `sent`, up to the next prompt."""
    tail = out.split(sent, 1)[1].rsplit("\n>> ", 1)[0]
    return [line for line in tail.replace("\r", "").split("\n") if line.strip()]


def test_daemon_killed_mid_session_is_one_line_and_the_repl_goes_on(registry_file, tmp_path):
    port = free_port()
    with open(tmp_path / "daemon.log", "w") as log:
        daemon, url = _start_daemon(registry_file, port, log)
        term = Pty(cli("chat", "--url", url, "--model", "tiny-a", "--max-tokens", LONG))
        try:
            term.expect_prompt_after("Type /help")
            term.turn("Hello there")                 # tiny-a ends its answer by itself
            assert "[now talking to talker" in term.turn("/model talker")
            term.out = ""
            term.send("Tell me more")
            term.expect("Tell me more\r\n")
            term.expect_chars(len(term.out) + 40)        # the answer is streaming
            daemon.kill()                            # mid-answer
            daemon.wait(30)
            out = term.expect_prompt_after("once it is back]")
            lines = _between(out, "Tell me more")
            assert "went away mid-answer" in lines[-1] and "conversation kept (1 exchange)" in lines[-1]
            out = term.turn("Are you there?")        # nothing listens now
            refused = (f"[no daemon answers at {url} (connection refused); conversation kept "
                       "(1 exchange); /retry once it is back]")
            assert _between(out, "Are you there?") == [refused]
            daemon, _ = _start_daemon(registry_file, port, log)   # back on the same port
            assert "[now talking to tiny-a" in term.turn("/model tiny-a")
            term.turn("/retry")
            messages = _saved(term, tmp_path / "chat.json")
            assert [m["content"] for m in messages if m["role"] == "user"] == ["Hello there",
                                                                                "Are you there?"]
            term.send("/quit")
            assert term.close() == 0, term.out
            assert "Traceback" not in term.out
        finally:
            daemon.kill()
            daemon.wait(30)
            if term.proc.poll() is None:
                term.proc.kill()


def test_chat_waits_for_a_daemon_that_does_not_answer_yet(registry_file):
    """Connections accepted, /health unanswered (a daemon still starting): wait, never
    load a second copy of the model."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        term = Pty(cli("chat", "--models", str(registry_file)), FRINK_MLX_PORT=str(port))
        out = term.expect("is not ready yet (no answer to /health within 2 s); waiting")
        assert f"[the daemon at http://127.0.0.1:{port}" in out
        term.ctrl_c()
        assert term.close() == 130
        assert "loading the model in process" not in term.out
        assert "Traceback" not in term.out
