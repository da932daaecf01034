"""engine/penalties.py: the window kept as tokens arrive equals the one rebuilt each step,
and a step's cost does not grow with the window."""

from __future__ import annotations

import random
import time

import mlx.core as mx
import numpy as np

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.penalties import PenaltyWindow
from frink_mlx.engine.sampling import RowSampler, draft_samplers, sample


def _rebuilt(history: list[int], drafted: list[int], size: int, vocab: int) -> np.ndarray:
    """The window as the engine once rebuilt it every step (the reference)."""
    drafted = drafted[-size:] if size else []
    room = size - len(drafted)
    tail = (history[-room:] if room > 0 else []) + drafted
    ids = np.asarray([t for t in tail if 0 <= t < vocab], np.int64)
    return np.bincount(ids, minlength=vocab)[:vocab].astype(np.int32)


def test_the_kept_window_equals_the_rebuilt_one_at_every_step_and_verify_position():
    rng = random.Random(5)
    vocab = 50
    for size in (0, 1, 3, 16, 200):
        history = [rng.randrange(-2, vocab + 10) for _ in range(40)]  # ids outside too
        window = PenaltyWindow.of(history, size)
        for _ in range(120):
            token = rng.randrange(vocab)
            history.append(token)
            window.push(token)
            assert np.array_equal(window.row(vocab), _rebuilt(history, [], size, vocab))
            drafted = [rng.randrange(vocab) for _ in range(rng.randrange(0, 6))]
            assert np.array_equal(window.row_with(drafted, vocab),
                                  _rebuilt(history, drafted, size, vocab))


def _logits(rows: int, vocab: int) -> mx.array:
    return mx.array(np.random.default_rng(0).standard_normal((rows, vocab)).astype(np.float32))


def test_sampling_with_penalties_equals_the_rebuilt_arithmetic():
    vocab, size = 64, 12
    p = SamplingParams(temperature=0, repetition_penalty=1.7, presence_penalty=0.5,
                       frequency_penalty=0.25, penalty_context_size=size, logprobs=True)
    rng = random.Random(1)
    history = [rng.randrange(vocab) for _ in range(30)]
    row = RowSampler(p, seed=0, history=list(history))
    logits = _logits(1, vocab)
    for _ in range(20):
        counts = _rebuilt(row.history, [], size, vocab)
        want = np.array(logits[0])
        seen = counts > 0
        want = np.where(seen & (want < 0), want * 1.7, np.where(seen, want / 1.7, want))
        want = want - 0.25 * counts - 0.5 * seen
        out = sample(logits, [row])
        assert out.tokens.item() == int(np.argmax(want))
        lse = np.log(np.exp(want.astype(np.float64)).sum())
        assert abs(out.logprobs.item() - (want.max() - lse)) < 1e-4
        row.record(out.tokens.item())


def test_verify_positions_share_the_rows_window_and_see_their_drafts():
    p = SamplingParams(temperature=0, presence_penalty=2.0, penalty_context_size=3)
    row = RowSampler(p, seed=0, history=[0, 1, 2])
    positions = draft_samplers(row, [4, 1])
    assert all(pos.window is row.window for pos in positions)
    out = sample(mx.array([[3.0, 0.0, 0.0, 0.0, 2.9]] * 3), positions)
    assert out.tokens.tolist() == [4, 0, 0]


def _step_s(history_len: int, size: int) -> float:
    vocab = 32_000
    p = SamplingParams(temperature=0, repetition_penalty=1.1, frequency_penalty=0.3,
                       presence_penalty=0.2, penalty_context_size=size)
    rows = [RowSampler(p, seed=i, history=list(range(history_len))) for i in range(4)]
    logits = _logits(4, vocab)
    mx.eval(sample(logits, rows).tokens)
    started = time.perf_counter()
    for step in range(20):
        out = sample(logits, rows)
        mx.eval(out.tokens)
        for r in rows:
            r.record(step)
    return (time.perf_counter() - started) / 20


def test_a_step_costs_the_same_whatever_the_window():
    """Rule 2: a 100,000-token window costs per step what a 64-token one does (it was
    rebuilt from the history every step: ~10x slower at this size)."""
    small = min(_step_s(100_000, 64) for _ in range(2))
    large = min(_step_s(100_000, 100_000) for _ in range(2))
    assert large < 2.0 * small + 0.002, (small, large)
