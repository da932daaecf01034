"""The scheduler's vocabulary: requests, rows and the plan of one engine step.

Why a module of its own: the scheduler (scheduler.py) writes these, the
runner (runner.py) turns a `SchedulerOutput` into arrays and the engine
(engine.py) reads `Finished` records, so the types are shared, and like the
scheduler they are plain integers and lists: nothing here imports MLX.

A *request* (`SeqRequest`, with n rows) becomes a `Group`; each row is a
`Seq` with its own block table in the `KVCacheManager`. See scheduler.py for
the rules that fill them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .types import EngineFinish, ImageInputs, SeqRequest

if TYPE_CHECKING:  # the speculator (engine/speculative/) reads this module, not the reverse
    from .speculative.lookup import RowDrafter


@dataclass(slots=True)
class Group:
    """One request: n rows sharing a prompt."""

    request: SeqRequest
    extra_key: tuple
    arrival_s: float
    seqs: list["Seq"] = field(default_factory=list)
    num_cached_tokens: int = 0
    activated: bool = False  # row 0's prompt was prefilled; every row is live
    speculative: bool = True  # rows may draft (engine/speculative/); off per request or engine
    loading: bool = False     # its prompt's blocks are being read from disk (kv/spill.py rule 4)
    disk_span: tuple[int, int] = (0, 0)  # prompt positions [start, end) read back from disk
    num_disk_tokens: int | None = None   # of num_cached_tokens, from disk; None: no tier

    def admitted_from_disk(self, num_hit: int) -> int:
        """Admitted with `num_hit` cached tokens: how many came from disk (spill.py rule 5)."""
        if self.num_disk_tokens is None:
            return 0
        start, end = self.disk_span
        self.num_disk_tokens = max(0, min(num_hit, end) - start)
        return self.num_disk_tokens


@dataclass(slots=True)
class Seq:
    seq_id: int
    group: Group
    index: int
    token_ids: list[int]
    num_prompt: int
    max_tokens: int
    num_pending: int = 0
    num_computed: int = 0
    num_scheduled_outputs: int = 0   # outputs known + pending + scheduled this step
    prefill_target: int = 0          # positions to prefill before decoding (0 = decoding)
    finish: EngineFinish | None = None
    drafter: RowDrafter | None = None  # engine/speculative/, made at the row's first draft
    num_drafted: int = 0               # tokens drafted by the step in flight (verify row)
    draft_computed: int = 0            # positions in the draft model's KV (engine/speculative/ rule 7)

    def key_ids(self, n: int) -> list[int]:
        """The first `n` ids as the prefix cache keys them (SeqRequest.key_ids)."""
        keys = self.group.request.key_ids
        if not keys:
            return self.token_ids[:n]
        return keys[:n] + self.token_ids[len(keys):n]

    @property
    def num_outputs(self) -> int:
        return len(self.token_ids) - self.num_prompt + self.num_pending

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def end_reason(self) -> EngineFinish | None:
        """"eos" after a stop token, "length" once max_tokens are known; else None."""
        if self.num_outputs and self.token_ids[-1] in self.group.request.stop_token_ids:
            return "eos"
        if self.num_outputs >= self.max_tokens and not self.num_pending:
            return "length"
        return None

    def append_until_end(self, tokens: list[int]) -> int:
        """Append `tokens` up to the first that ends the row; how many were appended."""
        for num, token in enumerate(tokens, 1):
            self.token_ids.append(token)
            if self.end_reason is not None:
                return num
        return len(tokens)


@dataclass(slots=True)
class PrefillChunk:
    seq_id: int
    token_ids: list[int]
    start: int
    block_table: list[int]
    sample_seq_ids: list[int]  # rows sampled from this chunk's last logits (empty: not final)
    slot: int = -1  # recurrent-state slot (kv/manager.py rule 9); -1: none
    images: ImageInputs | None = None  # the request's images (runner: features at their positions)
    window_table: list[int] | None = None  # windowed layers' blocks (kv/window.py); -1: freed


@dataclass(slots=True)
class DecodeRow:
    seq_id: int
    position: int
    block_table: list[int]
    token_id: int | None  # None: the token the previous step sampled (still on device)
    draft: list[int] = field(default_factory=list)  # verified after token_id (engine/speculative/)
    num_model_draft: int = 0  # the draft model fills `draft` with this many (engine/speculative/ rule 7)
    slot: int = -1  # recurrent-state slot (kv/manager.py rule 9); -1: none
    images: ImageInputs | None = None  # the request's images (runner: M-RoPE positions)
    window_table: list[int] | None = None  # windowed layers' blocks (kv/window.py); -1: freed


@dataclass(slots=True)
class DraftJob:
    """One row's work for the draft model this step (engine/speculative/ rule 7).

    Feed `token_ids` (the row's known tokens the draft KV lacks) at positions
    `start`.., then draft `num_draft` tokens greedily, each fed back but the
    last: the draft KV gains len(token_ids) + num_draft - 1 positions.
    """

    seq_id: int
    start: int
    token_ids: list[int]
    num_draft: int
    block_table: list[int] = field(default_factory=list)


@dataclass(slots=True)
class SchedulerOutput:
    decode: list[DecodeRow] = field(default_factory=list)
    prefill: list[PrefillChunk] = field(default_factory=list)
    copies: list[tuple[int, int, int]] = field(default_factory=list)  # (src, dst, num_slots)
    state_copies: list[tuple[int, int]] = field(default_factory=list)  # (src, dst) state slots
    state_restores: list[tuple[int, int]] = field(default_factory=list)  # (snapshot, slot) before
    state_snapshots: list[tuple[int, int]] = field(default_factory=list)  # (slot, snapshot) after
    window_copies: list[tuple[int, int, int]] = field(default_factory=list)  # kv/window.py's pool
    preempted: list[int] = field(default_factory=list)
    draft_jobs: list[DraftJob] = field(default_factory=list)  # engine/speculative/ rule 7

    @property
    def width(self) -> int:
        """Positions per decode row: 1 + the longest draft (rows are padded to it)."""
        return 1 + max((max(len(row.draft), row.num_model_draft) for row in self.decode),
                       default=0)

    @property
    def is_empty(self) -> bool:
        return not self.decode and not self.prefill

    @property
    def sample_seq_ids(self) -> list[int]:
        """The order of sampled rows: decode rows, then each final chunk's rows."""
        ids = [row.seq_id for row in self.decode]
        for chunk in self.prefill:
            ids.extend(chunk.sample_seq_ids)
        return ids


@dataclass(slots=True)
class Finished:
    seq: Seq
    reason: EngineFinish
    error: str | None = None
