"""`frink-mlx chat` and `frink-mlx generate`: pick the model to talk to, then one call.

Both talk to the running daemon when one answers, so the model stays loaded
once (a second in-process copy of a 135M model peaks at 2.7 GB), and load the
model in process otherwise; the pieces live beside it in chat/. Rules:
1. `--url URL`: that daemon or an error -- if nothing answers there, one
   `frink-mlx: error:` line and exit 2, never a silent local load.
2. No `--url`: the configured address (local_daemon.py). A daemon that is
   loading or slow to answer /health is waited for (local_daemon.py rule 3);
   only when nothing listens is the model loaded in process.
3. `--local`: in process, no daemon asked.
4. `generate` streams the answer to stdout and prints mlx_lm.generate's speed
   block to stderr; through a daemon it imports no MLX at all.
5. Loading in process selects the device backend first, which may re-execute
   once with OpenBLAS before MLX is imported (backend/select.py rule 3) -- so
   only after the daemon was ruled out.
"""

from __future__ import annotations

import argparse
import os
import sys

from ...errors import Unavailable
from ...settings import Settings, environ_snapshot
from ..local_daemon import Health, daemon_url, probe, wait_ready
from .common import ChatModel, ChatParams, Note
from .daemon import DaemonModel
from .repl import Repl, note
from .session import Conversation


def _auth_headers(settings: Settings) -> dict[str, str]:
    try:
        from ...http.binding import resolve_api_key

        key = resolve_api_key(settings)
    except Exception:  # noqa: BLE001 - an unreadable key file: talk without one
        key = settings.api_key
    return {"authorization": f"Bearer {key}"} if key else {}


def _params(args: argparse.Namespace) -> ChatParams:
    return ChatParams(model=args.model, max_tokens=args.max_tokens, temperature=args.temp,
                      top_p=args.top_p, seed=args.seed)


def _to_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def find_daemon(settings: Settings, args: argparse.Namespace, say: Note) -> DaemonModel | None:
    """Rules 1-3: the daemon to use, or None to load in process."""
    if args.local:
        return None
    url, headers = daemon_url(settings, args.url), _auth_headers(settings)
    found = probe(url, headers)
    if found.health in (Health.LOADING, Health.SILENT):
        found = wait_ready(url, headers, say)
    if found.health is Health.READY:
        loaded = found.body.get("model")
        return DaemonModel(url, headers, args.model or "default", say,
                           loaded=str(loaded) if loaded else None)
    if args.url or found.health is not Health.ABSENT:
        hint = "start one with `frink-mlx serve`, or use --local" if args.url else "use --url or --local"
        raise Unavailable(f"no frink-mlx daemon at {url}: {found.detail} ({hint})")
    return None


def _where(settings: Settings, args: argparse.Namespace) -> str:
    return "(--local)" if args.local else f"at {daemon_url(settings, args.url)}"


def _local(settings: Settings, args: argparse.Namespace, say: Note) -> ChatModel:
    from ...backend import select_backend
    from .local import LocalModel

    device = select_backend(settings.backend_config(), argv=sys.argv,  # rule 5
                            environ=environ_snapshot())
    say(f"[no daemon answered {_where(settings, args)}; loading the model in process]")
    return LocalModel(settings, device, say).load(args.model)


def generate_command(settings: Settings, args: argparse.Namespace) -> int:
    """Rule 4: stream the answer to stdout and mlx_lm.generate's speed block to stderr."""
    target: ChatModel | None = find_daemon(settings, args, _to_stderr)
    if target is not None:
        _to_stderr(f"[using {target.label}]")
    else:
        target = _local(settings, args, _to_stderr)
    try:
        def emit(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        params = _params(args)
        if args.no_chat_template:
            stats = target.complete(args.prompt, params, emit)
        else:
            messages = [{"role": "system", "content": args.system}] if args.system else []
            stats = target.answer(messages + [{"role": "user", "content": args.prompt}],
                                   params, emit)
        emit("\n")
        _to_stderr(stats.report())
    finally:
        target.close()
    return 0


def chat_command(settings: Settings, args: argparse.Namespace) -> int:
    daemon = find_daemon(settings, args, note)
    target: ChatModel
    if daemon is not None:
        loaded = f", which has {daemon.loaded} loaded" if daemon.loaded else ""
        note(f"[talking to {daemon.label}{loaded}]")
        target = daemon
    else:
        target = _local(settings, args, note)
    _enable_line_editing()
    try:
        repl = Repl(target, _params(args), Conversation(system=args.system),
                    verbose=args.verbose)
        code = repl.run()
    except BaseException:
        target.close()
        raise
    if daemon is None:
        _end_process(code)  # nothing to hand back: the in-process engines end with the process
    target.close()
    return code


def _end_process(code: int) -> None:
    """End an in-process session once its conversation is over.

    Why: shutting the in-process engines down first joins their threads (bounded, but
    up to half a minute each, engine.py), and letting the interpreter tear MLX down
    around a live MLX thread can hang the exit. Nothing is left to save: flush and leave."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _enable_line_editing() -> None:
    """Arrow keys and history at the prompt, without bracketed-paste escapes."""
    if not sys.stdin.isatty():
        return
    try:
        import readline
    except ImportError:  # pragma: no cover - Windows
        return
    readline.parse_and_bind("set enable-bracketed-paste off")
