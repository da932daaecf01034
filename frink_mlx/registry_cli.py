"""`frink-mlx models` and `frink-mlx import PATH.gguf`.

Why separate from registry.py: these print for humans; the registry stays a
pure parser. Neither command imports MLX unless a GGUF is actually converted,
so `frink-mlx models` answers instantly. Errors are `ConfigError`s, which
cli.main prints as one line (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from .registry import ModelSpec, Registry, load_registry, resolve_source, source_problem
from .settings import Settings


def entry_status(spec: ModelSpec, settings: Settings) -> str:
    """available | imported (cached) | not imported yet | unavailable: why (as the daemon
    reports it: registry.source_problem)."""
    problem = source_problem(spec)
    if problem is not None:
        return "unavailable: " + problem
    source = resolve_source(spec)
    if source.is_dir():
        return "available"
    from .models.gguf import checkpoint_dir_for

    if (checkpoint_dir_for(source, settings.cache_dir) / "config.json").is_file():
        return "imported (cached)"
    return "available (GGUF, imported on first load)"


def format_table(registry: Registry, settings: Settings) -> list[str]:
    header = ("NAME", "KIND", "ALIASES", "SOURCE", "STATUS")
    rows = [header]
    for spec in registry.entries.values():
        name = spec.name + (" *" if spec.name == registry.default else "")
        rows.append((name, spec.kind, ", ".join(spec.aliases) or "-", spec.source,
                     entry_status(spec, settings)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]


def models_command(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    registry = load_registry(settings)
    print(f"registry: {registry.path}   (* = default)", file=out)
    for line in format_table(registry, settings):
        print(line, file=out)
    return 0


def import_command(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    from .models.gguf import import_gguf

    path = Path(args.path).expanduser()
    print(import_gguf(path, settings.cache_dir), file=out)
    return 0
