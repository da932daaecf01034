"""argv -> Settings -> one command: the parser and the dispatch. No logic lives here.

    frink-mlx serve     [every setting as a flag: see `serve --help`, flags.py]
    frink-mlx generate  --prompt TEXT [--model NAME] [--max-tokens N] [--url URL | --local]
    frink-mlx chat      [--model NAME] [--max-tokens N] [--verbose] [--url URL | --local]
    frink-mlx models    [--models FILE]
    frink-mlx import    PATH.gguf | ollama:NAME[:TAG] [--float]
    frink-mlx pull      ORG/NAME[@REVISION]
    frink-mlx service   install|uninstall|start|stop|status|logs
    frink-mlx open      [--host H] [--port P] [--url URL] [--print] [--no-check]
    frink-mlx launch    claude|codex|opencode [--model NAME] [--print]

Each command's implementation lives in its own module of cli/ and is imported lazily,
so `frink-mlx models` does not pay for importing MLX. A `ConfigError` (bad
models.toml, broken GGUF, ...) is printed as one line and exits 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import Any, TypeAlias

from .. import __version__
from ..errors import FrinkError
from ..settings import Settings
from .flags import COMMON, add_setting_flags, setting_fields

# what `add_subparsers` returns: one `add_parser` per command
Commands: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"

CHAT_HELP = """Inside the REPL: /help, /reset, /system TEXT, /model NAME, /save FILE,
/retry, /stats, /quit (also mlx_lm.chat's q, r, h). Ctrl-C stops an answer and keeps
the conversation; Ctrl-D or Ctrl-C twice at the prompt ends the session."""


def _sampling(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("generation")
    g.add_argument("--model", "-m", dest="model", default=None,
                   help="registry name or alias [default: the daemon's or registry's default]")
    g.add_argument("--max-tokens", type=int, default=256, help="answer length cap [default: 256]")
    g.add_argument("--temp", type=float, default=0.0,
                   help="sampling temperature; 0 is greedy [default: 0.0]")
    g.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling [default: 1.0]")
    g.add_argument("--seed", type=int, default=None, help="sampling seed [default: none]")
    g.add_argument("--system", default=None, help="system prompt")
    g.add_argument("--url", default=None,
                   help="daemon base URL; nothing answering there is an error "
                        "[default: the configured host and port, else in process]")
    g.add_argument("--local", action="store_true",
                   help="never use a daemon; load the model in this process")


def _open_parser(sub: Commands) -> None:
    page = sub.add_parser("open", help="open the daemon's status page in the default browser")
    page.add_argument("--host", help="the daemon's address (default: the configured one)")
    page.add_argument("--port", type=int, help="the daemon's port (default: the configured one)")
    page.add_argument("--url", default=None, help="the daemon's base URL (overrides host/port)")
    page.add_argument("--print", dest="print_only", action="store_true",
                      help="print the page's URL instead of opening it")
    page.add_argument("--no-check", action="store_true",
                      help="open even if no daemon answers /health")


def _launch_parser(sub: Commands) -> None:
    launch = sub.add_parser("launch", help="point a coding agent (Claude Code, Codex, OpenCode) "
                                           "at this daemon: write its config file")
    launch.add_argument("agent", choices=["claude", "codex", "opencode"])
    launch.add_argument("--model", "-m", default=None,
                        help="registry name or alias [default: the registry's default]")
    launch.add_argument("--print", dest="print_only", action="store_true",
                        help="print the config instead of writing it")
    add_setting_flags(launch, COMMON + ("config_dir", "host", "port", "api_key_file"))


def _model_store_parsers(sub: Commands) -> None:
    """models, import, pull: the registry and the model stores (models.py)."""
    models = sub.add_parser("models", help="list the registry and each entry's status")
    add_setting_flags(models, COMMON)

    imp = sub.add_parser("import", help="convert a GGUF file (or an Ollama model) to a cached "
                                        "MLX checkpoint")
    add_setting_flags(imp, COMMON)
    imp.add_argument("path", help="a GGUF file (any name: Ollama blobs have no suffix), or "
                                   "ollama:NAME[:TAG] from the Ollama store")
    imp.add_argument("--float", dest="as_float", action="store_true",
                     help="store quantized tensors dequantized to float32 instead of MLX affine")

    pull = sub.add_parser("pull", help="download a Hugging Face repo into its cache ahead of time")
    add_setting_flags(pull, COMMON + ("hf_offline", "hf_endpoint", "hf_cache_dir"))
    pull.add_argument("repo", help="org/name[@revision]")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frink-mlx", description="Local MLX inference daemon.")
    parser.add_argument("--version", action="version", version=f"frink-mlx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon", description=(
        "Run the daemon. Every setting is a flag here and a FRINK_MLX_<NAME> environment "
        "variable (flag > environment > default)."))
    add_setting_flags(serve, setting_fields())

    gen = sub.add_parser("generate", help="generate once (through the daemon when one is up)")
    _sampling(gen)
    gen.add_argument("--prompt", "-p", required=True)
    gen.add_argument("--no-chat-template", action="store_true", help="use the prompt as raw text")
    add_setting_flags(gen, COMMON, "in-process settings")

    chat = sub.add_parser("chat", help="interactive chat (through the daemon when one is up)",
                          description="An mlx_lm.chat-style REPL. " + CHAT_HELP,
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    _sampling(chat)
    chat.add_argument("--verbose", "-v", action="store_true",
                      help="print tokens/s after each answer (/stats toggles it)")
    add_setting_flags(chat, COMMON, "in-process settings")

    _model_store_parsers(sub)
    _open_parser(sub)
    _launch_parser(sub)
    svc = sub.add_parser("service", help="manage the launchd agent / systemd user unit")
    add_setting_flags(svc, COMMON + ("host", "port", "api_key_file", "distributed_hostfile",
                                     "distributed_rank", "distributed_backend",
                                     "distributed_split", "distributed_secret_file"))
    svc.add_argument("action", choices=["install", "uninstall", "start", "stop", "status", "logs"])
    svc.add_argument("--generate-key", action="store_true", help="create an API key file (0600)")
    svc.add_argument("--backend", choices=["auto", "launchd", "systemd"], default="auto",
                     help="service manager (default: launchd on macOS, systemd elsewhere)")
    svc.add_argument("--lines", "-n", type=int, default=50, help="log lines to show (logs)")
    svc.add_argument("--follow", "-f", action="store_true", help="keep following the log (logs)")
    return parser


def _command(name: str) -> Callable[[Settings, argparse.Namespace], int]:
    fn: Callable[..., int]
    if name == "serve":
        from .serve import serve_command
        fn = serve_command
    elif name in ("generate", "chat"):
        from .chat import command as chat_mod
        fn = chat_mod.generate_command if name == "generate" else chat_mod.chat_command
    elif name in ("models", "import", "pull"):
        from . import models as reg
        fn = {"models": reg.models_command, "import": reg.import_command,
              "pull": reg.pull_command}[name]
    elif name == "open":
        from .open import open_command
        fn = open_command
    elif name == "launch":
        from .launch import launch_command
        fn = launch_command
    elif name == "service":
        from .service import service_command
        fn = service_command
    else:  # pragma: no cover - argparse refuses first
        raise SystemExit(2)
    return fn


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    fields = setting_fields()
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k in fields}
    try:
        settings = Settings.load(**overrides)
        return _command(args.command)(settings, args)
    except FrinkError as exc:
        print(f"frink-mlx: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
