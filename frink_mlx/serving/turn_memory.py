"""The turns a generation answered lately, to explain prefix-cache misses (handles rule 7).

Why: a chat template may re-render an earlier answer into other ids than the
model generated, and then the prefix cache cannot reach past that point. A
`TurnMemory` per generation keeps the last turns' ids (prompt + generated
answer); `divergence(prompt)` says where a new prompt that continues one of
them first leaves its answer (`Usage.prefix_divergence`), or None when it
continues a turn exactly or none at all.
"""

from __future__ import annotations

import threading
from array import array
from collections import deque


class TurnMemory:
    """Recent (prompt, prompt + answer) id sequences of one generation."""

    def __init__(self, max_turns: int = 64) -> None:
        self._turns: deque[tuple[int, array[int]]] = deque(maxlen=max_turns)
        self._lock = threading.Lock()

    def remember(self, prompt_ids: list[int], answer_ids: list[int]) -> None:
        if answer_ids:
            with self._lock:
                self._turns.append((len(prompt_ids), array("i", [*prompt_ids, *answer_ids])))

    def divergence(self, prompt_ids: list[int]) -> int | None:
        """First index where `prompt_ids` leaves the answer of a turn it continues."""
        prompt = array("i", prompt_ids)
        best: int | None = None
        with self._lock:
            turns = list(self._turns)
        for num_prompt, seq in reversed(turns):
            if num_prompt > len(prompt) or seq[:num_prompt] != prompt[:num_prompt]:
                continue
            at = num_prompt
            end = min(len(seq), len(prompt))
            while at < end and seq[at] == prompt[at]:
                at += 1
            if at == len(seq):
                return None  # continues this turn exactly: nothing to explain
            best = at if best is None else max(best, at)
        return best
