"""GGUF -> MLX checkpoint import (llama.cpp's files, served by mlx-lm's model files).

    cache.py      content-hash cache key, ImportProgress (no numpy/MLX: `models` stays instant)
    reader.py     bounds-checked header reader; tensor rows read on demand
    tensors.py    every tensor type the `gguf` package dequantizes -> float or MLX affine
    arch.py       metadata + tensor names -> mlx-lm config and parameter plans, per-arch quirks
    plan.py       what a plan can say (stacked sources, row / column orders, value maps), the layout
    rope.py       RoPE metadata -> mlx-lm's rope_scaling, shared by every family's config
    hybrid_delta.py  Qwen3.5 / Qwen3-Next (GatedDeltaNet) quirks
    hybrid_ssm.py    LFM2, Nemotron-H, Granite-4-H, Falcon-H1 (short conv / Mamba2) quirks
    mixed.py      gpt-oss and Gemma 4 (sliding + full attention) quirks
    tokenizer.py  tokenizer.ggml.* -> tokenizer.json (BPE per pre-tokenizer, SentencePiece)
    importer.py   `import_gguf`: the streaming conversion, progress and logging

`import_gguf(path, cache_dir, *, as_float=False, progress=None) -> Path` is the
public entry; any file name works (Ollama blobs have no .gguf suffix).
`check_gguf(path)` runs its checks (header, tensor types, architecture) without
converting. The heavy modules load on first use of either.
"""

from __future__ import annotations

from typing import Any

from .cache import IMPORTER_VERSION, ImportProgress, checkpoint_dir_for, content_hash

__all__ = ["IMPORTER_VERSION", "ImportProgress", "check_gguf", "checkpoint_dir_for", "content_hash",
           "import_gguf"]


def __getattr__(name: str) -> Any:
    if name in ("import_gguf", "check_gguf"):
        from . import importer

        return getattr(importer, name)
    raise AttributeError(name)
