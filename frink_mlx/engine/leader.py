"""Rank 0's runner: post each step's plan to the followers, then run it like any runner.

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
3. Sampling stays on rank 0: a tensor-parallel forward ends in an
   all-reduce, a pipeline one in an all-gather of the last stage's hidden
   state (backend/distributed.py rule 3), so every rank holds the same full
   logits; only rank 0 needs them.
"""

from __future__ import annotations

from typing import Any

import mlx.core as mx

from ..backend import ForwardScope
from .channel import PlanChannel, Step
from .kv.paged import PagedKVStore
from .runner import Runner, StepResult
from .sampling import RowSampler
from .scheduler import SchedulerOutput
from .turns import PrefillSlicer


class LeaderRunner(Runner):
    def __init__(self, model: Any, store: PagedKVStore, forward: ForwardScope, *,
                 channel: PlanChannel, generation: int, device_masks: bool = False) -> None:
        super().__init__(model, store, forward, device_masks=device_masks)
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
            mx.eval(self.store.arrays())
        return result
