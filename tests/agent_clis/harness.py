"""The real agent CLIs against an in-process daemon: shared by tests/agent_clis and
scripts/capture_agents.py.

Why in-process: the tool-call round trip needs a model that emits a call, which a
random model will not, so one registry entry (`scripted`) answers through
tests/adapters/scripted.py's ScriptedEngine -- everything downstream of the engine is
the production path -- while `agent` runs the real engine on agent_model.py's tiny
64k-window checkpoint (real prefill, KV and prefix cache).

Rules:
1. The CLIs are the ones `make test` installs from the npm registry at the versions
   in pins.txt, into .venv/agents (AGENTS_DIR); `missing()` says why one cannot run.
2. Every run gets its own HOME, XDG dirs, CODEX_HOME and working directory; the
   inherited environment loses every ANTHROPIC_*, OPENAI_*, OLLAMA_*, CODEX_* and
   FRINK_MLX_* variable; telemetry, update checks and model-catalogue fetches are
   off; stdin is empty.
3. The agents' configs come from the launcher's own pieces (launch.target, the
   agents.py builders, agents.merge_file), as `frink-mlx launch AGENT` writes
   them; Qwen Code, which the launcher does not know, gets its env and settings here.
4. `Recorder` keeps every request the daemon received (method, path, headers,
   JSON body) and the status and headers it answered, for assertions and captures;
   the daemon's own recent-requests ring says tokens and cached tokens.
5. `tool_script` is the scripted model: a prompt whose last user text says
   `frink-read PATH` gets a call of the reading tool the agent offered (READERS) on PATH;
   once the tool's result is in the prompt, it answers ROUND_TRIP_DONE.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import struct
import subprocess
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
AGENTS_DIR = ROOT / ".venv" / "agents"
PINS = HERE / "pins.txt"
COMMANDS = {"claude": "claude", "codex": "codex", "opencode": "opencode", "qwen": "qwen"}
PACKAGES = {"claude": "@anthropic-ai/claude-code", "codex": "@openai/codex",
            "opencode": "opencode-ai", "qwen": "@qwen-code/qwen-code"}
MODEL_ROUTES = ("/v1/messages", "/v1/responses", "/v1/chat/completions", "/api/")
ROUND_TRIP_DONE = "Round trip done."
_SCRUBBED = ("ANTHROPIC_", "OPENAI_", "OLLAMA_", "CODEX_", "FRINK_MLX_", "CLAUDE_")


def pins() -> dict[str, str]:
    """pins.txt: `package@version` per line -> {package: version}."""
    out = {}
    for line in PINS.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.strip().rsplit("@", 1)
            out[name] = version
    return out


def binary(agent: str) -> Path:
    return AGENTS_DIR / "bin" / COMMANDS[agent]


def missing(agent: str) -> str | None:
    """Rule 1: why `agent` cannot run here, or None."""
    if binary(agent).exists():
        return None
    if shutil.which("npm") is None:
        return "npm is absent: the agent CLIs install from the npm registry (`make test`)"
    return f"{binary(agent)} is not installed: run `make agents` (or `make test`)"


# -- the daemon -------------------------------------------------------------------------
class Recorder:
    """Rule 4: an ASGI wrapper noting each request and its answer."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.requests: list[dict[str, Any]] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        record: dict[str, Any] = {
            "method": scope["method"], "path": scope["path"],
            "headers": {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}}
        self.requests.append(record)
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False) and message["type"] == "http.request"
        body = b"".join(chunks)
        try:
            record["body"] = json.loads(body) if body else None
        except ValueError:
            record["body"] = None
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        async def noting(message: Any) -> None:
            if message["type"] == "http.response.start":
                record["status"] = message["status"]
                record["response_headers"] = {k.decode("latin-1"): v.decode("latin-1")
                                              for k, v in message.get("headers", [])}
            await send(message)

        await self.app(scope, replay, noting)

    def since(self, mark: int) -> list[dict[str, Any]]:
        return self.requests[mark:]


@dataclass
class AgentDaemon:
    """The live daemon the CLIs talk to."""

    url: str
    port: int
    models_path: Path
    recorder: Recorder
    app: Any
    engines: dict[str, Any]
    server: Any = None

    def ring(self) -> list[Any]:
        """The daemon's own recent-requests records (http/access.py rule 5)."""
        return self.app.state.recent_requests.snapshot()

    def seen_by(self, model: str) -> list[str]:
        """The prompts the scripted entry `model` was given, oldest first."""
        engine = self.engines.get(model)
        return [prompt for _, prompt in engine.seen] if engine is not None else []


def start_daemon(tmp: Path, script: Callable[[str], str]) -> AgentDaemon:
    """`agent` (real engine) and `scripted` (ScriptedEngine answering by `script`),
    one 64k-window checkpoint (agent_model.py), on a free loopback port."""
    from adapters.scripted import mixed_factory, write_models_toml
    from daemon_support import start_server

    from agent_clis.agent_model import CONTEXT, make_agent_model
    from frink_mlx.app import create_app
    from frink_mlx.registry import load_registry
    from frink_mlx.settings import Settings

    checkpoint = make_agent_model(tmp / "agent-model")
    path = write_models_toml(tmp, {"agent": checkpoint, "scripted": checkpoint}, default="agent")
    path.write_text(path.read_text().replace(
        "[models.agent]\n", f"[models.agent]\ncontext_length = {CONTEXT}\nmax_tokens = 64\n").replace(
        "[models.scripted]\n", f"[models.scripted]\ncontext_length = {CONTEXT}\n"))
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(tmp / "cache"), keep_alive_s=None)
    engines: dict[str, Any] = {}
    app = create_app(settings, registry=load_registry(settings),
                     factory=mixed_factory({"scripted": script}, engines))
    recorder = Recorder(app)
    server = start_server(recorder)
    port = int(server.url.rsplit(":", 1)[1])
    return AgentDaemon(server.url, port, path, recorder, app, engines, server)


# -- one agent run ----------------------------------------------------------------------
@dataclass
class Run:
    """One CLI invocation: its output, the requests it made (Recorder), the daemon's
    ring records of them, and the prompts the scripted entry was given meanwhile."""

    agent: str
    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    requests: list[dict[str, Any]] = field(default_factory=list)
    records: list[Any] = field(default_factory=list)
    prompts: list[str] = field(default_factory=list)

    def model_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if r["path"].startswith(MODEL_ROUTES)]

    def model_records(self) -> list[Any]:
        return [r for r in self.records if r.route.startswith(MODEL_ROUTES)]

    def failed(self) -> list[tuple[str, str, int]]:
        """The daemon's records of this run's model-route requests answered 4xx or 5xx."""
        return [(r.method, r.route, r.status) for r in self.model_records()
                if not 200 <= r.status < 400]

    def explain(self) -> str:
        return (f"{self.agent} {' '.join(self.args)} -> {self.returncode}\n--- stdout\n"
                f"{self.stdout[-3000:]}\n--- stderr\n{self.stderr[-3000:]}\n--- requests\n"
                + "\n".join(f"{r['method']} {r['path']} {r.get('status')}"
                            for r in self.requests))

    def answered(self, text: str) -> bool:
        """Exit 0, `text` printed, and every model-route request answered below 400."""
        return (self.returncode == 0 and text in self.stdout and bool(self.model_records())
                and not self.failed())


@dataclass
class Session:
    """One agent's isolated home and working directory (rule 2), configured for `model`."""

    agent: str
    daemon: AgentDaemon
    root: Path
    model: str = "agent"

    def __post_init__(self) -> None:
        for name in ("home", "xdg/config", "xdg/data", "xdg/cache", "xdg/state", "codex", "work"):
            (self.root / name).mkdir(parents=True, exist_ok=True)
        self.configure()

    @property
    def work(self) -> Path:
        return self.root / "work"

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(_SCRUBBED)
               and k not in ("HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME",
                             "XDG_STATE_HOME", "HTTP_PROXY", "HTTPS_PROXY", "LD_PRELOAD")}
        env.update(HOME=str(self.root / "home"), XDG_CONFIG_HOME=str(self.root / "xdg/config"),
                   XDG_DATA_HOME=str(self.root / "xdg/data"),
                   XDG_CACHE_HOME=str(self.root / "xdg/cache"),
                   XDG_STATE_HOME=str(self.root / "xdg/state"),
                   CODEX_HOME=str(self.root / "codex"), PWD=str(self.work),
                   NO_COLOR="1", TERM="dumb",
                   NO_PROXY="127.0.0.1,localhost")
        env.update(AGENT_ENV.get(self.agent, {}))
        if self.agent == "qwen":
            env.update(OPENAI_BASE_URL=self.daemon.url + "/v1", OPENAI_API_KEY="frink-mlx",
                       OPENAI_MODEL=self.model)
        return env

    def configure(self) -> None:
        """Rule 3."""
        if self.agent == "qwen":
            settings = self.root / "home" / ".qwen" / "settings.json"
            settings.parent.mkdir(parents=True, exist_ok=True)
            settings.write_text(json.dumps(QWEN_SETTINGS, indent=2))
            return
        from frink_mlx.cli import agents, launch
        from frink_mlx.settings import Settings

        settings = Settings.load(models_path=str(self.daemon.models_path),
                                 port=self.daemon.port, host="127.0.0.1", api_key=None)
        target = launch.target(settings, argparse.Namespace(model=self.model))
        path = agents.config_path(self.agent, str(self.root / "home"),
                                  str(self.root / "xdg/config"), str(self.root / "codex"))
        agents.merge_file(path, agents.BUILDERS[self.agent](target))

    def run(self, *args: str, timeout_s: float = 180.0, extra_env: dict[str, str] | None = None
            ) -> Run:
        mark = len(self.daemon.recorder.requests)
        seq = max((r.seq for r in self.daemon.ring()), default=0)
        seen = len(self.daemon.seen_by("scripted"))
        argv = [str(binary(self.agent)), *args]
        env = {**self.env(), **(extra_env or {})}
        try:
            done = subprocess.run(argv, cwd=self.work, env=env, stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=timeout_s)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as exc:
            code, out, err = -9, _text(exc.stdout), _text(exc.stderr) + "\n(timed out)"
        return Run(self.agent, list(args), code, out, err, self.daemon.recorder.since(mark),
                   [r for r in self.daemon.ring() if r.seq > seq],
                   self.daemon.seen_by("scripted")[seen:])


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else (value or "")


AGENT_ENV: dict[str, dict[str, str]] = {
    "opencode": {"OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
                 "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
                 "OPENCODE_DISABLE_CLAUDE_CODE": "1", "OPENCODE_DISABLE_SHARE": "1"},
}
QWEN_SETTINGS = {"security": {"auth": {"selectedType": "openai"}},
                 "privacy": {"usageStatisticsEnabled": False},
                 "telemetry": {"enabled": False},
                 "general": {"disableAutoUpdate": True, "disableUpdateNag": True}}

# The first prompt of each agent's non-interactive mode.
PROMPT_ARGS: dict[str, Callable[[str], list[str]]] = {
    "claude": lambda prompt: ["-p", prompt],
    "codex": lambda prompt: ["exec", "--skip-git-repo-check", prompt],
    "opencode": lambda prompt: ["run", prompt],
    "qwen": lambda prompt: ["--auth-type", "openai", prompt],
}


# -- the scripted model (rule 5) --------------------------------------------------------
READERS: dict[str, Callable[[str], dict[str, Any]]] = {
    "Read": lambda path: {"file_path": path},                            # Claude Code
    "read": lambda path: {"filePath": path},                             # opencode
    "read_file": lambda path: {"file_path": path},                       # Qwen Code
    "exec_command": lambda path: {"cmd": f"cat {path}"},                 # Codex
    "shell": lambda path: {"command": ["cat", path]},                    # Codex (older)
}
_READ = re.compile(r"frink-read (/\S+)")


def offered_tools(prompt: str) -> list[str]:
    """Tool names in the `<tools>` block TOOLS_TEMPLATE renders (one JSON per line)."""
    if "<tools>" not in prompt:
        return []
    block = prompt.split("<tools>", 1)[1].split("</tools>", 1)[0]
    names = []
    for line in block.splitlines():
        try:
            tool = json.loads(line)
        except ValueError:
            continue
        fn = tool.get("function", tool) if isinstance(tool, dict) else {}
        if isinstance(fn, dict) and isinstance(fn.get("name"), str):
            names.append(fn["name"])
    return names


def tool_script(prompt: str) -> str:
    """Rule 5."""
    head = prompt.rpartition("<|im_start|>assistant")[0]     # before the generation prompt
    turn = head.rsplit("<|im_start|>assistant", 1)[-1]          # since the last reply
    if "<tool_response>" in turn:
        return ROUND_TRIP_DONE
    asked = _READ.findall(turn)
    reader = next((name for name in READERS if name in offered_tools(prompt)), None)
    if not asked or reader is None:
        return "Hello from the script."
    call = {"name": reader, "arguments": READERS[reader](asked[-1])}
    return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"


def write_png(path: Path, size: int = 8) -> Path:
    """A small solid-red RGB PNG (what an agent's screenshot or image read sends)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

    rows = b"".join(b"\x00" + b"\xff\x00\x00" * size for _ in range(size))
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", size, size,
                                                                        8, 2, 0, 0, 0))
                     + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b""))
    return path
