"""Rank 0's runner: post each step's plan to the followers, then run it like any runner.

`GroupRunner` (every rank's, the followers' too) adds only rule 5's order.

Why at the runner boundary: the plan (scheduler.py) is already everything a
follower needs -- token ids, positions, block tables, block copies -- as plain
integers, and the follower's forward is the runner's own `forward`. The
scheduler, the block manager, the prefix cache, chunked prefill, aborts and
structured output stay on rank 0 and are untouched: a follower never decides
anything, so it cannot disagree.

Rules:
1. Every decode row's input token is known on the host when the plan is
   posted: the engine never pipelines steps in a group (engine.py), so the
   previous step was read back before this one was planned.
2. The post, the forward and the evaluation of the step's outputs happen
   inside one `PlanChannel.exclusive()`: no other thread (the idle pinger, a
   load's commit round) may issue a collective while this step's all-reduces
   are in flight, or the ranks' collective orders would differ.
3. Recurrent state and window tables: the plan already names each row's
   state slot, the snapshots to restore before the forward and to take
   after it, the slot and window-block copies of a fork and each row's
   window table (plan.py), so a follower that applies them to its own
   pools keeps them as rank 0's, and nothing else is posted.
4. Sampling stays on rank 0: a tensor-parallel forward ends in an
   all-reduce, a pipeline one in an all-gather of the last stage's hidden
   state (backend/distributed.py rule 3), so every rank holds the same full
   logits; only rank 0 needs them.
5. One order of collectives on every rank: a step of a recurrent model is
   several model calls (one per chunk length, kv/recurrent.py rule 4), each
   with its own chain of collectives and none depending on another, and the
   ranks' graphs differ (rank 0 samples), so MLX could run the chains in
   another order on each rank, and an all-reduce would sum one call's
   tensor with another's. Every rank therefore dispatches each call's
   outputs and pools (`mx.async_eval`) before it builds the next: one
   stream runs them in that order. (A llama-like step's decode call is
   already dispatched before its prefill call, runner.py.)
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from ..backend import ForwardScope
from .channel import PlanChannel, Step
from .kv.paged import PagedKVStore
from .kv.recurrent import StateStore
from .kv.specs import ModelCacheSpec
from .runner import Runner, StepResult
from .sampling import RowSampler
from .scheduler import DecodeRow, PrefillChunk, SchedulerOutput
from .turns import PrefillSlicer


class GroupRunner(Runner):
    """A runner on a rank of a group: each model call dispatched in plan order (rule 5)."""

    def _decode(self, rows: list[DecodeRow], width: int = 1) -> mx.array:
        logits = super()._decode(rows, width)
        self._dispatch(logits)
        return logits

    def _prefill_call(self, chunks: list[PrefillChunk]) -> mx.array | None:
        logits = super()._prefill_call(chunks)
        self._dispatch(logits)
        return logits

    def _dispatch(self, logits: mx.array | None) -> None:
        states = self.states.arrays() if self.states is not None else []
        mx.async_eval(*([] if logits is None else [logits]), *self.store.arrays(), *states)


class LeaderRunner(GroupRunner):
    def __init__(self, model: Any, store: PagedKVStore, forward: ForwardScope, *,
                 channel: PlanChannel, generation: int, device_masks: bool = False,
                 cache_spec: ModelCacheSpec | None = None,
                 states: StateStore | None = None) -> None:
        super().__init__(model, store, forward, device_masks=device_masks,
                         cache_spec=cache_spec, states=states)
        self.channel = channel
        self.generation = generation

    def run(self, plan: SchedulerOutput, samplers: dict[int, RowSampler],
            sliced: PrefillSlicer | None = None) -> StepResult:
        """`sliced` is never given here: the engine slices no distributed step (turns.py)."""
        if any(row.token_id is None for row in plan.decode):
            raise RuntimeError("a distributed step needs every input token on the host (rule 1)")
        with self.channel.exclusive():  # rule 2
            self.channel.post(Step(self.generation, plan))
            result = super().run(plan, samplers)
            result.wait()
            mx.eval(self.pool_arrays())  # the KV pools, the recurrent states and snapshots
        return result
