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
   `penalty_context_size` tokens (prompt + output; a window kept as tokens
   arrive, engine/penalties.py), then the RowConstraint's
   allowed mask (disallowed tokens get -inf). A request's logit_bias becomes
   one dense row of the vocabulary once (`LogitBias`), shared by its rows and
   their verify positions: a step stacks the rows' bias rows and adds them in
   one op, so its work is per row, not per bias entry (a 500,000-entry bias
   rebuilt in Python each step had halved a neighbour's decode rate; a
   scatter of the entries costs per entry, every step).
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
from .penalties import PenaltyWindow, apply_penalties, is_penalised
from .types import RowConstraint

_MASK64 = (1 << 64) - 1


@dataclass(slots=True)
class LogitBias:
    """Rule 1: one request's logit_bias as a dense row of the vocabulary, built once."""

    ids: np.ndarray       # int64 token ids
    values: np.ndarray    # float32 biases
    _row: tuple[int, mx.array] | None = None

    @classmethod
    def of(cls, bias: dict[int, float] | None) -> "LogitBias | None":
        if not bias:
            return None
        return cls(np.fromiter(bias.keys(), np.int64, len(bias)),
                   np.fromiter(bias.values(), np.float32, len(bias)))

    def row(self, vocab: int) -> mx.array:
        """(vocab,) float32: each id's bias, 0 elsewhere; ids past `vocab` are dropped."""
        if self._row is None or self._row[0] != vocab:
            dense = np.zeros(vocab, np.float32)
            keep = (self.ids >= 0) & (self.ids < vocab)
            dense[self.ids[keep]] = self.values[keep]
            self._row = (vocab, mx.array(dense))
        return self._row[1]


@dataclass(slots=True)
class RowSampler:
    """The sampling state of one row, owned by the engine thread. `bias` is derived
    from `params` when not given; rows of one request pass theirs along (rule 1).
    `history` grows through `record`, which also moves the penalty window."""

    params: SamplingParams
    seed: int
    constraint: RowConstraint | None = None
    history: list[int] = field(default_factory=list)  # prompt + outputs, for penalties
    step: int = 0
    bias: LogitBias | None = None
    drafted: list[int] = field(default_factory=list)  # a verify position's drafts before it
    window: PenaltyWindow | None = None                # penalties.py rule 1

    def __post_init__(self) -> None:
        if self.bias is None and self.params.logit_bias:
            self.bias = LogitBias.of(self.params.logit_bias)
        if self.window is None and is_penalised(self.params):
            self.window = PenaltyWindow.of(self.history, self.params.penalty_context_size)

    def record(self, token_id: int) -> None:
        """The row's next output token: into the history and the penalty window."""
        self.history.append(token_id)
        if self.window is not None:
            self.window.push(token_id)

    @property
    def needs_host_tokens(self) -> bool:
        """True when the next draw depends on the previous token's value on the host."""
        p = self.params
        return self.constraint is not None or is_penalised(p)

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
    penalised = is_penalised(p)
    # the row's history and window are shared, not copied per position: they move only
    # after the step
    return [RowSampler(p, row.seed, FixedMask(masks[j]) if c is not None else None,
                       row.history if penalised else [], row.step + j, row.bias,
                       draft[:j] if penalised else [], row.window if penalised else None)
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
    vocab = logits.shape[1]
    if any(r.bias is not None for r in rows):
        logits = _add_bias(logits, rows, vocab)
    if any(is_penalised(r.params) for r in rows):
        logits = apply_penalties(logits, rows)
    if any(r.constraint is not None for r in rows):
        # llguidance's Metal kernel on Metal; bool masks + mx.where elsewhere. Ids past
        # the tokenizer's vocabulary (a short mask) are never allowed.
        logits = apply_constraints(logits, [r.constraint for r in rows], device_masks=device_masks)
    return logits


def _add_bias(logits: mx.array, rows: Sequence[RowSampler], vocab: int) -> mx.array:
    """Rule 1: one add of every row's bias row (zeros for rows without one)."""
    zeros: mx.array | None = None
    parts: list[mx.array] = []
    for r in rows:
        if r.bias is not None:
            parts.append(r.bias.row(vocab))
        else:
            zeros = mx.zeros((vocab,), mx.float32) if zeros is None else zeros
            parts.append(zeros)
    return logits + mx.stack(parts)


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

