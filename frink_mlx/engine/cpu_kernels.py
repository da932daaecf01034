"""Attention and SwiGLU for the engine's forward on MLX's CPU backend, without `mx.exp`.

Why: on MLX's Linux CPU backend `mx.exp` is scalar, ~25 ns per element
(numpy's vectorised exp: ~0.5 ns), and `mx.fast.scaled_dot_product_attention`
has no CPU kernel: its fallback is matmul, softmax, matmul, and the softmax's
exp is most of it. Measured here (fp32, 9 query / 3 KV heads, head_dim 64):
one layer of a 32-token prefill over 1,072 cached tokens took 10.9 ms, of
which exp 8.4 ms and both matmuls 0.9 ms. This module computes the same
attention with exp2 built from cheap, vectorised ops (below): ~2.5x faster
for that shape, long-context prefill (a coding agent's turn) the most.

exp2 of t <= 0 (softmax inputs after subtracting the row max, in log2 units):
    n = floor(t), f = t - n in [0, 1)
    2^f  ~ a degree-6 polynomial (least squares on Chebyshev nodes, relative
           error 8.5e-8 in fp32 Horner arithmetic, i.e. fp32 rounding level)
    2^n  = the float whose exponent bits are n + 127 (t clamped at -126, so
           masked -inf scores become 2^-126 ~ 1e-38 instead of 0: that weight
           times any value is far below fp32 resolution of the output)
Outputs match `mx.fast.scaled_dot_product_attention` to ~1e-6 relative.

Scope, so that stock numerics stay everywhere else:
- only `PagedLayerCache` calls (the engine's forward), only float32, only
  without attention sinks, only on the CPU device, only for calls of at most
  `MAX_QUERIES` query positions and at least `MIN_SCORES` scores (below it
  the extra ops cost more than exp: one decode row over 64 keys 0.05 ms
  stock vs 0.13, four rows over 100 keys 0.22 vs 0.29); everything else goes to mlx-lm's own
  `scaled_dot_product_attention`. Measured per layer, stock vs this: decode
  batch 16 over 120 tokens 0.71 vs 0.47 ms; 7 prompts x 39 tokens 4.2 vs
  2.0 ms; 256 queries over 1,024 keys 64 vs 38 ms; 384 x 384 45 vs 25 ms;
  but 512 x 512 67 vs 99 ms and 768 x 768 165 vs 210 ms (the ~20 passes
  of exp2 lose to one pass of exp once the work no longer stays in cache,
  even in chunks), hence the bound;
- installed by replacing that name in the model's own module (mlx-lm's model
  files import it by name and call it with the layer's cache), the same
  cache-type dispatch mlx-lm itself uses for quantized caches.

SwiGLU (`silu(gate) * x`, llama/qwen/mistral MLPs) has the same problem:
its sigmoid is one exp per element. For a 312-token prefill it took 13 ms
per layer, as long as the layer's seven matmuls. Here, with
e = 2^(-|g| log2 e) in (0, 1] (so exp2's argument stays <= 0):
    silu(g) = g * (1 if g >= 0 else e) / (1 + e)
11 ms instead of 19 for (312, 1536) here, 2e-6 absolute error; for a
decode batch (8, 1536) the extra passes cost more than exp saves (0.44 vs
0.41 ms), so only gates of at least `MIN_SWIGLU_SIZE` numbers take it. The
MLP call carries no cache to dispatch on, so the runner marks its own
forward calls (`engine_forward`, a thread-local flag) and only those do.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import mlx.core as mx

from .kv.paged import PagedLayerCache

_LOG2E = 1.4426950408889634
# 2^f on [0, 1), lowest degree first (see the module docstring).
_EXP2_COEFFS = (1.0000000018154953, 0.6931469870574705, 0.2402297958142873,
                0.05548352472381888, 0.009678472554714488, 0.0012443081506139477,
                0.00021690609177579776)
_MARK = "_frink_cpu_kernel"
_SCORES_PER_CHUNK = 1 << 18
MAX_QUERIES = 384
MIN_SCORES = 1 << 12
MIN_SWIGLU_SIZE = 1 << 15


def exp2_nonpositive(t: mx.array) -> mx.array:
    """2**t for float32 t <= 0 (see the module docstring)."""
    t = mx.maximum(t, -126.0)
    n = mx.floor(t)
    f = t - n
    p = f * _EXP2_COEFFS[-1] + _EXP2_COEFFS[-2]
    for c in _EXP2_COEFFS[-3::-1]:
        p = p * f + c
    return p * mx.left_shift(n.astype(mx.int32) + 127, 23).view(mx.float32)


def attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
              bias: mx.array | None) -> mx.array:
    """softmax(q k^T * scale + bias) v for (B, H, L, D) queries over (B, Hk, T, D) keys.

    The score matrix is made in query chunks of at most `_SCORES_PER_CHUNK`
    numbers: exp2 is ~20 elementwise passes, which stay in cache for a chunk
    but stream from memory for a whole prompt. Measured per layer, chunked vs
    whole: 384 x 384 24 vs 37 ms; 256 queries over 1,024 keys 37-43 vs
    57-67 ms; 128 over 2,048 38-40 vs 56-63 ms; small calls within noise.
    """
    batch, heads, length, _ = queries.shape
    rows = max(1, _SCORES_PER_CHUNK // max(1, batch * heads * keys.shape[2]))
    if length <= rows:
        return _attention(queries, keys, values, scale, bias)
    parts = [_attention(queries[:, :, i:i + rows], keys, values, scale,
                        None if bias is None else bias[..., i:i + rows, :])
             for i in range(0, length, rows)]
    return mx.concatenate(parts, axis=2)


def _attention(queries: mx.array, keys: mx.array, values: mx.array, scale: float,
               bias: mx.array | None) -> mx.array:
    """One chunk. GQA without repeating K/V: the r = H / Hk query heads of one KV
    head are stacked along L, so each product is one (r*L, D) x (D, T) matmul per
    KV head. `bias` is additive, (B, 1, 1, L, T) or None; normalising after the
    value product divides (r*L, D) numbers instead of (r*L, T)."""
    batch, heads, length, dim = queries.shape
    kv_heads, width = keys.shape[1], keys.shape[2]
    group = heads // kv_heads
    q = (queries * (scale * _LOG2E)).reshape(batch, kv_heads, group * length, dim)
    scores = q @ keys.swapaxes(-1, -2)
    if bias is not None:
        scores = (scores.reshape(batch, kv_heads, group, length, width) + bias).reshape(
            batch, kv_heads, group * length, width)
    weights = exp2_nonpositive(scores - scores.max(axis=-1, keepdims=True))
    out = (weights @ values) * mx.reciprocal(weights.sum(axis=-1, keepdims=True))
    return out.reshape(batch, heads, length, values.shape[-1])


def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x without `mx.exp` (see the module docstring)."""
    e = exp2_nonpositive(mx.abs(gate) * -_LOG2E)
    return gate * mx.where(gate >= 0, 1.0, e) * mx.reciprocal(1.0 + e) * x


_FORWARD = threading.local()


@contextlib.contextmanager
def engine_forward() -> Iterator[None]:
    """Marks the calling thread's model calls as the engine's (for `swiglu`)."""
    _FORWARD.on = True
    try:
        yield
    finally:
        _FORWARD.on = False


def _on_cpu() -> bool:
    return mx.default_device().type == mx.DeviceType.cpu


def make_swiglu_dispatch(stock: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """mlx-lm's `swiglu(gate, x)`: ours inside `engine_forward` on CPU float32, else stock."""

    def dispatching_swiglu(gate: mx.array, x: mx.array) -> mx.array:
        if (getattr(_FORWARD, "on", False) and gate.dtype == mx.float32
                and gate.size >= MIN_SWIGLU_SIZE and _on_cpu()):
            return swiglu(gate, x)
        return stock(gate, x)

    setattr(dispatching_swiglu, _MARK, True)
    return dispatching_swiglu


def _bias(cache: PagedLayerCache, mask: Any, length: int, width: int) -> mx.array | None:
    """The additive form of the mask mlx-lm passed (None, "causal" or a bool array)."""
    if mask is None:
        return None
    if isinstance(mask, str):  # "causal": one row starting at position 0
        causal = cache.layout_memo(("bias", mask))
        if causal is None:
            q_pos = mx.arange(length)[:, None] + (width - length)
            allowed = mx.arange(width)[None, :] <= q_pos
            causal = cache.layout_memo(("bias", mask), mx.where(allowed, 0.0, -mx.inf)[None, None, None])
        return causal
    cached = cache.layout_memo(("bias", id(mask)))
    if cached is None or cached[0] is not mask:
        bias = mx.where(mask, 0.0, -mx.inf).astype(mx.float32) if mask.dtype == mx.bool_ \
            else mask.astype(mx.float32)
        cached = (mask, bias[:, :, None] if bias.ndim == 4 else bias)
        cache.layout_memo(("bias", id(mask)), cached)
    return cached[1]


def _wants_fast_path(queries: mx.array, cache: Any, sinks: Any) -> bool:
    b, h, length, _ = queries.shape
    return (isinstance(cache, PagedLayerCache) and sinks is None
            and length <= MAX_QUERIES and b * h * length * cache.size() >= MIN_SCORES
            and queries.dtype == mx.float32 and _on_cpu())


def make_dispatch(stock: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """mlx-lm's `scaled_dot_product_attention` signature: the fast path or `stock`."""

    def scaled_dot_product_attention(queries: mx.array, keys: mx.array, values: mx.array,
                                     cache: Any, scale: float, mask: Any,
                                     sinks: Any = None) -> mx.array:
        if not _wants_fast_path(queries, cache, sinks):
            return stock(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        return attention(queries, keys, values, scale,
                         _bias(cache, mask, queries.shape[2], keys.shape[2]))

    setattr(scaled_dot_product_attention, _MARK, True)
    return scaled_dot_product_attention


def install(model: Any) -> bool:
    """Route the model module's attention (and SwiGLU) calls through the
    dispatchers above; True if its attention was routed.

    Only modules that import mlx-lm's `scaled_dot_product_attention` / `swiglu`
    by those names (llama, qwen2, qwen3, mistral, gemma, ...) are touched;
    idempotent.
    """
    module = sys.modules.get(type(model).__module__)
    if module is None:
        return False
    for name, make in (("scaled_dot_product_attention", make_dispatch),
                       ("swiglu", make_swiglu_dispatch)):
        stock = getattr(module, name, None)
        if stock is not None and not getattr(stock, _MARK, False):
            setattr(module, name, make(stock))
    return getattr(module, "scaled_dot_product_attention", None) is not None
