"""RoPE for the engine's forward on MLX's CPU backend, and the mark of that forward.

Why: `mx.fast.rope` has no CPU kernel, so on the CPU backend it runs as a
chain of small ops that rebuilds the cos/sin angles in every call, with cos
and sin the slowest of them (kernels.py's module docstring says why such
chains cost). Here the cos/sin tables of a forward's per-row positions are
built once on the host (angles formed in float32 exactly as `mx.fast.rope`
forms them, so outputs agree to ~2e-7) and shared by every layer's queries
and keys; the rotation is one fused loop (`mx.compile`).

Scope: RoPE carries no cache to dispatch on, so the runner marks its own
forward calls (`engine_forward`, a thread-local flag, which also holds this
forward's tables; kernels.py's SwiGLU reads the same flag) and only those, on
CPU float32, take this path; only for layers whose `self_attn.rope` is
exactly `nn.RoPE` (kernels.py `install`; scaled variants such as Llama3RoPE
stay stock) and only for per-row (array) offsets, which is what the paged
cache passes. Measured figures: benchmarks/results/cpu_backend-measurements.md.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from functools import lru_cache, partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from .split import on_cpu

_FORWARD = threading.local()


@contextlib.contextmanager
def engine_forward() -> Iterator[None]:
    """Marks the calling thread's model calls as the engine's (for SwiGLU and RoPE),
    with a fresh table memo for RoPE (one forward = one set of positions)."""
    _FORWARD.on = True
    _FORWARD.rope_tables = {}
    try:
        yield
    finally:
        _FORWARD.on = False
        _FORWARD.rope_tables = {}


def in_engine_forward() -> bool:
    """Whether the calling thread is inside `engine_forward`."""
    return bool(getattr(_FORWARD, "on", False))


@partial(mx.compile, shapeless=True)
def _rotate(a: mx.array, b: mx.array, cos: mx.array, sin: mx.array) -> tuple[mx.array, mx.array]:
    return a * cos - b * sin, a * sin + b * cos


def rope(x: mx.array, cos: mx.array, sin: mx.array, dims: int, traditional: bool) -> mx.array:
    """`mx.fast.rope` of (B, H, L, D) `x` given (B, 1, L, dims/2) cos/sin tables.

    traditional rotates pairs (x[2i], x[2i+1]); otherwise (x[i], x[i + dims/2]).
    Features past `dims` pass through.
    """
    batch, heads, length, width = x.shape
    if traditional:
        pairs = x[..., :dims].reshape(batch, heads, length, dims // 2, 2)
        a, b = _rotate(pairs[..., 0], pairs[..., 1], cos, sin)
        out = mx.stack([a, b], axis=-1).reshape(batch, heads, length, dims)
    else:
        a, b = _rotate(x[..., :dims // 2], x[..., dims // 2:dims], cos, sin)
        out = mx.concatenate([a, b], axis=-1)
    return out if dims == width else mx.concatenate([out, x[..., dims:]], axis=-1)


def rope_tables(offsets: mx.array, length: int, dims: int, base: float,
                scale: float) -> tuple[mx.array, mx.array]:
    """cos/sin of (offset_r + i) * scale * f_j, shape (B, 1, L, dims/2).

    Angles are formed exactly as `mx.fast.rope` forms them, in float32 with
    f_j = exp(-(log(base) / (dims/2)) * j) computed by MLX, so the outputs agree
    with stock to ~3e-7 even at position 5,000 (where float32 angles are
    themselves ~5e-4 off: matching stock keeps greedy outputs identical).
    """
    freqs = _rope_freqs(dims, base)
    pos = np.asarray(offsets, dtype=np.float32)[:, None] + np.arange(length, dtype=np.float32)
    theta = ((pos * np.float32(scale))[..., None] * freqs).astype(np.float64)
    return (mx.array(np.cos(theta).astype(np.float32))[:, None],
            mx.array(np.sin(theta).astype(np.float32))[:, None])


@lru_cache(maxsize=16)
def _rope_freqs(dims: int, base: float) -> np.ndarray:
    half = dims // 2
    freqs = mx.exp(-(mx.log(mx.array(base, mx.float32)) / half) * mx.arange(half, dtype=mx.float32))
    return np.array(freqs, dtype=np.float32)


class RoPEDispatch(nn.Module):
    """Stands in for a layer's `nn.RoPE`: inside `engine_forward`, for per-row
    offsets on CPU float32, the tables are built once per forward and shared
    by every layer's queries and keys; everywhere else the stock module runs."""

    def __init__(self, stock: nn.RoPE) -> None:
        super().__init__()
        self.stock = stock

    def __call__(self, x: mx.array, offset: Any = 0) -> mx.array:
        st = self.stock
        if not (in_engine_forward() and isinstance(offset, mx.array)
                and offset.ndim == 1 and x.ndim == 4 and x.dtype == mx.float32 and on_cpu()):
            return st(x, offset=offset)
        key = (id(offset), x.shape[2], st.dims, st.base, st.scale)
        entry = _FORWARD.rope_tables.get(key)
        if entry is None or entry[0] is not offset:
            entry = (offset, *rope_tables(offset, x.shape[2], st.dims, st.base, st.scale))
            _FORWARD.rope_tables[key] = entry
        return rope(x, entry[1], entry[2], st.dims, st.traditional)
