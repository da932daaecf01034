"""`frink-mlx generate` and `frink-mlx chat` (through a pseudo-terminal), in process and
talking to a running daemon: slash commands stay in the CLI, a dead --url is an error,
generate uses a running daemon. Interrupts and faults: test_chat_faults.py."""

from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest
from cli_support import ROOT, AccessLines, Pty, alnum, cli, env, free_port
from daemon_support import generation_factory, start_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory):
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("cli")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    return write_registry(root, a, b)


def greedy_reply(url: str, model: str, messages: list[dict]) -> str:
    r = httpx.post(url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": messages, "max_tokens": 12, "temperature": 0})
    return r.json()["choices"][0]["message"]["content"]


def test_generate_streams_text_and_reports_speed(registry_file):
    proc = subprocess.run(cli("generate", "--models", str(registry_file), "--model", "tiny-a",
                              "--prompt", "Hello there", "--max-tokens", "8"),
                          capture_output=True, text=True, cwd=ROOT, timeout=300, check=False,
                          env=env(FRINK_MLX_PORT=str(free_port())))  # no daemon there
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


@pytest.fixture
def daemon(registry_file):
    """An in-thread daemon on a free port, with its access log captured."""
    handler = AccessLines().attach()
    settings = Settings.load(models_path=str(registry_file), access_log=True)
    live = start_server(create_app(settings, registry=load_registry(settings),
                                   factory=generation_factory()))
    try:
        yield live, handler
    finally:
        live.stop()
        handler.detach()


def test_slash_commands_never_reach_the_model(daemon, tmp_path):
    live, access = daemon
    term = Pty(cli("chat", "--url", live.url, "--model", "tiny-a", "--max-tokens", "8"))
    term.expect_prompt_after("Type /help")
    for line, marker in [("/help", "/save FILE"), ("h", "/reset, r"), ("/bogus", "[unknown command"),
                         ("/system Answer briefly.", "[system prompt set"),
                         ("/stats", "[speed after each answer: on]"), ("r", "[history cleared]"),
                         ("/model", "[model: tiny-a"), ("/retry", "[nothing to retry]")]:
        assert marker in term.turn(line), line
    assert access.posts("/v1/chat/completions") == []
    out = term.turn("//etc is a directory")        # the escape: sent as "/etc is a directory"
    assert "[prompt: " in out and "tok/s" in out   # /stats: speed after the answer
    saved = tmp_path / "chat.json"
    assert "[saved 1 exchange " in term.turn(f"/save {saved}")
    term.send("q")
    assert term.close() == 0, term.out
    messages = json.loads(saved.read_text())["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant"]
    assert messages[0]["content"] == "Answer briefly."
    assert messages[1]["content"] == "/etc is a directory"
    assert len(access.posts("/v1/chat/completions", at_least=1)) == 1   # only the one real line
    assert "Traceback" not in term.out


@pytest.mark.parametrize("command", ["chat", "generate"])
def test_url_to_a_dead_port_is_one_error_line_exit_2(command, registry_file):
    url = f"http://127.0.0.1:{free_port()}"
    argv = cli(command, "--url", url, "--models", str(registry_file))
    if command == "generate":
        argv += ["--prompt", "Hello"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env(), cwd=ROOT, timeout=120,
                          check=False,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"frink-mlx: error: no frink-mlx daemon at {url}")
    assert "connection refused" in lines[0] and "--local" in lines[0]
    assert "loading" not in proc.stdout + proc.stderr


def _run_generate_noting_mlx(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    """`frink-mlx generate ...`, then say on stderr whether MLX was ever imported."""
    code = ("import sys; from frink_mlx.cli.main import main; rc = main(sys.argv[1:]); "
            "loaded = any(m == 'mlx' or m.startswith('mlx.') for m in sys.modules); "
            "print('MLX-IMPORTED', loaded, file=sys.stderr); sys.exit(rc)")
    return subprocess.run([sys.executable, "-c", code, "generate", *args], capture_output=True,
                          text=True, env=env(**extra_env), cwd=ROOT, timeout=300, check=False)


def test_generate_talks_to_a_running_daemon(daemon):
    live, access = daemon
    before = len(access.posts("/v1/chat/completions"))
    expected = greedy_reply(live.url, "tiny-b", [{"role": "user", "content": "Hello there"}])
    before += 1     # greedy_reply's own line, which may be written a moment after its answer
    port = live.url.rsplit(":", 1)[1]
    for how in (["--url", live.url], []):   # named, then found at the configured port
        access.posts("/v1/chat/completions", at_least=before)
        proc = _run_generate_noting_mlx(*how, "--model", "tiny-b", "--prompt", "Hello there",
                                        "--max-tokens", "12", FRINK_MLX_PORT=port)
        assert proc.returncode == 0, proc.stderr
        assert alnum(expected) and alnum(expected) in alnum(proc.stdout)
        assert f"[using the daemon at {live.url}]" in proc.stderr
        assert "MLX-IMPORTED False" in proc.stderr      # no model was loaded in process
        assert "Prompt: " in proc.stderr and "Generation: 12 tokens" in proc.stderr
        served = access.posts("/v1/chat/completions", at_least=before + 1)[before:]
        assert len(served) == 1 and served[0]["model"] == "tiny-b" and served[0]["status"] == 200
        before += 1


def test_generate_local_loads_in_process_even_with_a_daemon_up(daemon, registry_file):
    live, access = daemon
    proc = _run_generate_noting_mlx("--local", "--models", str(registry_file),
                                    "--model", "tiny-a", "--prompt", "Hello", "--max-tokens", "4",
                                    FRINK_MLX_PORT=live.url.rsplit(":", 1)[1])
    assert proc.returncode == 0, proc.stderr
    assert "MLX-IMPORTED True" in proc.stderr and "(--local)" in proc.stderr
    assert access.posts("/v1/chat/completions") == []
