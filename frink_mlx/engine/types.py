"""Typed messages between the daemon (event loop) and an engine (its MLX thread).

The engine owns one MLX thread; everything crosses that boundary as these
plain dataclasses (token ids, never text; arrays only behind `ImageInputs`):

    daemon --SeqRequest--> Engine.submit() --> scheduler/runner (MLX thread)
    daemon <--StepOutput-- SeqStream (async iterator, bounded by step rate)

`RowConstraint` is the hook structured output plugs into: the runner asks
each constrained row for its allowed-token mask before sampling and tells it
which token was chosen. It lives here so the engine never imports llguidance.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from ..core.request import SamplingParams

EngineFinish = Literal["eos", "length", "abort", "error", "constraint"]


class RowConstraint(Protocol):
    """Per-row token constraint (grammar matcher). Called on the MLX thread."""

    def allowed_mask(self) -> np.ndarray | None:
        """A bool array (vocab,) of allowed next tokens, or None = unconstrained now."""

    def accept(self, token_id: int) -> bool:
        """Advance by one sampled token; False = dead end (row finishes, reason 'constraint')."""

    def is_done(self) -> bool:
        """True once the grammar accepts and nothing more may follow (row finishes as eos)."""

    @property
    def error(self) -> str | None:
        """Why the constraint failed, for the client."""


class ImageInputs(Protocol):
    """A prompt's images as the engine needs them (models/vision.py `ImageFeatures`).

    `positions` are the prompt indices of the image tokens, ascending; the
    runner puts `rows(lo, hi)` row k - lo at position `positions[k]` of a
    prefill chunk that covers it, over `embed(ids)` for the rest. `rows` runs
    the vision tower on the MLX thread, only when a chunk needs it, and once per
    image: a prefix-cache hit over an image never encodes it (models/vision.py
    rule 4). `rope_positions` is asked for every chunk and decode row of the
    request (runner.py `rope_positions`)."""

    positions: list[int]

    def rows(self, lo: int, hi: int) -> Any:
        """(hi - lo, hidden) embedding rows (an mx.array) of image tokens lo..hi-1."""

    def embed(self, ids: Any) -> Any:
        """The language model's token embeddings of `ids` (B, L) -> (B, L, hidden)."""

    def rope_positions(self, start: int, length: int) -> np.ndarray | None:
        """M-RoPE models (models/vision.py rule 6): (3, length) position ids of the
        row's indices start..start+length-1, generated ones included; None when
        the model's positions are the indices."""


@dataclass(slots=True)
class SeqRequest:
    """One sequence to generate. `n > 1` forks n rows that share the prompt's KV."""

    request_id: str
    prompt_ids: list[int]
    sampling: SamplingParams
    max_tokens: int
    stop_token_ids: frozenset[int] = frozenset()
    n: int = 1
    cache_prompt: bool = True
    cache_salt: str | None = None
    constraints: list[RowConstraint] | None = None  # one per row (len == n) when set
    priority: int = 0
    speculative: bool = True  # rows may draft and verify (engine/speculative/); False opts out
    images: ImageInputs | None = None  # a vision prompt's images (ImageInputs)
    # the prompt as the prefix cache keys it: image positions carry their image's
    # digest instead of the image token id (kv/hashing.py), None = prompt_ids
    key_ids: list[int] | None = None


@dataclass(slots=True)
class TopLogprob:
    token_id: int
    logprob: float


@dataclass(slots=True)
class StepOutput:
    """One generated token for one row (`index` < n), or that row's end.

    The first output of each row carries `num_prompt_tokens` and
    `num_cached_tokens` (prefix-cache hit, a multiple of the block size), and
    with the SSD tier `num_disk_cached_tokens`: how many of those were read
    back from disk (kv/spill.py rule 5).
    A verify step (speculation) yields several outputs of one row at once.
    When `finish` is set, `token_id` may be None (e.g. abort, error).
    """

    index: int
    token_id: int | None
    logprob: float | None = None
    top_logprobs: list[TopLogprob] | None = None
    finish: EngineFinish | None = None
    error: str | None = None
    num_prompt_tokens: int | None = None
    num_cached_tokens: int | None = None
    num_disk_cached_tokens: int | None = None
    # Speculation (engine/speculative/): set on the first output of a row's step when the
    # row may speculate; tokens it drafted for that step and how many were accepted.
    num_drafted: int | None = None
    num_draft_accepted: int | None = None


@dataclass(slots=True)
class EngineStats:
    """A snapshot for /health and /metrics. Honest nulls: None = not measured."""

    num_blocks_total: int = 0
    num_blocks_used: int = 0
    num_blocks_cached: int = 0
    block_size: int = 0
    num_running: int = 0
    num_waiting: int = 0
    prefix_hit_tokens_total: int = 0
    prompt_tokens_total: int = 0
    generated_tokens_total: int = 0
    context_ceiling: int = 0
    steps_total: int = 0
    draft_tokens_total: int = 0           # speculative tokens drafted (engine/speculative/)
    draft_accepted_tokens_total: int = 0  # ... and accepted by verification
    state_slots_total: int | None = None  # recurrent-state slots (kv/slots.py); None: no such layers
    state_slots_used: int | None = None
    window_tokens: int | None = None        # sliding-window tables (kv/window.py); None: none
    window_blocks_total: int | None = None  # the windowed layers' pool
    window_blocks_used: int | None = None
    extra: dict[str, float] = field(default_factory=dict)
