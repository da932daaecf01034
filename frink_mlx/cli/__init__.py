"""The command line: every `frink-mlx` command, and the only place argv is parsed.

Why a room of its own: the package root keeps the library (app, settings,
registry, errors, config, metrics) and nothing that prints for a person or
reads argv, so a reader finds each command under its own name here, and no
layer below imports any of it (tests/test_layering.py checks both).

    main.py          the parser and the dispatch: argv -> Settings -> one command
    flags.py         every Settings field as a flag, and README's flag table
                     (`python -m frink_mlx.cli.flags README.md`)
    serve.py         `serve`: bind, serve at once, load, drain on signals
                     (draining_server.py: the uvicorn server it runs)
    chat/            `chat` and `generate` (command.py) and their REPL pieces
    models.py        `models`, `import`, `pull`: the registry and the model stores
    service.py       `service`: the launchd agent / systemd user unit
    open.py          `open`: the status page in a browser
    launch.py        `launch`: point a coding agent at the daemon (agents.py: its files)
    local_daemon.py  where the local daemon answers: the one loopback rule and the one
                     /health prober every command above uses

Importing this package imports none of them: `main` below loads the parser only
when called, so `frink_mlx.cli:main` (the console script) stays cheap.
"""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    """The `frink-mlx` console script: main.py's `main`, imported on call."""
    from .main import main as run

    return run(argv)
