"""Speculative decoding policy: prompt-lookup drafts, per-row acceptance, step cost.

Why: editors and coding agents mostly ask for text that is already in the
prompt (rewrite this function with one fix). A decode step that also checks
k drafted tokens costs far less than k steps (every weight is streamed once
per step, whatever the number of positions), so each accepted draft token is
nearly free. This module decides *what* to draft and *how much*; the
scheduler reserves the slots, the runner verifies the drafts in the one
forward of the step and keeps the longest prefix the model's own draws
agree with (runner.py, sampling.py rule 4).
Integers and floats only: like the scheduler, nothing here imports MLX.

Rules:
1. Drafts come from prompt lookup (n-gram): the row's last n tokens (n from
   `ngram_max` down to 2) are looked up in the row's own prompt + output; the
   most recent earlier occurrence proposes the tokens that followed it. An
   index of every n-gram's latest end position is kept per row and grows
   with the row, so a lookup is O(ngram_max), not a scan of the context.
2. Each row keeps an exponential average `alpha` of its acceptance rate
   (accepted / drafted). A row whose drafts keep failing (alpha below
   `COLD_ALPHA`) drafts nothing, except one probe every `PROBE_EVERY` steps,
   so a row that starts quoting its prompt again is noticed.
3. The step cost model: a step of B rows each with L positions (decode rows
   are padded to the longest verify row) costs about c0 + c1 * B * L. The
   ratio c1 / c0 starts from a prior (the 2-core CPU backend's projections,
   benchmarks/results/spec-notes.md) and is refitted
   from the steps the engine times (decayed least squares). The step's L is
   the one that maximises expected tokens per unit of cost,
   sum_i E_i(min(L - 1, draft_i)) / (c0 + c1 * B * L), with
   E(k) = 1 + alpha + ... + alpha^k the expected tokens of a row drafting k.
   L = 1 (plain decode) is always a candidate, so speculation is chosen
   only when it is expected to pay for itself.
4. Pipelined engines (Metal, loop.py) plan step t+1 before step t's tokens
   are on the host, and a row can only draft from tokens the host knows. So
   the loop reads a step back before planning the next whenever one of its
   rows `expects_draft` (warm, and its recent lookups found matches);
   rows that keep missing let the pipeline run, probing now and then.
5. Only small batches speculate: a step decoding more than `max_rows` rows
   (setting `spec_max_rows`, 2) drafts nothing and never forces a read-back.
   With many rows the forward is no longer bound by streaming the weights,
   so extra verify positions cost nearly what they earn, and the cost model
   (rule 3) does not yet price attention over long contexts; the measured
   edit workload ran 1.95x faster single-stream but 0.84x at 8 clients
   (benchmarks/results/spec_bench-2026-12-01-*.txt).
6. Draft model speculation (a second, smaller model) is left out here; the
   drafter interface is one function of the row's tokens, which is where
   it would plug in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .kv.manager import KVCacheManager
    from .plan import DecodeRow, SchedulerOutput, Seq

COLD_ALPHA = 0.15        # rule 2: below this a row stops drafting
PROBE_EVERY = 8          # rule 2: a cold row still drafts every 8th step
ALPHA_DECAY = 0.3        # weight of the newest step in alpha
PRIOR_COST_RATIO = 0.14  # rule 3: c1 / c0 before any step is timed
PRIOR_WEIGHT = 4.0       # the prior counts as this many observed steps
COST_DECAY = 0.98        # older timed steps fade
MISSES_BEFORE_PIPELINE = 4  # rule 4: lookups without a match before pipelining resumes


@dataclass(frozen=True, slots=True)
class SpecConfig:
    """The engine's speculation settings (settings.py `speculative`, `spec_*`)."""

    max_draft: int = 8   # most tokens drafted per row per step
    max_rows: int = 2    # a step decoding more rows than this does not speculate (rule 5)
    ngram_max: int = 4   # longest suffix looked up (rule 1)
    ngram_min: int = 2


@dataclass(slots=True)
class RowDrafter:
    """Rule 1 and 2 for one row: the n-gram index and the acceptance average."""

    ngram_max: int
    ngram_min: int = 2
    index: dict[tuple[int, ...], int] = field(default_factory=dict)
    num_indexed: int = 0  # end positions < num_indexed are in `index`
    alpha: float = 0.6
    steps_since_draft: int = 0
    num_misses: int = 0  # steps in a row that found no n-gram match
    num_drafted: int = 0
    num_accepted: int = 0

    def propose(self, tokens: Sequence[int], max_draft: int) -> list[int]:
        """Up to `max_draft` tokens that followed the latest earlier match of the suffix."""
        if max_draft <= 0:
            return []
        self._extend(tokens)
        length = len(tokens)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            end = self.index.get(tuple(tokens[length - n:]))
            if end is not None:
                self.num_misses = 0
                return list(tokens[end:end + max_draft])
        self.num_misses += 1
        return []

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index the n-grams ending at positions num_indexed .. len - 1 (excluded: the
        suffix itself, which has nothing after it yet)."""
        stop = len(tokens) - 1
        for end in range(max(self.num_indexed, 1), stop + 1):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.index[tuple(tokens[end - n:end])] = end
        self.num_indexed = max(self.num_indexed, stop + 1)

    @property
    def is_cold(self) -> bool:
        return self.alpha < COLD_ALPHA

    def may_draft(self) -> bool:
        """Rule 2: warm rows draft every step, cold rows probe now and then."""
        return not self.is_cold or self.steps_since_draft >= PROBE_EVERY

    @property
    def expects_draft(self) -> bool:
        """Worth reading the row's last token back before planning (rule 5)."""
        return self.may_draft() and (self.num_misses < MISSES_BEFORE_PIPELINE
                                     or self.steps_since_draft % PROBE_EVERY == 0)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """One verify step's outcome (num_drafted 0: a plain decode step)."""
        if num_drafted <= 0:
            self.steps_since_draft += 1
            return
        self.steps_since_draft = 0
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        rate = num_accepted / num_drafted
        self.alpha = (1 - ALPHA_DECAY) * self.alpha + ALPHA_DECAY * rate

    def expected_tokens(self, k: int) -> float:
        """E(k) of rule 3: 1 + alpha + ... + alpha^k."""
        a = min(self.alpha, 0.999)
        return (1 - a ** (k + 1)) / (1 - a)


@dataclass(slots=True)
class StepCostModel:
    """Rule 3: c1 / c0 of step time = c0 + c1 * positions, fitted from timed steps."""

    s: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, num_positions: int, seconds: float) -> None:
        """A timed decode/verify step (no prefill in it) of `num_positions` positions."""
        if num_positions <= 0 or seconds <= 0:
            return
        x, y = float(num_positions), seconds
        self.s = self.s * COST_DECAY + 1
        self.sx = self.sx * COST_DECAY + x
        self.sy = self.sy * COST_DECAY + y
        self.sxx = self.sxx * COST_DECAY + x * x
        self.sxy = self.sxy * COST_DECAY + x * y

    @property
    def ratio(self) -> float:
        """c1 / c0, the fitted value blended with the prior by how much spread was seen."""
        var = self.sxx * self.s - self.sx * self.sx
        if self.s < 2 or var <= 1e-9 * max(1.0, self.sxx * self.s):
            return PRIOR_COST_RATIO
        c1 = (self.s * self.sxy - self.sx * self.sy) / var
        c0 = (self.sy - c1 * self.sx) / self.s
        if c1 <= 0:
            fitted = 0.0                   # extra positions looked free
        elif c0 <= c1 * 0.1:
            fitted = 10.0                  # all cost, no fixed part: never worth padding
        else:
            fitted = c1 / c0
        # the spread of x decides how much the fit is worth
        weight = min(self.s, var / max(1.0, self.s * self.s))
        return (weight * fitted + PRIOR_WEIGHT * PRIOR_COST_RATIO) / (weight + PRIOR_WEIGHT)

    def choose_width(self, num_rows: int, rows: Sequence[tuple[RowDrafter, int]],
                     max_draft: int) -> int:
        """The step's positions per row L (1 = no speculation), rule 3.

        `num_rows`: every row of the decode call; `rows`: (drafter, draft length)
        of the rows that have a draft.
        """
        if not rows or num_rows <= 0:
            return 1
        ratio = self.ratio
        longest = min(max_draft, max(k for _, k in rows))
        best, best_value = 1, 0.0
        for width in range(1, longest + 2):
            gain = sum(d.expected_tokens(min(width - 1, k)) for d, k in rows)
            value = (gain + (num_rows - len(rows))) / (1.0 + ratio * num_rows * width)
            if value > best_value * (1 + 1e-9):
                best, best_value = width, value
        return best


class Speculator:
    """Plans each step's drafts (rules 1-3) and settles them once verified.

    The scheduler calls `plan` after it reserved one slot per decode row, and
    `settle` when a verify row's tokens are back; the KV slots of rejected
    draft positions are given back there (`KVCacheManager.trim`), before any
    block holding them could be hashed: blocks are published only up to the
    row's computed positions, and `settle` rolls those back first.
    """

    def __init__(self, config: SpecConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.cost = StepCostModel()
        self.num_drafted_total = 0
        self.num_accepted_total = 0

    def plan(self, out: SchedulerOutput, seqs: dict[int, Seq]) -> None:
        """Give rows of `out.decode` their drafts, each row's slots reserved (never preempting)."""
        if len(out.decode) > self.config.max_rows:
            return  # rule 5
        candidates: list[tuple[DecodeRow, Seq, list[int]]] = []
        for row in out.decode:
            seq = seqs[row.seq_id]
            if not seq.group.speculative:
                continue
            if seq.drafter is None:
                seq.drafter = RowDrafter(self.config.ngram_max, self.config.ngram_min)
            if row.token_id is None:  # its last token is still on the device (rule 4)
                seq.drafter.record(0, 0)
                continue
            room = min(self.config.max_draft, seq.max_tokens - seq.num_scheduled_outputs)
            draft = seq.drafter.propose(seq.token_ids, room) if seq.drafter.may_draft() else []
            if draft:
                candidates.append((row, seq, draft))
            else:
                seq.drafter.record(0, 0)
        if not candidates:
            return
        width = self.cost.choose_width(
            len(out.decode), [(s.drafter, len(d)) for _, s, d in candidates if s.drafter],
            self.config.max_draft)
        for row, seq, draft in candidates:
            k = min(len(draft), width - 1)
            if k <= 0 or self.kv.allocate_slots(seq.seq_id, k) is None:
                if seq.drafter is not None:
                    seq.drafter.record(0, 0)
                continue
            row.draft = draft[:k]
            seq.num_computed += k
            seq.num_scheduled_outputs += k
            seq.num_drafted = k

    def wants_host(self, seq_ids: Sequence[int], seqs: dict[int, Seq]) -> bool:
        """Rule 4: whether a row of these would draft next step if its token were known."""
        if len(seq_ids) > self.config.max_rows:
            return False  # rule 5
        for seq_id in seq_ids:
            seq = seqs.get(seq_id)
            if seq is not None and seq.group.speculative and \
                    (seq.drafter is None or seq.drafter.expects_draft):
                return True
        return False

    def settle(self, seq: Seq, num_accepted: int) -> None:
        """A verify row's outcome: roll its positions back to the tokens it kept."""
        num_drafted, seq.num_drafted = seq.num_drafted, 0
        if seq.drafter is not None:
            seq.drafter.record(num_drafted, num_accepted)
        self.num_drafted_total += num_drafted
        self.num_accepted_total += num_accepted
        # Every kept token but the last has its K/V written; the last is the next input.
        seq.num_computed = len(seq.token_ids) - 1
        seq.num_scheduled_outputs = seq.num_outputs
        if seq.seq_id in self.kv:
            self.kv.trim(seq.seq_id, seq.num_computed)
