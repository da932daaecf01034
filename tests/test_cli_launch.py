"""`frink-mlx launch`: each agent's config points at the daemon, merges, refuses a broken file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import tomllib

from frink_mlx.cli.main import main

MODELS = """default = "big"

[models.big]
source = "./nowhere"
context_length = 8192
max_tokens = 1024

[models.small]
source = "./nowhere"
"""


@pytest.fixture
def homes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("CODEX_HOME", str(tmp_path / "codex"))
    for name in ("FRINK_MLX_API_KEY", "FRINK_MLX_HOST", "FRINK_MLX_PORT"):
        monkeypatch.delenv(name, raising=False)
    models = tmp_path / "models.toml"
    models.write_text(MODELS)
    monkeypatch.setenv("FRINK_MLX_MODELS", str(models))
    monkeypatch.setenv("FRINK_MLX_CONFIG_DIR", str(tmp_path / "cfg"))
    return tmp_path


def _print(agent: str, capsys: pytest.CaptureFixture[str], *extra: str) -> str:
    assert main(["launch", agent, "--print", "--port", "9123", *extra]) == 0
    return capsys.readouterr().out


def test_codex_print(homes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tomllib.loads(_print("codex", capsys))
    assert config["model"] == "big" and config["model_provider"] == "frink"
    provider = config["model_providers"]["frink"]
    assert provider["base_url"] == "http://127.0.0.1:9123/v1"
    assert provider["wire_api"] == "responses" and "env_key" not in provider
    assert config["model_context_window"] == 8192
    assert "model_max_output_tokens" not in config      # Codex 0.169 ignores it (warns)
    assert config["analytics"] == {"enabled": False}
    assert config["check_for_update_on_startup"] is False
    assert not (homes / "codex").exists()        # --print writes nothing


def test_codex_with_a_key_names_its_variable(homes: Path, capsys: pytest.CaptureFixture[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRINK_MLX_API_KEY", "sekrit")
    config = tomllib.loads(_print("codex", capsys))
    assert config["model_providers"]["frink"]["env_key"] == "FRINK_MLX_API_KEY"


def test_claude_print(homes: Path, capsys: pytest.CaptureFixture[str],
                      monkeypatch: pytest.MonkeyPatch) -> None:
    env = json.loads(_print("claude", capsys, "--model", "small"))["env"]
    assert env["ANTHROPIC_BASE_URL"] == "http://127.0.0.1:9123"
    assert env["ANTHROPIC_MODEL"] == env["ANTHROPIC_SMALL_FAST_MODEL"] == "small"
    assert env["ANTHROPIC_AUTH_TOKEN"] and "CLAUDE_CODE_MAX_OUTPUT_TOKENS" not in env
    assert "CLAUDE_CODE_MAX_CONTEXT_TOKENS" not in env      # no window known for `small`
    for flag in ("DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "DISABLE_ERROR_REPORTING",
                 "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"):
        assert env[flag] == "1"
    monkeypatch.setenv("FRINK_MLX_API_KEY", "sekrit")
    env = json.loads(_print("claude", capsys))["env"]
    assert env["ANTHROPIC_AUTH_TOKEN"] == "sekrit" and env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] == "1024"
    assert env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] == "8192"


def test_opencode_print(homes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = json.loads(_print("opencode", capsys))
    provider = config["provider"]["frink"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"]["baseURL"] == "http://127.0.0.1:9123/v1"
    assert provider["models"]["big"]["limit"] == {"context": 8192, "output": 1024}
    assert config["model"] == "frink/big"
    assert config["autoupdate"] is False and config["share"] == "disabled"


def test_codex_write_merges_and_keeps_a_backup(homes: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = homes / "codex" / "config.toml"
    path.parent.mkdir()
    old = ('approval_policy = "on-failure"\nmodel = "gpt-5"\n\n[model_providers.openai]\n'
           'name = "OpenAI"\n\n[mcp_servers.docs]\nurl = "https://example.com/mcp"\n')
    path.write_text(old)
    assert main(["launch", "codex"]) == 0
    assert str(path) in capsys.readouterr().out
    config = tomllib.loads(path.read_text())
    assert config["approval_policy"] == "on-failure" and config["model"] == "big"
    assert config["model_providers"]["openai"] == {"name": "OpenAI"}
    assert config["model_providers"]["frink"]["base_url"] == "http://127.0.0.1:8177/v1"
    assert config["mcp_servers"]["docs"]["url"] == "https://example.com/mcp"
    assert (path.parent / "config.toml.bak").read_text() == old


@pytest.mark.parametrize("agent,rel", [("claude", "home/.claude/settings.json"),
                                       ("opencode", "xdg/opencode/opencode.json")])
def test_json_write_merges(homes: Path, agent: str, rel: str) -> None:
    path = homes / rel
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"theme": "dark", "env": {"KEEP": "me"}, "provider": {"x": {}}}))
    assert main(["launch", agent]) == 0
    config = json.loads(path.read_text())
    assert config["theme"] == "dark" and config["env"].get("KEEP") == "me"
    assert "x" in config["provider"]
    assert path.with_name(path.name + ".bak").is_file()


def test_a_fresh_home_gets_a_new_file(homes: Path) -> None:
    assert main(["launch", "opencode"]) == 0
    assert json.loads((homes / "xdg" / "opencode" / "opencode.json").read_text())["provider"]


@pytest.mark.parametrize("agent,rel,text", [
    ("codex", "codex/config.toml", "model = \n[broken"),
    ("claude", "home/.claude/settings.json", "{not json"),
])
def test_an_invalid_file_is_refused_untouched(homes: Path, agent: str, rel: str, text: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = homes / rel
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert main(["launch", agent]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err
    assert path.read_text() == text and not path.with_name(path.name + ".bak").exists()


def test_unknown_agent(homes: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["launch", "vim"])
    assert exc.value.code == 2


def test_a_running_daemon_lends_the_window_it_serves(homes: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """launch rule 1: an entry with no `context_length` gets the served ceiling, and an
    entry's own smaller cap wins over it."""
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    listed = {"object": "list", "data": [{"id": "small", "context_length": 8192},
                                         {"id": "big", "context_length": 32768}]}

    class Models(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = json.dumps(listed).encode()
            self.send_response(200 if self.path == "/v1/models" else 404)
            self.send_header("content-type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Models)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = str(server.server_address[1])
        small = tomllib.loads(_print("codex", capsys, "--model", "small", "--port", port))
        big = json.loads(_print("opencode", capsys, "--port", port))
    finally:
        server.shutdown()
    assert small["model_context_window"] == 8192
    assert big["provider"]["frink"]["models"]["big"]["limit"] == {"context": 8192, "output": 1024}
