"""Sliced prefill turns: one model's long prompt without stalling another model's streams.

Why: engines of resident models take turns at the decode gate (gate.py rule
4), so while model B prefills a long prompt, each of model A's tokens waits
for one of B's turns. Cutting B's chunk (`shared_prefill_tokens`) bounds
that turn only down to B's cost of one forward, and a forward streams every
weight once whatever its token count: for two models of one size B's
smallest turn costs about what A's decode step does, so A's inter-token gap
doubles, and a large B behind a small A is several times worse.

So a step of B that decodes nothing of its own is run a few layers per turn.
The forward's graph is lazy; each layer's pools (its K/V pools, or a
recurrent layer's state pools, written by that layer) are its cut points:
evaluating them computes the rest of the layer before and this layer's
projections. B evaluates layers until its turn has cost its share of A's
step, then lets A have the gate until A has ended a step (gate.py rule 6),
and carries on. The graph is the same one an unsliced step runs, so the
results are identical.

Rules:
1. Only a step without decode rows, while the gate is contended, is sliced
   (the loop decides): a step with decode rows would make its own streams
   wait one of the other engine's steps per slice.
2. Turn budget: `TURN_SHARE` of the cheapest mean step of the other
   engines still stepping (gate.py rule 7; none: the step runs unsliced, as
   when the other model's streams have ended), so their gaps grow by about
   that share. A turn
   evaluates at least one layer; past the budget (by its last layer's time)
   it lets go before the next layer once another engine is queued, and
   waits at most `YIELD_STEPS` of their steps for one of them to end. While
   nobody is queued (the other engines are between steps) it goes on.
3. Chunk size (the scheduler's `sliced_prefill_tokens`): the tokens whose one
   layer fits `LAYER_FILL` of the budget at the cost per layer and token
   measured so far (a running mean), at least `shared_prefill_tokens`, at
   most `prefill_chunk_tokens`, and at most `GROWTH` times the last sliced
   chunk (a small chunk's cost per token is mostly its fixed part, so the
   estimate is refined as chunks grow; a layer that outgrows the budget
   lengthens the other engines' gaps by all of it).
4. On the CPU backend `mx.eval` of a slice runs it to the end, so the gate
   is held for exactly the slice's compute; on Metal the last slice's work
   may still run when the step is dispatched, as for any step (gate.py rule 1).
"""

from __future__ import annotations

import time
from typing import Protocol, Sequence

import mlx.core as mx

TURN_SHARE = 0.5  # rule 2
YIELD_STEPS = 2.0  # rule 2
LAYER_FILL = 0.6   # rule 3
GROWTH = 1.5       # rule 3


class TurnGate(Protocol):
    def yield_step(self, timeout_s: float) -> bool: ...

    def peer_step_s(self) -> float | None: ...


class PrefillSlicer:
    """Runs a contended prefill-only step a few layers per gate turn (module docstring)."""

    def __init__(self, gate: TurnGate, *, min_tokens: int, max_tokens: int) -> None:
        self.gate = gate
        self.min_tokens, self.max_tokens = min_tokens, max(min_tokens, max_tokens)
        self.layer_token_s: float | None = None  # rule 3: seconds per layer per prompt token
        self._last_tokens = min_tokens
        self.turns_total = 0

    def budget_s(self) -> float | None:
        peer = self.gate.peer_step_s()
        return None if peer is None else TURN_SHARE * peer

    def chunk_tokens(self) -> int:
        """Rule 3: the next sliced step's prompt tokens."""
        budget = self.budget_s()
        if budget is None or self.layer_token_s is None:
            return self.min_tokens
        fit = int(LAYER_FILL * budget / self.layer_token_s)
        return max(self.min_tokens, min(fit, self.max_tokens, int(GROWTH * self._last_tokens)))

    def run(self, layers: Sequence[Sequence[mx.array]], tokens: int, turn_start: float) -> None:
        """Evaluate the step's layers in turns (rule 2): `layers` holds each layer's
        pools in model order (runner.py `layer_arrays`). The caller holds the gate, and
        has since `turn_start` (time.perf_counter()), building the step."""
        budget = self.budget_s()
        last, total = 0.0, 0.0
        for i, pools in enumerate(layers):
            if i and budget is not None and time.perf_counter() - turn_start + last > budget \
                    and self.gate.yield_step(YIELD_STEPS * budget / TURN_SHARE):
                self.turns_total += 1
                turn_start, budget = time.perf_counter(), self.budget_s()
            began = time.perf_counter()
            mx.eval(*pools)
            last = time.perf_counter() - began
            total += last
        if tokens > 0:
            cost, mean = total / (max(1, len(layers)) * tokens), self.layer_token_s
            self.layer_token_s = cost if mean is None else (mean + cost) / 2
            self._last_tokens = tokens
