"""The speculator: plans each step's drafts and settles them once verified.

Why apart from the scheduler: the scheduler reserves one slot per decode row
and knows nothing of drafts; this object adds the drafts (rules 1-3, 7 of
engine/speculative/__init__.py) on top of that plan and rolls rejected positions
back out of both KV pools. Integers only: nothing here imports MLX (the draft
model runs in engine/speculative/model.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..kv.manager import KVCacheManager
from ..plan import DecodeRow, DraftJob, SchedulerOutput, Seq
from .cost import StepCostModel
from .lookup import RowDrafter

INITIAL_ALPHA = 0.6   # rule 2: a new row's acceptance average before any row has drafted
PRIOR_DECAY = 0.1     # weight of one verify step in the population's average



@dataclass(frozen=True, slots=True)
class SpecConfig:
    """The engine's speculation settings (settings.py `speculative`, `spec_*`)."""

    max_draft: int = 8   # most tokens drafted per row per step
    max_rows: int = 8    # a step decoding more rows than this does not speculate (rule 5)
    ngram_max: int = 4   # longest suffix looked up (rule 1)
    ngram_min: int = 2
    # rule 7, set by the engine when its generation has a draft model (0: none)
    draft_num_blocks: int = 0
    draft_rows: int = 2            # full contexts the draft KV pool holds (when not given)
    draft_step_cost: float = 0.0   # one draft-model step / a target step's fixed part
    draft_chunk_tokens: int = 512  # most tokens a row's draft KV catches up per step


class Speculator:
    """Plans each step's drafts (rules 1-3, 7) and settles them once verified.

    The scheduler calls `plan` after it reserved one slot per decode row,
    `settle` when a verify row's tokens are back, and `forget` when a row
    ends or is preempted. The KV slots of rejected draft positions are given
    back in `settle` (`KVCacheManager.trim`), before any block holding them
    could be hashed: blocks are published only up to the row's computed
    positions, and `settle` rolls those back first. The draft model's pool
    (`draft_kv`, rule 7) publishes nothing; it is trimmed to the tokens kept.
    """

    def __init__(self, config: SpecConfig, kv: KVCacheManager) -> None:
        self.config = config
        self.kv = kv
        self.draft_kv = (KVCacheManager(config.draft_num_blocks, kv.block_size,
                                        enable_caching=False)
                         if config.draft_num_blocks > 0 else None)
        self.cost = StepCostModel()
        self.num_drafted_total = 0
        self.num_accepted_total = 0
        self.num_model_drafted_total = 0   # the draft model's share of the two above
        self.num_model_accepted_total = 0
        self._draft_holders: dict[int, Seq] = {}  # rows holding draft KV
        # rule 2: a new row's acceptance averages start from what rows have seen lately
        self.lookup_prior = INITIAL_ALPHA
        self.model_prior = INITIAL_ALPHA

    def plan(self, out: SchedulerOutput, seqs: dict[int, Seq]) -> None:
        """Give rows of `out.decode` their drafts, each row's slots reserved (never preempting)."""
        if len(out.decode) > self.config.max_rows:
            return  # rule 5
        lookups: list[tuple[DecodeRow, Seq, list[int]]] = []
        models: list[tuple[DecodeRow, Seq, int]] = []
        for row in out.decode:
            seq = seqs[row.seq_id]
            if not seq.group.speculative:
                continue
            if seq.drafter is None:
                seq.drafter = RowDrafter(self.config.ngram_max, self.config.ngram_min,
                                         alpha=self.lookup_prior, model_alpha=self.model_prior)
            drafter = seq.drafter
            if row.token_id is None:  # its last token is still on the device (rule 4)
                drafter.record(0, 0)
                continue
            room = min(self.config.max_draft, seq.max_tokens - seq.num_scheduled_outputs)
            draft = drafter.propose(seq.token_ids, room) if drafter.may_draft() else []
            if draft:
                lookups.append((row, seq, draft))
            elif room > 0 and self.draft_kv is not None and drafter.may_draft_model():
                models.append((row, seq, room))
            else:
                drafter.record(0, 0)
        if not lookups and not models:
            return
        width = self.cost.choose_width(
            len(out.decode), [(s.drafter, len(d)) for _, s, d in lookups if s.drafter],
            self.config.max_draft, [(s.drafter, k) for _, s, k in models if s.drafter],
            self.config.draft_step_cost, max(row.position for row in out.decode) + 1)
        for row, seq, draft in lookups:
            self._take_lookup(row, seq, draft[:width - 1])
        keep = {seq.seq_id for _, seq, _ in models}
        for row, seq, room in models:
            self._take_model(out, row, seq, min(room, width - 1), keep)

    def _take_lookup(self, row: DecodeRow, seq: Seq, draft: list[int]) -> None:
        if not draft or self.kv.allocate_slots(seq.seq_id, len(draft)) is None:
            if seq.drafter is not None:
                seq.drafter.record(0, 0)
            return
        if seq.drafter is not None:
            seq.drafter.last_source = "lookup"
        row.draft = draft
        self._drafted(seq, len(draft))

    def _take_model(self, out: SchedulerOutput, row: DecodeRow, seq: Seq, k: int,
                    keep: set[int]) -> None:
        """Rule 7: a draft-model job for this row (k tokens, or a catch-up only)."""
        drafter = seq.drafter
        draft_kv = self.draft_kv
        if k <= 0 or draft_kv is None:  # the step's width leaves no room for drafts
            if drafter is not None:
                drafter.record(0, 0)
            return
        start = seq.draft_computed
        feed = seq.token_ids[start:]
        if len(feed) > self.config.draft_chunk_tokens:
            feed, k = feed[:self.config.draft_chunk_tokens], 0  # catch up first
        need = start + len(feed) + max(k - 1, 0)
        if k == 0 and drafter is not None:
            drafter.record(0, 0)
        if not self._grow_draft(seq, need, keep):
            if k > 0 and drafter is not None:
                drafter.record(0, 0)
            return
        if k > 0 and self.kv.allocate_slots(seq.seq_id, k) is None:
            self._trim_draft(seq, start)
            if drafter is not None:
                drafter.record(0, 0)
            return
        out.draft_jobs.append(DraftJob(seq.seq_id, start, list(feed), k,
                                       draft_kv.block_table(seq.seq_id)))
        seq.draft_computed = need
        if k > 0:
            if drafter is not None:
                drafter.last_source = "model"
            row.num_model_draft = k
            self._drafted(seq, k)

    def _drafted(self, seq: Seq, k: int) -> None:
        seq.num_computed += k
        seq.num_scheduled_outputs += k
        seq.num_drafted = k

    def _grow_draft(self, seq: Seq, num_tokens: int, keep: set[int]) -> bool:
        """Reserve draft KV up to `num_tokens` positions; when the pool is short, rows
        not drafting this step give theirs back first (rule 7). False: no room."""
        draft_kv = self.draft_kv
        if draft_kv is None:
            return False
        have = draft_kv.num_tokens(seq.seq_id) if seq.seq_id in draft_kv else 0
        if num_tokens <= have:
            return True
        if draft_kv.allocate_slots(seq.seq_id, num_tokens - have) is not None:
            self._draft_holders[seq.seq_id] = seq
            return True
        for other in list(self._draft_holders.values()):
            if other.seq_id not in keep:
                self.forget(other)
        if draft_kv.allocate_slots(seq.seq_id, num_tokens - have) is None:
            return False
        self._draft_holders[seq.seq_id] = seq
        return True

    def _trim_draft(self, seq: Seq, num_tokens: int) -> None:
        if self.draft_kv is None or seq.seq_id not in self.draft_kv:
            return
        if num_tokens <= 0:
            self.forget(seq)
            return
        self.draft_kv.trim(seq.seq_id, num_tokens)
        seq.draft_computed = num_tokens

    def wants_host(self, seq_ids: Sequence[int], seqs: dict[int, Seq]) -> bool:
        """Rule 4: whether a row of these would draft next step if its token were known."""
        if len(seq_ids) > self.config.max_rows:
            return False  # rule 5
        has_model = self.draft_kv is not None
        for seq_id in seq_ids:
            seq = seqs.get(seq_id)
            if seq is not None and seq.group.speculative and \
                    (seq.drafter is None or seq.drafter.expects_draft(has_model)):
                return True
        return False

    def settle(self, seq: Seq, num_accepted: int) -> None:
        """A verify row's outcome: roll its positions back to the tokens it kept."""
        num_drafted, seq.num_drafted = seq.num_drafted, 0
        if seq.drafter is not None and num_drafted > 0:
            rate = num_accepted / num_drafted
            if seq.drafter.last_source == "model":
                self.num_model_drafted_total += num_drafted
                self.num_model_accepted_total += num_accepted
                self.model_prior += PRIOR_DECAY * (rate - self.model_prior)
            else:
                self.lookup_prior += PRIOR_DECAY * (rate - self.lookup_prior)
        if seq.drafter is not None:
            seq.drafter.record(num_drafted, num_accepted)
        self.num_drafted_total += num_drafted
        self.num_accepted_total += num_accepted
        # Every kept token but the last has its K/V written; the last is the next input.
        seq.num_computed = len(seq.token_ids) - 1
        seq.num_scheduled_outputs = seq.num_outputs
        replay = num_accepted < num_drafted and seq.seq_id in self.kv \
            and self.kv.state_slot(seq.seq_id) >= 0  # rule 8: the next input is replayed too
        if seq.seq_id in self.kv:
            self.kv.trim(seq.seq_id, seq.num_computed + replay)
        # rule 7: the draft KV keeps the longest prefix its inputs share with the row
        self._trim_draft(seq, min(seq.draft_computed, seq.num_computed))
        if replay:  # rule 8
            self.kv.roll_back_state(seq.seq_id)
            seq.prefill_target = len(seq.token_ids)
            seq.num_computed -= num_accepted + 1

    def forget(self, seq: Seq) -> None:
        """The row ended or was preempted: its draft KV goes back (rule 7)."""
        self._draft_holders.pop(seq.seq_id, None)
        if self.draft_kv is not None:
            self.draft_kv.free(seq.seq_id)
        seq.draft_computed = 0
