"""Attention and SwiGLU for the engine's forward on MLX's CPU backend (RoPE: rope.py).

Why: on MLX's Linux CPU backend `mx.exp` is scalar, ~25 ns per element
(numpy's vectorised exp: ~0.5 ns); `mx.fast.scaled_dot_product_attention`,
`mx.fast.rope` and mlx-lm's `swiglu` have no CPU kernels, so they run as
chains of small ops, each one pass over memory, with exp (softmax, sigmoid)
and cos/sin (RoPE angles, rebuilt by every call) the slowest. What `mx.compile`
*can* do on the CPU is fuse a chain of elementwise ops into one generated C++
loop (it JIT-compiles with the system compiler; `shapeless=True` keeps one
kernel for every shape). So each piece below is written as multiplies, adds
and selects that fuse, with no transcendental in the loop:

exp of t <= 0 (softmax after subtracting the row max; silu's e^-|g|): a
    polynomial and five squarings, exactly 0 below -24 (fastexp.py). Masks are
    additive `MASKED` (-1e9, finite) instead of -inf (fastexp.py says why).
Attention = one (group*L, D) x (D, T) matmul per KV head (GQA without
    repeating K/V), + bias, row max, the fused exp, row sum, weights @ V,
    scaled by 1/sum; the score matrix is made in query chunks of at most
    2^18 numbers so those passes stay in cache. Outputs match stock SDPA to
    ~1e-6 relative.
Quantized K/V (kv_bits: a cache with `bits` hands out (packed, scales, biases)
    triples, kv/quantized.py rule 2): the same attention with the two products
    as `mx.quantized_matmul`s, as mlx-lm's quantized SDPA has them, but with the
    fused exp instead of `mx.softmax`; never read in place. The dispatcher names
    the stock function as `__wrapped__` (kv/quantized.py `reads_quantized`).
Attention where the keys lie (kv/paged.py rule 7, kv/reads.py): a call of at
    most DIRECT_MAX_QUERIES queries a row (decode and verify rows) reads each
    row of at least DIRECT_MIN_TOKENS positions as slices of the pool (its
    runs of adjacent blocks) instead of kv/paged.py rule 2's gather, which copied the
    whole context every step: one score matmul per segment, the scores (D
    times smaller than the keys) concatenated so the softmax stays one exact
    pass, then each segment's weights times its values, summed, the products
    cut over the matmuls' streams (segments.py). Rows the plan reads together
    over the blocks they share (kv/reads.py rule 5) are one such call, their
    queries stacked row after row, the output cut back into rows. The call's
    shorter rows are batched over a gather only as wide as they are. Several
    rows too short for a split of their columns are dealt over the streams
    instead, a row (or, gathered, a part of the batch) per stream
    (segments.py rule 3).
SwiGLU = silu(g) * x = (g + |g| (1 - e) / (1 + e)) / 2 * x, e = e^-|g|
    (g/(1+e) for g >= 0 and g e/(1+e) below, with no select); ~3e-6
    absolute error at |g| ~ 10 (stock: 1.4e-6 against float64).
RoPE: rope.py, the same way (its tables built once per forward).

Measured figures, stock vs these kernels: benchmarks/results/cpu_backend-measurements.md.
`mx.compile` fuses at most ~11 nodes deep and, shapeless, each constant
adds broadcast nodes, so SwiGLU still runs as ~6 vectorised loops.

Scope, so that stock numerics stay everywhere else, and mlx-lm stays untouched:
- installed only by the CPU backend (cpu/backend.py), into the one model
  instance it prepares: `install` gives each layer whose class's `__call__`
  calls mlx-lm's `scaled_dot_product_attention` or `swiglu` by name (llama,
  qwen2, qwen3, mistral, gemma, ...: `from .base import ...`) a subclass whose
  `__call__` is the same code run over a copy of its module's globals in which
  those two names are our dispatchers. The mlx-lm module itself, and every
  other model of the same family, keep the stock functions (no module
  attribute is ever replaced: tests/backend/test_seam.py);
- attention: only `PagedLayerCache`-shaped calls (the engine's forward; the
  cache is recognised by its `layout_memo`, so this module does not import
  the engine), float32, no attention sinks, CPU device, at least
  `MIN_SCORES` scores (below it the fixed cost of the extra ops loses: one
  decode row over 64 keys 0.11 ms stock vs 0.21), the same cache-type
  dispatch mlx-lm itself uses for quantized caches;
- SwiGLU and RoPE carry no cache to dispatch on, so the runner marks its own
  forward calls (rope.py's `engine_forward`, a thread-local flag: the same
  model may also run on another thread, e.g. pooling its own hidden states
  for embeddings) and only those, on CPU float32, take these paths; RoPE's
  own limits are rope.py's.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import mlx.core as mx
import mlx.nn as nn

from .fastexp import exp_nonpositive, softmax_numerator
from .rope import RoPEDispatch, in_engine_forward
from .segments import SPLIT_COLUMNS, row_lanes, scores_of, segment_attention
from .split import on_cpu, side_streams

_MARK = "_frink_cpu_kernel"
_SCORES_PER_CHUNK = 1 << 18
MIN_SCORES = 1 << 12
MASKED = -1e9  # additive mask: finite, see the module docstring
# Reads where the keys lie (kv/paged.py rule 7, kv/reads.py rules 1-2): rows of at
# least DIRECT_MIN_TOKENS, calls of at most DIRECT_MAX_QUERIES queries per row (decode
# and verify rows), up to DIRECT_MAX_RUNS slices of at least DIRECT_MIN_RUN_BLOCKS blocks.
# DIRECT_MIN_TOKENS is where the in-place read starts to beat the gathered batch cut over
# the streams (segments.py rule 3), in the engine: 4 decode rows of 3000 tokens read 0.95x
# the gathered rate in place, of 4000 1.09x; one row is even from 2k to 4k (2026-12-07
# figures in benchmarks/results/long_context-2026-12-07.txt). Below it a row's extra
# segments (its decode blocks, interleaved with other rows', are a gathered rest), its
# mask and its own calls cost more than the copy they save.
DIRECT_MIN_TOKENS = 3584
DIRECT_MAX_QUERIES = 32
DIRECT_MAX_RUNS = 8
DIRECT_MIN_RUN_BLOCKS = 16


@partial(mx.compile, shapeless=True)
def swiglu(gate: mx.array, x: mx.array) -> mx.array:
    """silu(gate) * x without `mx.exp`, one fused loop (see the module docstring)."""
    a = mx.abs(gate)
    e = exp_nonpositive(-a)
    return 0.5 * (gate + a * (1.0 - e) / (1.0 + e)) * x


# K or V as one array, or as quantized (packed, scales, biases) triples (kv/quantized.py)
KV = Any
Quant = tuple[int, int]  # (group_size, bits) of quantized K/V


def attention(queries: mx.array, keys: KV, values: KV, scale: float,
              bias: mx.array | None, quant: Quant | None = None) -> mx.array:
    """softmax(q k^T * scale + bias) v for (B, H, L, D) queries over (B, Hk, T, D) keys
    (with `quant`, quantized triples: the products are `mx.quantized_matmul`s).

    `bias` is finite: masked positions carry `MASKED`, never -inf (module docstring).

    The score matrix is made in query chunks of at most `_SCORES_PER_CHUNK`
    numbers, so each chunk's passes (bias, max, exp, sum) stay in cache.
    """
    batch, heads, length, _ = queries.shape
    width = (keys[0] if quant else keys).shape[2]
    rows = max(1, _SCORES_PER_CHUNK // max(1, batch * heads * width))
    if length <= rows:
        return _attention(queries, keys, values, scale, bias, quant)
    parts = [_attention(queries[:, :, i:i + rows], keys, values, scale,
                        None if bias is None else bias[..., i:i + rows, :], quant)
             for i in range(0, length, rows)]
    return mx.concatenate(parts, axis=2)


def _attention(queries: mx.array, keys: KV, values: KV, scale: float,
               bias: mx.array | None, quant: Quant | None) -> mx.array:
    """One chunk. GQA without repeating K/V: the r = H / Hk query heads of one KV
    head are stacked along L, so each product is one (r*L, D) x (D, T) matmul per
    KV head. `bias` is additive, (B, 1, 1, L, T) or None; normalising after the
    value product divides (r*L, D) numbers instead of (r*L, T)."""
    batch, heads, length, dim = queries.shape
    kv_heads, width = (keys[0] if quant else keys).shape[1:3]
    group = heads // kv_heads
    q = (queries * scale).reshape(batch, kv_heads, group * length, dim)
    if quant:
        packed, scales, biases = keys
        scores = mx.quantized_matmul(q, packed, scales, biases, transpose=True,
                                     group_size=quant[0], bits=quant[1])
    else:
        scores = scores_of(q, keys)  # segments.py rule 4
    if bias is not None:
        scores = (scores.reshape(batch, kv_heads, group, length, width) + bias).reshape(
            batch, kv_heads, group * length, width)
    weights = softmax_numerator(scores, scores.max(axis=-1, keepdims=True))
    if quant:
        packed, scales, biases = values
        product = mx.quantized_matmul(weights, packed, scales, biases, transpose=False,
                                      group_size=quant[0], bits=quant[1])
    else:
        product = weights @ values
    out = product * mx.reciprocal(weights.sum(axis=-1, keepdims=True))
    return out.reshape(batch, heads, length, out.shape[-1])


def make_swiglu_dispatch(stock: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """mlx-lm's `swiglu(gate, x)`: ours inside `engine_forward` on CPU float32, else stock."""

    def dispatching_swiglu(gate: mx.array, x: mx.array) -> mx.array:
        if in_engine_forward() and gate.dtype == mx.float32 and on_cpu():
            return swiglu(gate, x)
        return stock(gate, x)

    setattr(dispatching_swiglu, _MARK, True)
    return dispatching_swiglu


def _bias(cache: Any, mask: Any, length: int, width: int) -> mx.array | None:
    """The additive form of the mask mlx-lm passed (None, "causal" or a bool array)."""
    if mask is None:
        return None
    if isinstance(mask, str):  # "causal": one row starting at position 0
        causal = cache.layout_memo(("bias", mask))
        if causal is None:
            q_pos = mx.arange(length)[:, None] + (width - length)
            allowed = mx.arange(width)[None, :] <= q_pos
            causal = cache.layout_memo(("bias", mask), mx.where(allowed, 0.0, MASKED)[None, None, None])
        return causal
    cached = cache.layout_memo(("bias", id(mask)))
    if cached is None or cached[0] is not mask:
        bias = mx.where(mask, 0.0, MASKED).astype(mx.float32) if mask.dtype == mx.bool_ \
            else mx.maximum(mask.astype(mx.float32), MASKED)
        cached = (mask, bias[:, :, None] if bias.ndim == 4 else bias)
        cache.layout_memo(("bias", id(mask)), cached)
    return cached[1]


def _wants_fast_path(queries: mx.array, cache: Any, sinks: Any) -> bool:
    b, h, length, _ = queries.shape
    return (getattr(type(cache), "layout_memo", None) is not None and sinks is None
            and b * h * length * cache.size() >= MIN_SCORES
            and queries.dtype == mx.float32 and on_cpu())


def batch_attention(queries: mx.array, keys: KV, values: KV, scale: float,
                    bias: mx.array | None, streams: Sequence[Any],
                    quant: Quant | None = None) -> mx.array:
    """`attention` over a gathered batch (float, or quantized triples with `quant`), its
    rows cut into one part per stream when the batch is wide enough (segments.py rule 3:
    at least 2 * SPLIT_COLUMNS key columns in all and two rows): each part's whole
    attention on its own stream, the parts joined."""
    batch, width = queries.shape[0], (keys[0] if quant else keys).shape[2]
    parts = min(batch, 1 + len(streams))
    if parts < 2 or batch * width < 2 * SPLIT_COLUMNS:
        return attention(queries, keys, values, scale, bias, quant)
    cuts = [batch * i // parts for i in range(parts + 1)]
    outs = []
    for p, (a, b) in enumerate(zip(cuts, cuts[1:])):
        with mx.stream(streams[p - 1]) if p else contextlib.nullcontext():
            part_bias = None if bias is None else bias if bias.shape[0] == 1 else bias[a:b]
            outs.append(attention(queries[a:b], _rows(keys, a, b, quant), _rows(values, a, b, quant),
                                  scale, part_bias, quant))
    return mx.concatenate(outs, axis=0)


def _rows(kv: KV, a: int, b: int, quant: Quant | None) -> KV:
    """Rows a..b of K or V (of each part of a quantized triple)."""
    return tuple(x[a:b] for x in kv) if quant else kv[a:b]


def paged_attention(queries: mx.array, read: Any, scale: float) -> mx.array:
    """Attention over a `LayerRead` (kv/reads.py): each long row over its segments, the
    short rows batched over their own gather; rows come back in batch order."""
    batch = queries.shape[0]
    outs: list[mx.array | None] = [None] * batch
    streams = side_streams()
    if read.batched:
        rows = read.batched
        q = queries if len(rows) == batch else queries[mx.array(rows, dtype=mx.int32)]
        out = batch_attention(q, read.batched_keys, read.batched_values, scale,
                              read.batched_bias, streams)
        for j, r in enumerate(rows):
            outs[r] = out[j:j + 1]
    length = queries.shape[2]
    lanes = row_lanes([sum(k.shape[2] for k in seg.keys) for seg in read.direct], len(streams))
    for seg, lane in zip(read.direct, lanes):  # kv/reads.py rule 5: queries stacked
        with mx.stream(streams[lane - 1]) if lane else contextlib.nullcontext():
            q = mx.concatenate([queries[r:r + 1] for r in seg.rows], axis=2) \
                if len(seg.rows) > 1 else queries[seg.rows[0]:seg.rows[0] + 1]
            out = segment_attention(q, seg.keys, seg.values, scale, seg.bias,
                                    () if lane is not None else streams)
        for i, r in enumerate(seg.rows):
            outs[r] = out if len(seg.rows) == 1 else out[:, :, i * length:(i + 1) * length]
    if batch == 1:
        return outs[0]  # type: ignore[return-value]
    return mx.concatenate(outs, axis=0)  # type: ignore[arg-type]


def _read_in_place(queries: mx.array, keys: mx.array, values: mx.array, cache: Any,
                   mask: Any) -> Any:
    """The cache's read of the keys where they lie (paged.py rule 7), or None."""
    reader = getattr(cache, "read_in_place", None)
    if reader is None or queries.shape[2] > DIRECT_MAX_QUERIES:
        return None
    return reader(keys, values, mask, min_tokens=DIRECT_MIN_TOKENS, max_runs=DIRECT_MAX_RUNS,
                  min_run_blocks=DIRECT_MIN_RUN_BLOCKS, masked=MASKED)


def make_dispatch(stock: Callable[..., mx.array]) -> Callable[..., mx.array]:
    """mlx-lm's `scaled_dot_product_attention` signature: the fast path or `stock`."""

    def scaled_dot_product_attention(queries: mx.array, keys: mx.array, values: mx.array,
                                     cache: Any, scale: float, mask: Any,
                                     sinks: Any = None) -> mx.array:
        if not _wants_fast_path(queries, cache, sinks):
            return stock(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)
        if hasattr(cache, "bits"):  # quantized triples (kv/quantized.py rule 2)
            bias = _bias(cache, mask, queries.shape[2], keys[0].shape[2])
            return batch_attention(queries, keys, values, scale, bias, side_streams(),
                                   (cache.group_size, cache.bits))
        read = _read_in_place(queries, keys, values, cache, mask)
        if read is not None:
            return paged_attention(queries, read, scale)
        return batch_attention(queries, keys, values, scale,
                               _bias(cache, mask, queries.shape[2], keys.shape[2]), side_streams())

    setattr(scaled_dot_product_attention, _MARK, True)
    scaled_dot_product_attention.__wrapped__ = stock  # type: ignore[attr-defined]
    return scaled_dot_product_attention


_DISPATCHERS: dict[str, Callable[[Callable[..., mx.array]], Callable[..., mx.array]]] = {
    "scaled_dot_product_attention": make_dispatch, "swiglu": make_swiglu_dispatch}


def install(model: Any) -> bool:
    """Route this model's RoPE, attention and SwiGLU calls through the dispatchers
    above (module docstring, "Scope"); True if its attention was routed.

    Touches the model instance only, never a module; idempotent.
    """
    for layer in getattr(model, "layers", None) or []:
        attn = getattr(layer, "self_attn", None)
        if attn is not None and type(getattr(attn, "rope", None)) is nn.RoPE:
            attn.rope = RoPEDispatch(attn.rope)
    named = getattr(model, "named_modules", None)
    if named is None:
        return False
    rebound: dict[type, type | None] = {}
    routed = False
    for _, module in named():
        cls = type(module)
        if _MARK not in cls.__dict__:  # not rebound yet
            if cls not in rebound:
                rebound[cls] = _rebound_class(cls)
            sub = rebound[cls]
            if sub is None:
                continue
            module.__class__ = cls = sub
        routed = routed or "scaled_dot_product_attention" in cls.__dict__[_MARK]
    return routed


def _rebound_class(cls: type) -> type | None:
    """A subclass of `cls` whose `__call__` sees our dispatchers under the
    kernel names its code calls; None when it calls none of them."""
    call = next((vars(k)["__call__"] for k in cls.__mro__ if "__call__" in vars(k)), None)
    if not isinstance(call, types.FunctionType):
        return None
    names = [n for n in _DISPATCHERS if n in call.__code__.co_names and n in call.__globals__]
    if not names:
        return None
    scope = dict(call.__globals__)
    for name in names:
        scope[name] = _DISPATCHERS[name](call.__globals__[name])
    rebound = types.FunctionType(call.__code__, scope, call.__name__, call.__defaults__,
                                 call.__closure__)
    rebound.__kwdefaults__ = call.__kwdefaults__
    rebound.__qualname__, rebound.__doc__ = call.__qualname__, call.__doc__
    return type(cls.__name__, (cls,), {"__call__": rebound, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__, _MARK: tuple(names)})
