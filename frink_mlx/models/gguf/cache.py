"""Where an imported GGUF's checkpoint lives: keyed by the file's content, not its name.

Why content: Ollama blobs and re-downloaded files change names; a changed file
must never reuse a stale checkpoint. The key is the SHA-256 of the whole file
(streamed in 4 MiB chunks), first 16 hex digits, plus IMPORTER_VERSION (a
changed importer never reuses what an older one wrote) and "-f32" for float
imports. Kept free of numpy/MLX imports so `frink-mlx models` stays instant.
The progress report type lives here, below the importer, because hashing is
the import's first phase: the importer and this module both report it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

IMPORTER_VERSION = 2  # bump when the checkpoint the importer writes changes
_CHUNK = 1 << 22


@dataclass(slots=True)
class ImportProgress:
    """One progress report: `phase` is "hash" or "convert"; bytes of that phase so far."""

    phase: str
    done_bytes: int
    total_bytes: int
    tensor: str = ""


ProgressFn = Callable[[ImportProgress], None]


def content_hash(path: Path, progress: ProgressFn | None = None) -> str:
    """SHA-256 of the whole file; 16 hex digits. `progress` gets ImportProgress("hash", ...)."""
    digest = hashlib.sha256()
    total, done = path.stat().st_size, 0
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
            done += len(chunk)
            if progress is not None:
                progress(ImportProgress("hash", done, total))
    return digest.hexdigest()[:16]


def checkpoint_dir_for(path: Path, cache_dir: str | Path, *, as_float: bool = False,
                       progress: ProgressFn | None = None) -> Path:
    """<cache>/checkpoints/<content hash>-v<IMPORTER_VERSION>[-f32]."""
    suffix = "-f32" if as_float else ""
    return Path(cache_dir) / "checkpoints" / f"{content_hash(path, progress)}-v{IMPORTER_VERSION}{suffix}"
