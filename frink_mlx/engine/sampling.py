"""Per-row sampling over one batch of logits: every row keeps its own knobs.

Why per row: continuous batching mixes requests with different temperature,
top-k/top-p/min-p, penalties, logit_bias, seeds, logprobs and grammar
constraints in one (R, V) logits matrix. The common case (every row greedy,
no extras) is one argmax over the batch; anything else is vectorised where
it can be (bias, constraint masks, penalties, logprobs) and per row where
mlx-lm's filters are per row (top-k/top-p/min-p, categorical draw).

Rules, in the order they apply (mlx-lm's order):
1. logit_bias (additive), then repetition penalty (multiplicative, sign
   aware), presence and frequency penalties over the row's last
   `penalty_context_size` tokens (prompt + output), then the RowConstraint's
   allowed mask (disallowed tokens get -inf).
2. logprobs = logits - logsumexp(logits): what `logprobs`/`top_logprobs`
   report and what the filters and the draw see.
3. Greedy rows (temperature 0) take the argmax. Sampled rows apply top-p,
   min-p, top-k (mlx-lm's own functions) and draw from logprobs/temperature
   with a key derived from (seed, step): the same seed gives the same
   tokens, independent of what else shares the batch. Rows without a seed
   get a random one at admission.
4. Verify positions (speculation, engine/speculative/): a verify row's 1 + k
   positions are each a `RowSampler` of their own (`draft_samplers`): the
   row's history and grammar advanced over the drafts before it, draw number
   `step + j`. The draw number is the row's output position, not a count of
   steps, and a draw is Gumbel-max (`mx.random.categorical`), so position j
   draws exactly the token a plain step would have drawn there. The caller
   keeps draft d(j+1) iff that draw equals it: with probability p(d), and a
   rejection yields the draw itself, distributed as the residual (p without
   d, renormalised). That is the standard speculative-sampling rule for a
   point-mass draft, so outputs follow the target distribution, and a seeded
   row gives the same tokens with speculation on or off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from ..core.request import SamplingParams
from .constraints import apply_constraints
from .types import RowConstraint

_MASK64 = (1 << 64) - 1


@dataclass(slots=True)
class RowSampler:
    """The sampling state of one row, owned by the engine thread."""

    params: SamplingParams
    seed: int
    constraint: RowConstraint | None = None
    history: list[int] = field(default_factory=list)  # prompt + outputs, for penalties
    step: int = 0

    @property
    def needs_host_tokens(self) -> bool:
        """True when the next draw depends on the previous token's value on the host."""
        p = self.params
        return (
            self.constraint is not None
            or p.repetition_penalty != 1.0
            or p.presence_penalty != 0.0
            or p.frequency_penalty != 0.0
        )

    @property
    def is_plain_greedy(self) -> bool:
        p = self.params
        return p.greedy and not p.logit_bias and not p.logprobs and not self.needs_host_tokens


@dataclass(slots=True)
class SampleOutput:
    """Lazy arrays; the engine evaluates them together with the step."""

    tokens: mx.array                    # (R,) int32
    logprobs: mx.array | None = None    # (R,) chosen token's logprob
    top_ids: mx.array | None = None     # (R, k)
    top_logprobs: mx.array | None = None

    def arrays(self) -> list[mx.array]:
        return [a for a in (self.tokens, self.logprobs, self.top_ids, self.top_logprobs) if a is not None]


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def step_key(seed: int, step: int) -> mx.array:
    """The PRNG key of draw number `step` of a row seeded with `seed` (rule 3)."""
    return mx.random.key(splitmix64(splitmix64(seed & _MASK64) ^ step) >> 1)


@dataclass(slots=True)
class FixedMask:
    """A verify position's grammar mask, computed ahead (constraints.py rule 6)."""

    mask: np.ndarray | None
    error: str | None = None

    def allowed_mask(self) -> np.ndarray | None:
        return self.mask

    def accept(self, token_id: int) -> bool:
        return True

    def is_done(self) -> bool:
        return False


def draft_samplers(row: RowSampler, draft: list[int]) -> list[RowSampler]:
    """The samplers of a verify row's 1 + len(draft) positions (rule 4). The row's own
    draw number moves on by the tokens it keeps (`advance`), once they are known."""
    c = row.constraint
    along = getattr(c, "masks_along", None)
    masks = along(draft) if along is not None else [None] * (len(draft) + 1)
    p = row.params
    penalised = p.repetition_penalty != 1.0 or p.presence_penalty != 0.0 \
        or p.frequency_penalty != 0.0
    return [RowSampler(p, row.seed, FixedMask(masks[j]) if c is not None else None,
                       row.history + draft[:j] if penalised else [], row.step + j)
            for j in range(len(draft) + 1)]


def sample(logits: mx.array, rows: Sequence[RowSampler], *,
           device_masks: bool = False) -> SampleOutput:
    """Pick one token per row of `logits` (R, V); advances each row's step.
    `device_masks`: grammar masks on the device (constraints.py rule 5)."""
    if len(rows) != logits.shape[0]:
        raise ValueError(f"{logits.shape[0]} logits rows but {len(rows)} samplers")
    if all(r.is_plain_greedy for r in rows):
        for r in rows:
            r.step += 1
        return SampleOutput(mx.argmax(logits, axis=-1).astype(mx.int32))
    logits = _process(logits.astype(mx.float32), rows, device_masks)
    logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
    tokens = _draw(logprobs, rows)
    out = SampleOutput(tokens)
    if any(r.params.logprobs for r in rows):
        out.logprobs = mx.take_along_axis(logprobs, tokens[:, None], axis=-1)[:, 0]
        k = max(r.params.top_logprobs for r in rows)
        if k > 0:
            k = min(k, logprobs.shape[-1])
            top = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
            vals = mx.take_along_axis(logprobs, top, axis=-1)
            order = mx.argsort(-vals, axis=-1)
            out.top_ids = mx.take_along_axis(top, order, axis=-1).astype(mx.int32)
            out.top_logprobs = mx.take_along_axis(vals, order, axis=-1)
    return out


def _process(logits: mx.array, rows: Sequence[RowSampler], device_masks: bool) -> mx.array:
    """Rule 1: bias, penalties and constraint masks, batched on the host where cheap."""
    num_rows, vocab = logits.shape
    bias = [(i, tok, val) for i, r in enumerate(rows)
            for tok, val in (r.params.logit_bias or {}).items() if 0 <= tok < vocab]
    if bias:
        rows_idx, toks, vals = zip(*bias)
        logits = logits.at[mx.array(rows_idx), mx.array(toks)].add(mx.array(vals, mx.float32))
    if any(r.params.repetition_penalty != 1.0 for r in rows):
        factor = np.ones((num_rows, vocab), np.float32)
        for i, r in enumerate(rows):
            if r.params.repetition_penalty != 1.0:
                factor[i, _recent(r, vocab)] = r.params.repetition_penalty
        f = mx.array(factor)
        logits = mx.where(logits < 0, logits * f, logits / f)
    if any(r.params.presence_penalty or r.params.frequency_penalty for r in rows):
        adjust = np.zeros((num_rows, vocab), np.float32)
        for i, r in enumerate(rows):
            recent = _recent(r, vocab)
            if r.params.frequency_penalty:
                np.add.at(adjust[i], recent, -r.params.frequency_penalty)
            if r.params.presence_penalty:
                adjust[i, np.unique(recent)] -= r.params.presence_penalty
        logits = logits + mx.array(adjust)
    if any(r.constraint is not None for r in rows):
        # llguidance's Metal kernel on Metal; bool masks + mx.where elsewhere. Ids past
        # the tokenizer's vocabulary (a short mask) are never allowed.
        logits = apply_constraints(logits, [r.constraint for r in rows], device_masks=device_masks)
    return logits


def _recent(r: RowSampler, vocab: int) -> np.ndarray:
    ctx = max(0, r.params.penalty_context_size)
    recent = np.asarray(r.history[-ctx:] if ctx else [], dtype=np.int64)
    return recent[(recent >= 0) & (recent < vocab)]


def _draw(logprobs: mx.array, rows: Sequence[RowSampler]) -> mx.array:
    """Rule 3: argmax for greedy rows, a seeded draw for the others."""
    greedy = mx.argmax(logprobs, axis=-1).astype(mx.int32)
    sampled_rows = [i for i, r in enumerate(rows) if not r.params.greedy]
    picks: dict[int, mx.array] = {}
    for i in sampled_rows:
        r = rows[i]
        p = r.params
        lp = logprobs[i:i + 1]
        if 0.0 < p.top_p < 1.0:
            lp = apply_top_p(lp, p.top_p)
        if p.min_p > 0.0:
            lp = apply_min_p(lp, p.min_p)
        if 0 < p.top_k < lp.shape[-1]:
            lp = apply_top_k(lp, p.top_k)
        picks[i] = mx.random.categorical(lp * (1.0 / p.temperature), key=step_key(r.seed, r.step))
    for r in rows:
        r.step += 1
    if not picks:
        return greedy
    parts = [picks[i].astype(mx.int32).reshape(1) if i in picks else greedy[i:i + 1]
             for i in range(len(rows))]
    return mx.concatenate(parts)

