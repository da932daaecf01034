"""`frink-mlx generate` and `frink-mlx chat` (through a pseudo-terminal), in process and
talking to a running daemon."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from daemon_support import generation_factory, start_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory):
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("cli")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    return write_registry(root, a, b)


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "frink_mlx.cli", *args]


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FRINK_MLX_LOG_LEVEL": "warning"}


class Pty:
    def __init__(self, argv: list[str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env(),
                                     cwd=ROOT, close_fds=True)
        os.close(slave)
        self.out = ""

    def expect(self, marker: str, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while marker not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {marker!r}; got {self.out!r}"
            ready, _, _ = select.select([self.master], [], [], left)
            if ready:
                try:
                    self.out += os.read(self.master, 4096).decode(errors="replace")
                except OSError:
                    break
        return self.out

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> int:
        code = self.proc.wait(60)
        try:
            while True:
                chunk = os.read(self.master, 4096)
                if not chunk:
                    break
                self.out += chunk.decode(errors="replace")
        except OSError:
            pass
        os.close(self.master)
        return code


def alnum(text: str) -> str:
    """Letters and digits only: a random model's bytes may render differently on a tty."""
    return "".join(ch for ch in text if ch.isascii() and ch.isalnum())


def greedy_reply(url: str, model: str, messages: list[dict]) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": messages, "max_tokens": 12, "temperature": 0})
    return r.json()["choices"][0]["message"]["content"]


def test_generate_streams_text_and_reports_speed(registry_file):
    proc = subprocess.run(cli("generate", "--models", str(registry_file), "--model", "tiny-a",
                              "--prompt", "Hello there", "--max-tokens", "8"),
                          capture_output=True, text=True, env=env(), cwd=ROOT, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip()
    assert "Prompt:" in proc.stderr and "Generation:" in proc.stderr
    assert "tokens-per-sec" in proc.stderr


def test_chat_repl_in_process(registry_file):
    term = Pty(cli("chat", "--local", "--models", str(registry_file), "--model", "tiny-a",
                   "--max-tokens", "6"))
    assert "[no daemon answered" in term.expect(">> ")
    term.out = ""
    term.send("Hello there")
    term.expect("\n>> ")
    term.send("/reset")
    term.expect("[history cleared]")
    term.send("/exit")
    code = term.close()
    assert code == 0, term.out


def test_chat_talks_to_a_running_daemon(registry_file):
    settings = Settings.load(models_path=str(registry_file), access_log=False)
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    live = start_server(app)
    try:
        first = [{"role": "user", "content": "Hello there"}]
        expected = greedy_reply(live.url, "tiny-b", first)
        term = Pty(cli("chat", "--url", live.url, "--model", "tiny-b", "--max-tokens", "12"))
        term.expect(">> ")
        assert "[talking to the daemon" in term.out
        term.out = ""
        term.send("Hello there")
        out = term.expect("\n>> ")
        assert alnum(expected) and alnum(expected) in alnum(out)
        # the second turn carries the history: the daemon sees both turns
        second = first + [{"role": "assistant", "content": expected},
                          {"role": "user", "content": "And then?"}]
        expected2 = greedy_reply(live.url, "tiny-b", second)
        term.out = ""
        term.send("And then?")
        out = term.expect("\n>> ")
        assert alnum(expected2) in alnum(out)
        term.send("/exit")
        assert term.close() == 0
    finally:
        live.stop()
