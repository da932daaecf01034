"""`frink-mlx models` and `frink-mlx import PATH.gguf [--float]`.

Why separate from registry.py: these print for humans; the registry stays a
pure parser. Neither command imports MLX unless a GGUF is actually converted,
so `frink-mlx models` answers instantly. Errors are `ConfigError`s, which
cli.main prints as one line (exit 2).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, ClassVar, TextIO

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
    """Prints the checkpoint dir; a progress bar goes to stderr when it is a terminal."""
    from .models.gguf import import_gguf

    path = Path(args.path).expanduser()
    bar = ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    try:
        target = import_gguf(path, settings.cache_dir, as_float=bool(getattr(args, "as_float", False)),
                             progress=bar)
    finally:
        if bar is not None:
            bar.close()
    print(target, file=out)
    return 0


class ProgressBar:
    """`hash [#####.....] 48%  1.2/2.5 GB  3.1 s` on one terminal line, redrawn <= 10x a second."""

    WIDTH = 30
    LABELS: ClassVar[dict[str, str]] = {"hash": "hashing   ", "convert": "converting"}

    def __init__(self, stream: TextIO) -> None:
        import time

        self.stream, self.clock = stream, time.monotonic
        self.started, self.drawn_at, self.phase = self.clock(), 0.0, ""
        self.shown = False

    def __call__(self, report: Any) -> None:
        now = self.clock()
        done = report.done_bytes >= report.total_bytes
        if report.phase == self.phase and not done and now - self.drawn_at < 0.1:
            return
        if report.phase != self.phase:
            self.phase, self.started = report.phase, now
            if self.shown:
                self.stream.write("\n")
        self.drawn_at, self.shown = now, True
        frac = report.done_bytes / report.total_bytes if report.total_bytes else 1.0
        filled = int(frac * self.WIDTH)
        self.stream.write(
            f"\r{self.LABELS.get(report.phase, report.phase)} [{'#' * filled}{'.' * (self.WIDTH - filled)}] "
            f"{frac:4.0%}  {report.done_bytes / 1e9:.2f}/{report.total_bytes / 1e9:.2f} GB  "
            f"{now - self.started:.1f} s")
        self.stream.flush()

    def close(self) -> None:
        if self.shown:
            self.stream.write("\n")
            self.stream.flush()
