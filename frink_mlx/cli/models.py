"""`frink-mlx models`, `frink-mlx import PATH.gguf|ollama:NAME[:TAG] [--float]`, `frink-mlx pull REPO[@REV]`.

Why separate from registry.py: these print for humans; the registry stays a
pure parser. No command imports MLX unless a GGUF is actually converted, and
`models` touches no network, so it answers instantly. Errors are
`ConfigError`s, which cli.main prints as one line (exit 2).

Rules:
1. `models` gives each entry a STATUS: `available ...`, `imported (cached)`,
   `unavailable: <why>` (the source is not there, as the daemon reports it:
   registry rule 5) or `refused: <why>` (it is
   there but loading would fail: a generative model_type mlx-lm has no file
   for, a quantization mode MLX does not have, a GGUF tensor type or
   architecture the importer does not take: models/gguf `check_gguf`).
2. `import` and `pull` print the checkpoint dir on stdout; progress (phases,
   download bars) goes to stderr, only when stderr is a terminal, so scripts
   and errors stay one line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any, ClassVar, TextIO

from ..config import LoadConfig
from ..errors import ConfigError
from ..models import gguf, sources
from ..models.progress import Progress, reporting
from ..registry import ModelSpec, Registry, load_registry, resolve_source, source_kind
from ..settings import Settings

# mlx-lm serves these model_types with another type's file (mlx_lm.utils.MODEL_REMAPPING).
_MLX_LM_REMAPPED = {"mistral": "llama", "llava": "mistral3", "phi-msft": "phixtral",
                    "falcon_mamba": "mamba", "kimi_k2": "deepseek_v3", "xverse": "llama",
                    "iquestcoder": "llama", "minimax_m2": "minimax", "qwen2_5_vl": "qwen2_vl"}
_MLX_MODES = ("affine", "mxfp4", "mxfp8", "nvfp4")


def entry_status(spec: ModelSpec, config: LoadConfig) -> str:
    """Rule 1: an entry's STATUS (available, imported, unavailable or refused, with why)."""
    problem = sources.missing_reason(spec, config)  # as the daemon reports it (registry rule 5)
    if problem is not None:
        return "unavailable: " + problem
    kind = source_kind(spec.source)
    if kind == "hf":
        return _hf_status(spec, config)
    source = sources.ollama_model(spec.source, config).blob if kind == "ollama" else \
        resolve_source(spec)
    if source.is_dir():
        refusal = checkpoint_refusal(source, spec.kind)
        return f"refused: {refusal}" if refusal else "available"
    if (gguf.checkpoint_dir_for(source, config.cache_dir) / "config.json").is_file():
        return "imported (cached)"
    try:
        arch = gguf.check_gguf(source)
    except ConfigError as exc:
        return "refused: " + exc.message.split(": ", 1)[-1]
    return f"available (GGUF {arch}, imported on first load)"


def _hf_status(spec: ModelSpec, config: LoadConfig) -> str:
    cached = sources.cached_hf_snapshot(spec.source, config)
    if cached is not None:
        refusal = checkpoint_refusal(cached, spec.kind)
        return f"refused: {refusal}" if refusal else "available (Hugging Face cache)"
    return "available (Hugging Face, downloaded on first load)"


def checkpoint_refusal(path: Path, kind: str = "generative") -> str | None:
    """Why loading the checkpoint dir at `path` would be refused, from its config.json; None
    if fine. Encoder entries load with our own encoder models (models/encoder/), which check
    their model_type themselves, so only generative ones are held to mlx-lm's list."""
    try:
        config: dict[str, Any] = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as exc:
        return f"{path / 'config.json'} is unreadable ({exc})"
    model_type = str(config.get("model_type", ""))
    if model_type and kind == "generative":
        found = importlib.util.find_spec("mlx_lm")
        where = found.submodule_search_locations if found else None
        module = _MLX_LM_REMAPPED.get(model_type, model_type).replace("-", "_")
        if where and not any((Path(d) / "models" / f"{module}.py").is_file() for d in where):
            return f"model_type {model_type!r} is not supported by mlx-lm"
    quant = config.get("quantization") or {}
    mode = quant.get("mode", "affine") if isinstance(quant, dict) else "affine"
    if mode not in _MLX_MODES:
        return f"quantization mode {mode!r} is not one MLX has ({', '.join(_MLX_MODES)})"
    return None


def format_table(registry: Registry, config: LoadConfig) -> list[str]:
    header = ("NAME", "KIND", "ALIASES", "SOURCE", "STATUS")
    rows = [header]
    for spec in registry.entries.values():
        name = spec.name + (" *" if spec.name == registry.default else "")
        rows.append((name, spec.kind, ", ".join(spec.aliases) or "-", spec.source,
                     entry_status(spec, config)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows]


def models_command(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    registry = load_registry(settings)
    print(f"registry: {registry.path}   (* = default)", file=out)
    for line in format_table(registry, settings.load_config()):
        print(line, file=out)
    return 0


def _terminal_progress(name: str) -> Progress:
    """Rule 2: a Progress that echoes phases to stderr when it is a terminal."""
    tty = sys.stderr.isatty()
    return Progress(name, echo=(lambda line: print(line, file=sys.stderr)) if tty else None)


def import_command(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    """Prints the checkpoint dir; a progress bar goes to stderr when it is a terminal."""
    path = Path(args.path).expanduser()
    if source_kind(args.path) == "ollama":
        path = sources.ollama_model(args.path, settings.load_config()).blob
    bar = ProgressBar(sys.stderr) if sys.stderr.isatty() else None
    try:
        target = gguf.import_gguf(path, settings.cache_dir,
                                  as_float=bool(getattr(args, "as_float", False)), progress=bar)
    finally:
        if bar is not None:
            bar.close()
    print(target, file=out)
    return 0


def pull_command(settings: Settings, args: argparse.Namespace, out: TextIO = sys.stdout) -> int:
    with reporting(_terminal_progress(args.repo)):
        print(sources.pull(args.repo, settings.load_config()), file=out)
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
