"""Attention of one row over its keys given as segments: views of the paged pool.

Why: the engine's pool holds a row's keys in runs of adjacent blocks
(engine/kv/reads.py); reading them where they lie, instead of gathering the
whole context every step (kv/paged.py rule 2), leaves attention as the only
cost that grows with the context. kernels.py's dispatcher sends decode and
verify rows here (kv/paged.py rule 7); CPU backend only.

Rules:
1. The scores of every segment are concatenated (they are D times smaller
   than the keys), so the softmax stays one exact pass over the row, with the
   fused exp of fastexp.py; each segment's weights then multiply its values,
   and the products add up (`mx.addmm`).
2. With side streams (split.py: the matmuls' streams, one per core), the
   columns are cut into one range per stream, the calling one included, each
   at least `SPLIT_COLUMNS` wide, and each range runs its whole chain on its
   stream: its scores (rule 1 within the range) and their max, then, against
   the row max (the ranges' maxima combined, a few numbers), its numerator,
   its sum and its weights @ values. The calling stream only adds the ranges'
   products and sums and divides. Why the whole chain: attention over a long
   context is memory-bound, and one core alone streams it at a fraction of
   what the cores together do; when only the products were cut and the
   softmax and the value products' sum ran on the calling stream, the value
   products ran one after the other (each `addmm` waited for the last) and
   a decode step at 8k tokens of context spent 103 ms in attention instead
   of 77 (30 layers of the default model's shape, its K/V out of DRAM:
   benchmarks/results/long_context-2026-12-04-nospec.txt). Every number is
   the one the unsplit call computes, but for the order in which the ranges'
   products and sums are added.
3. Rows, not columns, are what a step of several rows cuts over the
   streams: rule 2 splits no row under 2 * SPLIT_COLUMNS columns, so a
   4-client decode step at 0.5-2k tokens ran every row's attention on the
   calling stream while the other core waited; and a wide row cut by
   columns pays a join of its ranges (their maxima, products and sums) on
   every layer. When a call has at least two rows read in place, each runs
   its whole attention on one stream (`row_lanes`): widest first, each to
   the stream with the fewest columns so far, when no stream then holds
   more than BALANCE times the mean; otherwise (one long row beside short
   ones, three equal rows over two streams) the rows under 2 * SPLIT_COLUMNS
   are dealt in turn and wider rows keep rule 2's split. Measured (in one
   engine, rounds alternated, 32 tokens out, decode tok/s): 4 rows of 4k
   tokens 17.7 -> 22.2 when dealt whole, 2 rows 14.0 -> 15.1
   (benchmarks/results/long_context-2026-12-08.txt). A gathered batch (the rows
   kv/reads.py rule 1 leaves short, or a call with no plan, float or
   quantized: kv_bits) of at least two rows and 2 * SPLIT_COLUMNS key columns
   in all is cut the same way, one part of its rows per stream (kernels.py
   `batch_attention`). The rows are
   independent, so every number is the one the single-stream call makes.
   Measured (4 clients, SmolLM2, 48 tokens out, decode tok/s): in place 36.6
   -> 40.9 at 1k tokens, 29 -> 34.8 at 1.5k; gathered 27 -> 32.7 at 2k
   (benchmarks/results/long_context-2026-12-07.txt).
4. A call of few query rows per KV head (at most SKINNY_ROWS: decode and
   verify) forms its scores as (K q^T)^T, not q K^T (`scores_of`): with the
   keys as the product's first operand, OpenBLAS streams them as they lie
   instead of packing the whole (D, T) panel for a handful of rows. One core,
   30 layers of the default model's shape at 8k tokens, the score products
   alone: 15.5 ms vs 33.7; the whole one-row call over two streams: 30.5-34.2
   ms vs 37.5 (4k: 18.3 vs 21.9). The value product keeps its form (w V:
   25 ms; (V^T w^T)^T: 37.5). The scores come out transposed, as a view; each
   is the same dot product, its terms added in BLAS's other order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .fastexp import softmax_numerator

SPLIT_COLUMNS = 1024  # rule 2: the narrowest range worth a stream
SKINNY_ROWS = 32      # rule 4: query rows per KV head up to which K q^T is formed
BALANCE = 1.2         # rule 3: the heaviest lane's columns over the mean, at most


def scores_of(q: mx.array, keys: mx.array, stream: Any = None) -> mx.array:
    """q @ keys^T for (..., M, D) `q` over (..., T, D) `keys` (rule 4's form for small M)."""
    if q.shape[-2] <= SKINNY_ROWS:
        return mx.matmul(keys, q.swapaxes(-1, -2), stream=stream).swapaxes(-1, -2)
    return mx.matmul(q, keys.swapaxes(-1, -2), stream=stream)


def segment_attention(queries: mx.array, keys: Sequence[mx.array], values: Sequence[mx.array],
                      scale: float, bias: mx.array | None,
                      streams: Sequence[Any] = ()) -> mx.array:
    """softmax(q k^T * scale + bias) v for one row, (1, H, L, D) queries, over keys given
    as segments (1, Hk, n_i, D); `bias` is additive over the concatenated columns,
    (1, 1, 1, L, n), or None; `streams` the side streams of rule 2."""
    _, heads, length, dim = queries.shape
    kv_heads = keys[0].shape[1]
    group = heads // kv_heads
    q = (queries * scale).reshape(1, kv_heads, group * length, dim)
    pieces = _column_ranges(keys, values, 1 + len(streams))
    scores, at = [], 0
    for p, (ks, _) in enumerate(pieces):
        stream = _stream(streams, p)
        parts = [scores_of(q, k, stream) for k in ks]
        s = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1, stream=stream)
        width = s.shape[-1]
        if bias is not None:
            b = bias if len(pieces) == 1 else bias[..., at:at + width]
            s = mx.add(s.reshape(1, kv_heads, group, length, width), b, stream=stream).reshape(
                1, kv_heads, group * length, width)
        scores.append(s)
        at += width
    maxima = [mx.max(s, axis=-1, keepdims=True, stream=_stream(streams, p))
              for p, s in enumerate(scores)]
    row_max = maxima[0]
    for m in maxima[1:]:
        row_max = mx.maximum(row_max, m)
    products, sums = [], []
    for p, ((_, vs), s) in enumerate(zip(pieces, scores)):
        with _on(streams, p):
            weights = softmax_numerator(s, row_max)
            products.append(_weighted_values(weights, vs))
            sums.append(weights.sum(axis=-1, keepdims=True))
    out, total = products[0], sums[0]
    for product, part_sum in zip(products[1:], sums[1:]):
        out, total = out + product, total + part_sum
    out = out * mx.reciprocal(total)
    return out.reshape(1, heads, length, values[0].shape[-1])


def row_lanes(widths: Sequence[int], num_streams: int) -> list[int | None]:
    """Rule 3: for rows of `widths` columns, the stream each runs on whole (0: the calling
    one, i: side stream i - 1), or None for a row left to rule 2's split."""
    lanes: list[int | None] = [None] * len(widths)
    if not num_streams or len(widths) < 2:
        return lanes
    loads = [0] * (num_streams + 1)
    dealt: list[int | None] = [None] * len(widths)
    for i in sorted(range(len(widths)), key=lambda i: -widths[i]):  # widest first
        lane = loads.index(min(loads))                               # to the lightest lane
        dealt[i], loads[lane] = lane, loads[lane] + widths[i]
    if max(loads) * len(loads) <= BALANCE * sum(loads):
        return dealt
    narrow = [i for i, w in enumerate(widths) if w < 2 * SPLIT_COLUMNS]
    if len(narrow) > 1:
        for j, i in enumerate(narrow):
            lanes[i] = j % (num_streams + 1)
    return lanes


def _weighted_values(weights: mx.array, values: Sequence[mx.array]) -> mx.array:
    """weights @ values over one range's segments, the products added up (rule 1)."""
    if len(values) == 1:
        return mx.matmul(weights, values[0])
    product, col = None, 0
    for v in values:
        w = weights[..., col:col + v.shape[2]]
        product = mx.matmul(w, v) if product is None else mx.addmm(product, w, v)
        col += v.shape[2]
    assert product is not None
    return product


def _on(streams: Sequence[Any], part: int) -> Any:
    """The default stream for part `part`'s ops (rule 2): a side stream, or the caller's."""
    stream = _stream(streams, part)
    return mx.stream(stream) if stream is not None else contextlib.nullcontext()


def _stream(streams: Sequence[Any], part: int) -> Any:
    """Part 0 runs on the calling thread's stream, part i on streams[i - 1] (split.py rule 2)."""
    return streams[part - 1] if part else None


def _column_ranges(keys: Sequence[mx.array], values: Sequence[mx.array], num_parts: int
                   ) -> list[tuple[list[mx.array], list[mx.array]]]:
    """The segments' columns cut into up to `num_parts` ranges of about equal width (each
    at least SPLIT_COLUMNS), as views of the segments, in column order."""
    widths = [k.shape[2] for k in keys]
    total = sum(widths)
    num_parts = max(1, min(num_parts, total // SPLIT_COLUMNS))
    if num_parts == 1:
        return [(list(keys), list(values))]
    cuts = [total * i // num_parts for i in range(num_parts + 1)]
    ranges = []
    for a, b in zip(cuts, cuts[1:]):
        ks, vs, at = [], [], 0
        for k, v, width in zip(keys, values, widths):
            lo, hi = max(a, at) - at, min(b, at + width) - at
            if lo < hi:
                ks.append(k if hi - lo == width else k[:, :, lo:hi])
                vs.append(v if hi - lo == width else v[:, :, lo:hi])
            at += width
        ranges.append((ks, vs))
    return ranges
