"""The coding agents' config files that point them at this daemon (`frink-mlx launch`).

Pure: plain values in, dicts and text out; no MLX, no Settings, no I/O except
`merge_file`. launch.py gathers the values and writes.

Rules:
1. One `Target` says which model, where the daemon answers (base URL without
   a path), the key clients send (the daemon's, else a placeholder a keyless
   daemon accepts), and the context window and output cap the registry entry
   allows (None: not known, so the key is left out and the agent's default
   stands).
2. Each agent gets the keys it reads: Codex its config.toml (a `frink`
   provider on the Responses API; a keyed daemon's key is read from
   $FRINK_MLX_API_KEY through `env_key`; the window as `model_context_window`,
   no output cap: Codex 0.169 ignores `model_max_output_tokens`), Claude Code the
   `env` block of its settings.json (the window as CLAUDE_CODE_MAX_CONTEXT_TOKENS,
   its window for a model name it does not know, where it would assume 1M tokens;
   CLAUDE_CODE_AUTO_COMPACT_WINDOW would not do: it reads anything under 100k as
   100k; the cap as CLAUDE_CODE_MAX_OUTPUT_TOKENS), OpenCode its opencode.json (an
   `@ai-sdk/openai-compatible` provider). Telemetry, error reporting and update
   checks are turned off.
3. Writing merges into the existing file: the keys set here replace theirs,
   tables merge key by key, every other key is kept; the old file is kept as
   `<name>.bak`. A file that does not parse is refused, never overwritten.
"""

from __future__ import annotations

import datetime
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomllib

from ..errors import ConfigError

AGENTS = ("claude", "codex", "opencode")
PLACEHOLDER_KEY = "frink-mlx"   # a daemon without a key accepts any
KEY_ENV = "FRINK_MLX_API_KEY"


@dataclass(frozen=True, slots=True)
class Target:
    """Rule 1: the model, base URL, key, context window and output cap an agent is given."""

    model: str
    base_url: str                 # http://HOST:PORT
    api_key: str | None           # the daemon's key, None when it has none
    context: int | None = None
    output: int | None = None

    @property
    def token(self) -> str:
        return self.api_key or PLACEHOLDER_KEY


def codex_config(t: Target) -> dict[str, Any]:
    provider: dict[str, Any] = {"name": "frink-mlx", "base_url": t.base_url + "/v1",
                                "wire_api": "responses"}
    if t.api_key:
        provider["env_key"] = KEY_ENV
    config: dict[str, Any] = {"model": t.model, "model_provider": "frink",
                              "check_for_update_on_startup": False}
    if t.context:
        config["model_context_window"] = t.context
    config["model_providers"] = {"frink": provider}
    config["analytics"] = {"enabled": False}
    return config


def claude_config(t: Target) -> dict[str, Any]:
    env = {"ANTHROPIC_BASE_URL": t.base_url, "ANTHROPIC_AUTH_TOKEN": t.token,
           "ANTHROPIC_MODEL": t.model, "ANTHROPIC_SMALL_FAST_MODEL": t.model}
    if t.context:
        env["CLAUDE_CODE_MAX_CONTEXT_TOKENS"] = str(t.context)
    if t.output:
        env["CLAUDE_CODE_MAX_OUTPUT_TOKENS"] = str(t.output)
    env.update({"DISABLE_TELEMETRY": "1", "DISABLE_AUTOUPDATER": "1",
                "DISABLE_ERROR_REPORTING": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1"})
    return {"env": env}


def opencode_config(t: Target) -> dict[str, Any]:
    model: dict[str, Any] = {"name": t.model}
    if t.context and t.output:   # OpenCode wants both or neither
        model["limit"] = {"context": t.context, "output": t.output}
    provider = {"npm": "@ai-sdk/openai-compatible", "name": "frink-mlx",
                "options": {"baseURL": t.base_url + "/v1", "apiKey": t.token},
                "models": {t.model: model}}
    return {"$schema": "https://opencode.ai/config.json", "model": f"frink/{t.model}",
            "provider": {"frink": provider}, "autoupdate": False, "share": "disabled"}


BUILDERS = {"claude": claude_config, "codex": codex_config, "opencode": opencode_config}


def config_path(agent: str, home: str, xdg_config: str, codex_home: str) -> Path:
    """Where `agent` reads its config (settings.agent_homes supplies the roots)."""
    if agent == "codex":
        return Path(codex_home) / "config.toml"
    if agent == "claude":
        return Path(home) / ".claude" / "settings.json"
    return Path(xdg_config) / "opencode" / "opencode.json"


def render(path: Path, config: dict[str, Any]) -> str:
    return dump_toml(config) if path.suffix == ".toml" else json.dumps(config, indent=2) + "\n"


def merge(old: dict[str, Any], new: dict[str, Any]) -> dict[str, Any]:
    """Rule 3: `new` over `old`, tables merged key by key."""
    out = dict(old)
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def _parse(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    try:
        data = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text or "{}")
    except (tomllib.TOMLDecodeError, ValueError) as exc:
        kind = "TOML" if path.suffix == ".toml" else "JSON"
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: not valid {kind} ({first}); left as it is") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: not a JSON object; left as it is")
    return data


def merge_file(path: Path, config: dict[str, Any]) -> Path | None:
    """Rule 3: write `config` merged into `path`; the backup's path, None if there was no file."""
    backup = None
    old: dict[str, Any] = {}
    if path.exists():
        old = _parse(path)
        backup = path.with_name(path.name + ".bak")
        backup.write_bytes(path.read_bytes())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(path, merge(old, config)), encoding="utf-8")
    return backup


# --- a small TOML writer (tomllib only reads) ----------------------------------------

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(k: str) -> str:
    return k if _BARE.match(k) else json.dumps(k)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)
    if isinstance(v, (datetime.datetime, datetime.date, datetime.time)):
        return v.isoformat()
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{" + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + "}"
    raise TypeError(f"cannot write {type(v).__name__} as TOML")


def _is_table_list(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(x, dict) for x in v)


def _table(data: dict[str, Any], prefix: str, out: list[str]) -> None:
    for k, v in data.items():
        if not isinstance(v, dict) and not _is_table_list(v):
            out.append(f"{_key(k)} = {_value(v)}")
    for k, v in data.items():
        name = f"{prefix}.{_key(k)}" if prefix else _key(k)
        if isinstance(v, dict):
            if not v or any(not isinstance(x, dict) and not _is_table_list(x) for x in v.values()):
                out += ["", f"[{name}]"]   # a table of tables only needs no header of its own
            _table(v, name, out)
        elif _is_table_list(v):
            for item in v:
                out.append("")
                out.append(f"[[{name}]]")
                _table(item, name, out)


def dump_toml(data: dict[str, Any]) -> str:
    out: list[str] = []
    _table(data, "", out)
    return "\n".join(out).lstrip("\n") + "\n"
