"""Repetition, presence and frequency penalties at a cost per step that does not grow.

Why: a penalty looks at the row's last `penalty_context_size` tokens (prompt
and output). Rebuilding that window from the row's whole history every step
-- slice a Python list, convert it, `np.unique`, `np.add.at` -- costs per token
of the window on the engine thread, every step, for every penalised row: a
request asking for a window of 100,000 tokens slowed every neighbour's decode.

Rules:
1. A row's window is kept, not rebuilt: `PenaltyWindow` holds the window's
   tokens (oldest first) and a dense count per token id. It is built once from
   the prompt when the row is admitted (O(window)), and each sampled token
   moves it by one (`push`: one count up, the token that falls out one down).
2. A step needs the window's distinct ids and their counts. A window shorter
   than an eighth of the vocabulary is read from its tokens (`np.unique`, as
   before: O(window), the default window is 64); a longer one from the dense
   counts (`flatnonzero`: O(vocabulary), whatever the window's size). Either
   way the penalties are one scatter of those ids. Frequency is count x
   penalty (one rounding) where it was k additions of the penalty: the same
   to within float32 rounding.
3. A verify position (sampling.py rule 4) sees the row's window with the
   drafts before it pushed in: the row's counts copied, the oldest tokens that
   the drafts push out taken off and the drafts added (O(drafts)).
4. Ids outside the vocabulary (a prompt id past a short head) stay in the
   window but penalise nothing, as before.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from itertools import islice
from typing import Iterable, Protocol, Sequence

import mlx.core as mx
import numpy as np

from ..core.request import SamplingParams

MAX_COUNTED_ID = 1 << 24   # a larger id is no token of any vocabulary (rule 4)


@dataclass(slots=True)
class PenaltyWindow:
    """Rule 1: the last `size` tokens of a row and how often each id occurs in them."""

    size: int
    tokens: deque[int] = field(default_factory=deque)
    counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))

    @classmethod
    def of(cls, history: Sequence[int], size: int) -> "PenaltyWindow":
        window = cls(max(0, size))
        if window.size:
            tail = [int(t) for t in history[-window.size:]]
            window.tokens.extend(tail)
            ids = np.asarray([t for t in tail if 0 <= t < MAX_COUNTED_ID], np.int64)
            if len(ids):
                window.counts = np.bincount(ids).astype(np.int32)
        return window

    def push(self, token: int) -> None:
        if not self.size:
            return
        self.tokens.append(token)
        self._count(token, 1)
        if len(self.tokens) > self.size:
            self._count(self.tokens.popleft(), -1)

    def _count(self, token: int, delta: int) -> None:
        if 0 <= token < MAX_COUNTED_ID:
            if token >= len(self.counts):
                grown = np.zeros(max(token + 1, 2 * len(self.counts)), np.int32)
                grown[:len(self.counts)] = self.counts
                self.counts = grown
            self.counts[token] += delta

    def row(self, vocab: int) -> np.ndarray:
        """(vocab,) int32 counts; a view, not to be written (rule 2)."""
        if len(self.counts) < vocab:
            grown = np.zeros(vocab, np.int32)
            grown[:len(self.counts)] = self.counts
            self.counts = grown
        return self.counts[:vocab]

    def row_with(self, drafted: Sequence[int], vocab: int) -> np.ndarray:
        """Rule 3: the counts of (the newest size - len(drafted) tokens, then `drafted`)."""
        counts = self.row(vocab).copy()
        drafted = list(drafted[-self.size:]) if self.size else []
        keep = max(0, self.size - len(drafted))
        drop = len(self.tokens) - min(len(self.tokens), keep)
        _add(counts, islice(self.tokens, 0, drop), -1, vocab)
        _add(counts, drafted, 1, vocab)
        return counts


def _add(counts: np.ndarray, tokens: Iterable[int], delta: int, vocab: int) -> None:
    for token in tokens:
        if 0 <= token < vocab:
            counts[token] += delta


class Penalised(Protocol):
    """What `apply_penalties` reads of a row (sampling.py's RowSampler)."""

    params: SamplingParams
    window: PenaltyWindow | None
    drafted: list[int]


def is_penalised(params: SamplingParams) -> bool:
    return (params.repetition_penalty != 1.0 or params.presence_penalty != 0.0
            or params.frequency_penalty != 0.0)


SPARSE_FRACTION = 8   # rule 2: a window under vocab / 8 tokens is read from its tokens


def _active(r: Penalised, vocab: int) -> tuple[np.ndarray, np.ndarray]:
    """Rule 2: the distinct in-vocabulary ids of the row's window and their counts."""
    w = r.window
    if w is None or not w.size:
        return np.zeros(0, np.int64), np.zeros(0, np.int32)
    if len(w.tokens) + len(r.drafted) <= vocab // SPARSE_FRACTION:
        drafted = r.drafted[-w.size:]
        keep = max(0, w.size - len(drafted))
        start = len(w.tokens) - min(len(w.tokens), keep)
        tail = np.fromiter(islice(w.tokens, start, None), np.int64, len(w.tokens) - start)
        tokens = np.concatenate([tail, np.asarray(drafted, np.int64)])
        ids, counts = np.unique(tokens[(tokens >= 0) & (tokens < vocab)], return_counts=True)
        return ids, counts.astype(np.int32)
    dense = w.row_with(r.drafted, vocab) if r.drafted else w.row(vocab)
    ids = np.flatnonzero(dense)
    return ids, dense[ids]


def apply_penalties(logits: mx.array, rows: Sequence[Penalised]) -> mx.array:
    """Rule 2 over a batch (R, V): repetition (multiplicative, sign aware), then presence
    and frequency (additive), mlx-lm's arithmetic."""
    num_rows, vocab = logits.shape
    active = {i: _active(r, vocab) for i, r in enumerate(rows) if is_penalised(r.params)}
    if any(rows[i].params.repetition_penalty != 1.0 for i in active):
        factor = np.ones((num_rows, vocab), np.float32)
        for i, (ids, _) in active.items():
            factor[i, ids] = rows[i].params.repetition_penalty
        f = mx.array(factor)
        logits = mx.where(logits < 0, logits * f, logits / f)
    if any(rows[i].params.presence_penalty or rows[i].params.frequency_penalty for i in active):
        adjust = np.zeros((num_rows, vocab), np.float32)
        for i, (ids, counts) in active.items():
            p = rows[i].params
            adjust[i, ids] = -(counts.astype(np.float32) * np.float32(p.frequency_penalty)
                               + np.float32(p.presence_penalty))
        logits = logits + mx.array(adjust)
    return logits
