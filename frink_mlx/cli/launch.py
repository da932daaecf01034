"""`frink-mlx launch claude|codex|opencode [--model NAME] [--print]`.

Rules:
1. The target (agents.py rule 1) comes from the settings and the registry:
   the base URL as `chat` reaches the daemon (local_daemon rule 1), the key
   `chat` sends (http/binding.py `resolve_api_key`), the entry `--model` names
   (else the registry's default) with its `context_length` and `max_tokens`
   (else the context length) as the window and the output cap. When the
   daemon answers `/v1/models` (within PROBE_TIMEOUT_S), the window is what
   it serves that entry with (the ceiling from the checkpoint and memory,
   e.g. 8192 for SmolLM2 whose entry names no `context_length`); the
   entry's own cap wins when it is smaller.
2. `--print` writes the agent's config to stdout and touches no file;
   otherwise it is merged into the agent's own file (agents.py rule 3) and
   the path (and the backup) are printed. Nothing here needs a running daemon
   (rule 1's lookup is skipped when none answers).
3. The homes are $HOME, $XDG_CONFIG_HOME and $CODEX_HOME as settings.py reads them.
"""

from __future__ import annotations

import argparse
import sys
from typing import TextIO

from ..registry import load_registry
from ..settings import Settings, agent_homes
from . import agents
from .local_daemon import PROBE_TIMEOUT_S, daemon_url


def target(settings: Settings, args: argparse.Namespace) -> agents.Target:
    """Rule 1: the agents' target, from the settings, the registry and the daemon."""
    from ..http.binding import resolve_api_key

    spec = load_registry(settings).resolve(args.model)
    url = daemon_url(settings)
    key = resolve_api_key(settings)
    served = served_context(url, spec.name, key)
    context = min(c for c in (spec.context_length, served) if c) if (
        spec.context_length or served) else None
    return agents.Target(model=spec.name, base_url=url, api_key=key,
                         context=context, output=spec.max_tokens or context)


def served_context(url: str, model: str, key: str | None) -> int | None:
    """Rule 1: the `context_length` a running daemon lists for `model`, else None."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        r = httpx.get(f"{url}/v1/models", headers=headers, timeout=PROBE_TIMEOUT_S)
        listed = r.json().get("data", []) if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return None
    for entry in listed if isinstance(listed, list) else []:
        if isinstance(entry, dict) and entry.get("id") == model:
            value = entry.get("context_length")
            return value if isinstance(value, int) and value > 0 else None
    return None


def launch_command(settings: Settings, args: argparse.Namespace, out: TextIO | None = None) -> int:
    out = out or sys.stdout
    t = target(settings, args)
    config = agents.BUILDERS[args.agent](t)
    path = agents.config_path(args.agent, *agent_homes())
    if args.print_only:
        out.write(agents.render(path, config))
        return 0
    backup = agents.merge_file(path, config)
    kept = f" (the previous file kept as {backup})" if backup else ""
    print(f"wrote {path}{kept}", file=out)
    if args.agent == "codex" and t.api_key:
        print(f"codex reads the daemon's key from ${agents.KEY_ENV}: export it before "
              "starting codex", file=out)
    return 0
