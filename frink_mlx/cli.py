"""argv -> Settings -> one command. No logic lives here.

    frink-mlx serve     [--host H] [--port P] [--models FILE] [--model NAME] ...
    frink-mlx generate  --prompt TEXT [--model NAME] [--max-tokens N] [--temp T]
    frink-mlx chat      [--model NAME] [--max-tokens N] [--temp T] [--url URL]
    frink-mlx models    [--models FILE]
    frink-mlx import    PATH.gguf [--float]
    frink-mlx service   install|uninstall|start|stop|status|logs
    frink-mlx open      [--host H] [--port P] [--url URL] [--print] [--no-check]

Each command's implementation lives in its own module and is imported lazily,
so `frink-mlx models` does not pay for importing MLX. A `ConfigError` (bad
models.toml, broken GGUF, ...) is printed as one line and exits 2; no traceback.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from . import __version__
from .errors import FrinkError
from .settings import Settings


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", dest="models_path", help="models.toml to use")
    p.add_argument("--cache-dir", dest="cache_dir", help="where converted checkpoints are cached")
    p.add_argument("--no-dequantize", dest="dequantize", action="store_const", const=False,
                   help="keep quantized weights on the CPU backend")
    p.add_argument("--dequantize", dest="dequantize", action="store_const", const=True,
                   help="dequantize quantized weights to float32 (CPU backend)")
    p.add_argument("--no-openblas", dest="use_openblas", action="store_const", const=False,
                   help="do not re-execute with the system OpenBLAS preloaded")


def _sampling(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", "-m", dest="model", default=None, help="registry name or alias")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=None)


def _distributed(p: argparse.ArgumentParser) -> None:
    """serve's flags for one model over several machines (README, "Several Macs")."""
    p.add_argument("--distributed", dest="distributed_hostfile", metavar="HOSTFILE",
                   help="one rank of a group of machines serving one model (MLX hostfile)")
    p.add_argument("--rank", dest="distributed_rank", type=int,
                   help="this machine's rank in --distributed's hostfile (0 serves HTTP)")
    p.add_argument("--distributed-backend", dest="distributed_backend",
                   help="MLX distributed backend: ring (default), jaccl, mpi, any")


def _open_parser(sub: Any) -> None:
    page = sub.add_parser("open", help="open the daemon's status page in the default browser")
    page.add_argument("--host", help="the daemon's address (default: the configured one)")
    page.add_argument("--port", type=int, help="the daemon's port (default: the configured one)")
    page.add_argument("--url", default=None, help="the daemon's base URL (overrides host/port)")
    page.add_argument("--print", dest="print_only", action="store_true",
                      help="print the page's URL instead of opening it")
    page.add_argument("--no-check", action="store_true",
                      help="open even if no daemon answers /health")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="frink-mlx", description="Local MLX inference daemon.")
    parser.add_argument("--version", action="version", version=f"frink-mlx {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run the daemon")
    _common(serve)
    serve.add_argument("--host")
    serve.add_argument("--port", type=int)
    serve.add_argument("--model", dest="default_model",
                       help="model to load at start (default: registry default)")
    serve.add_argument("--api-key", dest="api_key")
    serve.add_argument("--api-key-file", dest="api_key_file")
    serve.add_argument("--allowed-host", dest="allowed_hosts", action="append")
    serve.add_argument("--cors-origin", dest="cors_origins", action="append")
    serve.add_argument("--no-auto-swap", dest="auto_swap", action="store_const", const=False)
    serve.add_argument("--no-batching", dest="batching", action="store_const", const=False)
    serve.add_argument("--max-batch", dest="max_batch", type=int)
    serve.add_argument("--keep-alive", dest="keep_alive_s", type=float, help="idle unload after seconds")
    serve.add_argument("--log-level", dest="log_level")
    _distributed(serve)

    gen = sub.add_parser("generate", help="generate once, in process")
    _common(gen)
    _sampling(gen)
    gen.add_argument("--prompt", "-p", required=True)
    gen.add_argument("--no-chat-template", action="store_true", help="use the prompt as raw text")

    chat = sub.add_parser("chat", help="interactive chat (talks to a running daemon when one is up)")
    _common(chat)
    _sampling(chat)
    chat.add_argument("--url", default=None, help="daemon base URL (default: the local daemon if up)")
    chat.add_argument("--local", action="store_true", help="never use a daemon; load in process")
    chat.add_argument("--system", default=None, help="system prompt")

    models = sub.add_parser("models", help="list the registry and each entry's status")
    _common(models)

    imp = sub.add_parser("import", help="convert a GGUF file to a cached MLX checkpoint")
    _common(imp)
    imp.add_argument("path", help="a GGUF file (any name: Ollama blobs have no suffix)")
    imp.add_argument("--float", dest="as_float", action="store_true",
                     help="store quantized tensors dequantized to float32 instead of MLX affine")

    _open_parser(sub)
    svc = sub.add_parser("service", help="manage the launchd agent / systemd user unit")
    _common(svc)
    svc.add_argument("action", choices=["install", "uninstall", "start", "stop", "status", "logs"])
    svc.add_argument("--port", type=int)
    svc.add_argument("--generate-key", action="store_true", help="create an API key file (0600)")
    svc.add_argument("--host", help="address the service binds (non-loopback needs --generate-key)")
    svc.add_argument("--api-key-file", dest="api_key_file", help="key file the service uses")
    _distributed(svc)
    svc.add_argument("--backend", choices=["auto", "launchd", "systemd"], default="auto",
                     help="service manager (default: launchd on macOS, systemd elsewhere)")
    svc.add_argument("--lines", "-n", type=int, default=50, help="log lines to show (logs)")
    svc.add_argument("--follow", "-f", action="store_true", help="keep following the log (logs)")
    return parser


_SETTINGS_KEYS = {
    "models_path", "cache_dir", "dequantize", "use_openblas", "host", "port", "default_model",
    "api_key", "api_key_file", "allowed_hosts", "cors_origins", "auto_swap", "batching",
    "max_batch", "keep_alive_s", "log_level", "distributed_hostfile", "distributed_rank",
    "distributed_backend",
}


def _command(name: str) -> Callable[[Settings, argparse.Namespace], int]:
    fn: Callable[..., int]
    if name == "serve":
        from .server import serve_command
        fn = serve_command
    elif name in ("generate", "chat"):
        from . import chat as chat_mod
        fn = chat_mod.generate_command if name == "generate" else chat_mod.chat_command
    elif name in ("models", "import"):
        from . import registry_cli as reg
        fn = reg.models_command if name == "models" else reg.import_command
    elif name == "open":
        from .page_cli import open_command
        fn = open_command
    elif name == "service":
        from .service import service_command
        fn = service_command
    else:  # pragma: no cover - argparse refuses first
        raise SystemExit(2)
    return fn


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    overrides: dict[str, Any] = {k: v for k, v in vars(args).items() if k in _SETTINGS_KEYS}
    try:
        settings = Settings.load(**overrides)
        return _command(args.command)(settings, args)
    except FrinkError as exc:
        print(f"frink-mlx: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
