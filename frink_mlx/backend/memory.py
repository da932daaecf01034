"""Handing a freed model's memory back to the operating system.

Why: a swapped-out generation's weights and KV pool are freed by MLX, but on
Linux most of them were allocated through glibc's malloc, whose dynamic mmap
threshold climbs to 32 MiB after the first large free: later tensors under
that size come from the heap, and a freed heap is kept by the process, not
returned. So RSS grew by about a model's weights with every swap while MLX's
own active memory stayed flat; `malloc_trim(0)` after each free keeps RSS at
one generation's worth (benchmarks/results/swap-rss-2026-12-01.txt).

Rules:
1. `release_freed_memory()` runs after a generation's last reference is
   dropped: a garbage collection (engine objects hold reference cycles), then
   MLX's buffer cache (`mx.clear_cache`), then glibc's `malloc_trim(0)`.
2. `malloc_trim` exists in glibc only; elsewhere (macOS, musl) step 3 is
   skipped -- Metal buffers are not malloc'ed and macOS's allocator returns
   large frees by itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import sys
from functools import lru_cache
from typing import Any

import mlx.core as mx


@lru_cache(maxsize=1)
def _malloc_trim() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc.malloc_trim
    except (OSError, AttributeError):  # not glibc
        return None


def release_freed_memory() -> None:
    """Rule 1: a garbage collection, MLX's buffer cache, then malloc_trim(0) (blocking;
    call it off the event loop)."""
    gc.collect()
    mx.clear_cache()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)

