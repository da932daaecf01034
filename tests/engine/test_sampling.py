"""Per-row sampling: greedy fast path, filters, penalties, masks, seeds, logprobs."""

from __future__ import annotations

import math

import mlx.core as mx
import numpy as np

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.sampling import LogitBias, RowSampler, draft_samplers, sample, step_key

LOGITS = mx.array([[0.0, 2.0, 1.0, -1.0, 0.5], [3.0, 0.0, 0.0, 0.0, 2.9]])


def _rows(*params, history=None):
    return [RowSampler(p, seed=7, history=list(history or [])) for p in params]


def test_greedy_rows_take_the_argmax():
    out = sample(LOGITS, _rows(SamplingParams(temperature=0), SamplingParams(temperature=0)))
    assert out.tokens.tolist() == [1, 0] and out.logprobs is None


def test_top_k_one_is_greedy_even_when_hot():
    hot = SamplingParams(temperature=5.0, top_k=1)
    for _ in range(5):
        assert sample(LOGITS, _rows(hot, hot)).tokens.tolist() == [1, 0]


def test_min_p_and_top_p_cut_the_tail():
    params = SamplingParams(temperature=1.0, min_p=0.9)
    seen = {tuple(sample(LOGITS, _rows(params, params)).tokens.tolist()) for _ in range(20)}
    assert all(a == 1 and b in (0, 4) for a, b in seen)
    params = SamplingParams(temperature=1.0, top_p=0.5)
    assert all(sample(LOGITS, _rows(params, params)).tokens.tolist()[0] == 1 for _ in range(10))


def test_same_seed_and_step_same_draw():
    hot = SamplingParams(temperature=1.5)
    rows = [RowSampler(hot, seed=3), RowSampler(hot, seed=3), RowSampler(hot, seed=4)]
    draws = [sample(LOGITS[:1], [rows[0]]).tokens.item() for _ in range(16)]
    again = [sample(LOGITS[:1], [rows[1]]).tokens.item() for _ in range(16)]
    other = [sample(LOGITS[:1], [rows[2]]).tokens.item() for _ in range(16)]
    assert draws == again and draws != other
    assert not mx.array_equal(step_key(3, 0), step_key(3, 1))


def test_penalties_follow_mlx_lm_arithmetic():
    p = SamplingParams(temperature=0, repetition_penalty=2.0, logprobs=True)
    out = sample(LOGITS[:1], _rows(p, history=[1, 3]))
    # token 1: 2.0 / 2 = 1.0 -> ties token 2 (1.0); argmax keeps the first: 1
    want = np.array([0.0, 1.0, 1.0, -2.0, 0.5])
    lse = math.log(np.exp(want).sum())
    assert out.tokens.tolist() == [1]
    assert abs(out.logprobs.item() - (1.0 - lse)) < 1e-5
    p = SamplingParams(temperature=0, frequency_penalty=1.0, presence_penalty=0.5)
    assert sample(LOGITS[:1], _rows(p, history=[1, 1])).tokens.tolist() == [2]  # 2 - 2 - 0.5 < 1


class _Mask:
    def __init__(self, allowed):
        self.allowed = allowed

    def allowed_mask(self):
        return self.allowed

    def accept(self, token_id):
        return True

    def is_done(self):
        return False

    error = None


def test_constraint_masks_apply_per_row_and_short_masks_forbid_the_rest():
    rows = _rows(SamplingParams(temperature=0), SamplingParams(temperature=0))
    rows[0].constraint = _Mask(np.array([True, False, False]))  # shorter than the logits
    assert sample(LOGITS, rows).tokens.tolist() == [0, 0]
    rows[1].constraint = _Mask(np.array([False, False, False, False, True]))
    assert sample(LOGITS, rows).tokens.tolist() == [0, 4]


def test_logit_bias_and_top_logprobs():
    p = SamplingParams(temperature=0, logit_bias={3: 10.0}, logprobs=True, top_logprobs=2)
    out = sample(LOGITS, _rows(p, SamplingParams(temperature=0)))
    assert out.tokens.tolist() == [3, 0]
    assert out.top_ids.tolist()[0] == [3, 1]
    top = out.top_logprobs.tolist()[0]
    assert top[0] >= top[1] and abs(top[0] - out.logprobs.tolist()[0]) < 1e-6


def test_logit_bias_is_one_pair_of_arrays_per_request_shared_by_rows_and_positions():
    """Rule 1: built once, one row per vocabulary; ids past the vocabulary skipped."""
    p = SamplingParams(temperature=0, logit_bias={4: 50.0, 2: -5.0, 10_000: 9.0})
    bias = LogitBias.of(p.logit_bias)
    rows = [RowSampler(p, seed=1, bias=bias), RowSampler(p, seed=2, bias=bias)]
    assert sample(LOGITS, rows).tokens.tolist() == [4, 4]
    first = bias.row(5)
    assert first.tolist() == [0.0, 0.0, -5.0, 0.0, 50.0]
    assert bias.row(5) is first   # not rebuilt per step
    positions = draft_samplers(rows[0], [1, 2])
    assert all(pos.bias is bias for pos in positions)
    assert LogitBias.of({10_000: 1.0}).row(5).tolist() == [0.0] * 5


def test_a_row_built_without_its_bias_derives_it():
    row = RowSampler(SamplingParams(temperature=0, logit_bias={3: 10.0}), seed=0)
    assert row.bias is not None and sample(LOGITS[:1], [row]).tokens.tolist() == [3]


def test_verify_positions_see_the_drafts_before_them_in_their_penalty_window():
    p = SamplingParams(temperature=0, presence_penalty=2.0, penalty_context_size=3)
    row = RowSampler(p, seed=0, history=[0, 1, 2])
    positions = draft_samplers(row, [4, 1])
    assert all(pos.history is row.history for pos in positions)   # shared, not copied
    # logits [3, 0, 0, 0, 2.9]; windows [0, 1, 2], [1, 2, 4], [2, 4, 1]: only the first
    # penalises token 0 (then 4 wins); a window of history + drafts would penalise it in all
    out = sample(mx.repeat(LOGITS[1:2], 3, axis=0), positions)
    assert out.tokens.tolist() == [4, 0, 0]
