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
   at least `SPLIT_COLUMNS` wide, and each range's products (scores and
   weights @ values) run on its stream: attention over a long context is
   memory-bound, and one core alone streams it at a fraction of what the
   cores together do. The elementwise passes stay on the calling stream.
   Every number is the one the unsplit call computes, but for the order in
   which the ranges' products are added.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .fastexp import softmax_numerator

SPLIT_COLUMNS = 1024  # rule 2: the narrowest range worth a stream


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
    parts = [mx.matmul(q, k.swapaxes(-1, -2), stream=_stream(streams, p))
             for p, (ks, _) in enumerate(pieces) for k in ks]
    scores = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=-1)
    if bias is not None:
        width = scores.shape[-1]
        scores = (scores.reshape(1, kv_heads, group, length, width) + bias).reshape(
            1, kv_heads, group * length, width)
    weights = softmax_numerator(scores, scores.max(axis=-1, keepdims=True))
    out, at = None, 0
    for p, (_, vs) in enumerate(pieces):
        stream = _stream(streams, p)
        for v in vs:
            w = weights if len(parts) == 1 else weights[..., at:at + v.shape[2]]
            out = mx.matmul(w, v, stream=stream) if out is None else mx.addmm(out, w, v, stream=stream)
            at += v.shape[2]
    out = out * mx.reciprocal(weights.sum(axis=-1, keepdims=True))  # type: ignore[operator]
    return out.reshape(1, heads, length, values[0].shape[-1])


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
