"""Thinking budgets: close a row's think block after `budget` reasoning tokens.

Anthropic's `thinking.budget_tokens` (GenRequest.thinking_budget_tokens) caps
how long a model may reason. The engine enforces it through the one hook it
already has for steering a row's next token, `RowConstraint`: a
`ThinkBudget` row constraint watches the row's tokens and, once `budget`
tokens were generated inside an open think block, allows only the next id of
the think-end marker (MarkupInfo.think_end, tokenized) until the whole marker
is out. Then the row continues unconstrained (or under the grammar it wraps).

Rules:
1. The block is open from the start when the prompt opened it
   (`prompt_opens_thinking`, Qwen3-style templates); otherwise it opens when
   the row's ids end with the think-start marker's ids.
2. A block the model closes itself (its ids end with the think-end ids) resets
   the count; a later block gets a fresh budget.
3. Forcing is a one-token mask (a short bool mask forbids every id past it,
   see constraints.apply_constraints): greedy and sampled rows alike take it.
4. An inner constraint (a structured-output grammar, which stays free until
   think_end appears in the text) sees every token, forced ones included; its
   mask applies whenever nothing is being forced.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

import numpy as np

from .types import RowConstraint


class ThinkBudget:
    """A RowConstraint that forces the think-end marker after `budget` tokens."""

    __slots__ = ("budget", "_start", "_end", "_inner", "_inside", "_count", "_recent", "_forced")

    def __init__(self, budget: int, *, think_start_ids: Sequence[int], think_end_ids: Sequence[int],
                 opens_inside: bool, inner: RowConstraint | None = None) -> None:
        if budget < 0:
            raise ValueError("budget must be >= 0")
        if not think_end_ids:
            raise ValueError("think_end_ids must not be empty")
        self.budget = budget
        self._start = tuple(think_start_ids)
        self._end = tuple(think_end_ids)
        self._inner = inner
        self._inside = opens_inside          # rule 1
        self._count = 0                      # tokens generated inside the open block
        self._recent: deque[int] = deque(maxlen=max(len(self._start), len(self._end)))
        self._forced: deque[int] = deque()   # think-end ids still to emit

    @property
    def forcing(self) -> bool:
        return bool(self._forced)

    def allowed_mask(self) -> np.ndarray | None:
        if not self._forced and self._inside and self._count >= self.budget:
            self._forced.extend(self._end)
        if self._forced:  # rule 3
            token = self._forced[0]
            mask = np.zeros(token + 1, dtype=bool)
            mask[token] = True
            return mask
        return self._inner.allowed_mask() if self._inner is not None else None

    def accept(self, token_id: int) -> bool:
        if self._forced and self._forced[0] == token_id:
            self._forced.popleft()
        self._recent.append(token_id)
        if self._inside:
            self._count += 1
            if self._ends_with(self._end):   # rule 2 (forced or the model's own)
                self._inside, self._count = False, 0
                self._forced.clear()
        elif self._start and self._ends_with(self._start):
            self._inside, self._count = True, 0
        return self._inner.accept(token_id) if self._inner is not None else True

    def is_done(self) -> bool:
        return self._inner.is_done() if self._inner is not None else False

    @property
    def error(self) -> str | None:
        return self._inner.error if self._inner is not None else None

    def _ends_with(self, ids: tuple[int, ...]) -> bool:
        n = len(ids)
        return n > 0 and len(self._recent) >= n and tuple(self._recent)[-n:] == ids


def with_think_budget(constraints: list[RowConstraint] | None, n: int, budget: int, *,
                      think_start_ids: Sequence[int], think_end_ids: Sequence[int],
                      opens_inside: bool) -> list[RowConstraint]:
    """One ThinkBudget per row, each wrapping that row's constraint (if any)."""
    inner: list[RowConstraint | None] = list(constraints) if constraints else [None] * n
    return [ThinkBudget(budget, think_start_ids=think_start_ids, think_end_ids=think_end_ids,
                        opens_inside=opens_inside, inner=c) for c in inner]
