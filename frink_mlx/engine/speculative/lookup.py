"""One row's drafting state: the prompt-lookup index and its acceptance averages.

Why per row: rows of one batch quote their prompts to very different degrees
(an edit request copies most of its snippet back, a chat answer hardly any),
so each row learns on its own whether drafting pays (rules 1-2 of
engine/speculative/__init__.py). Integers and floats only: nothing here imports MLX.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Sequence

COLD_ALPHA = 0.15        # rule 2: below this a row stops drafting
PROBE_EVERY = 8          # rule 2: a cold row still drafts every 8th step
ALPHA_DECAY = 0.3        # weight of the newest step in alpha
MISSES_BEFORE_PIPELINE = 4  # rule 4: lookups without a match before pipelining resumes


@dataclass(slots=True)
class RowDrafter:
    """Rules 1, 2 and 7 for one row: the n-gram index and the acceptance averages.

    `alpha` is the prompt-lookup drafts' acceptance, `model_alpha` the draft
    model's (rule 7): the two sources fail for different reasons, so a row
    that stops quoting its prompt may still follow the draft model.
    """

    ngram_max: int
    ngram_min: int = 2
    index: dict[tuple[int, ...], list[int]] = field(default_factory=dict)  # n-gram -> ends
    num_indexed: int = 0  # end positions < num_indexed are in `index`
    cursor: int = -1      # where the last lookup draft's accepted run ended; -1: none yet
    draft_from: int = 0   # where the draft in flight was copied from
    alpha: float = 0.6
    model_alpha: float = 0.6
    steps_since_draft: int = 0
    steps_since_model_draft: int = 0
    num_misses: int = 0  # steps in a row that found no n-gram match
    num_drafted: int = 0
    num_accepted: int = 0
    last_source: str = ""  # "lookup" | "model": who drafted the step in flight

    def propose(self, tokens: Sequence[int], max_draft: int) -> list[int]:
        """Up to `max_draft` tokens that followed an earlier match of the longest suffix:
        the first match at or after `cursor` (the text being copied: after the model
        departs from it -- a renamed identifier -- the copy picks up again right after
        the departure, not at a later repeat of the same words), else the latest."""
        if max_draft <= 0:
            return []
        self._extend(tokens)
        length = len(tokens)
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            ends = self.index.get(tuple(tokens[length - n:]))
            if ends:
                at = bisect.bisect_left(ends, self.cursor) if self.cursor >= 0 else len(ends)
                self.draft_from = ends[at] if at < len(ends) else ends[-1]
                self.num_misses = 0
                return list(tokens[self.draft_from:self.draft_from + max_draft])
        self.num_misses += 1
        return []

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index the n-grams ending at positions num_indexed .. len - 1 (excluded: the
        suffix itself, which has nothing after it yet); each n-gram's ends ascend."""
        stop = len(tokens) - 1
        for end in range(max(self.num_indexed, 1), stop + 1):
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.index.setdefault(tuple(tokens[end - n:end]), []).append(end)
        self.num_indexed = max(self.num_indexed, stop + 1)

    @property
    def is_cold(self) -> bool:
        return self.alpha < COLD_ALPHA

    def may_draft(self) -> bool:
        """Rule 2: warm rows draft every step, cold rows probe now and then."""
        return not self.is_cold or self.steps_since_draft >= PROBE_EVERY

    def may_draft_model(self) -> bool:
        """Rule 2 for the draft model's proposals (rule 7)."""
        return self.model_alpha >= COLD_ALPHA or self.steps_since_model_draft >= PROBE_EVERY

    def expects_draft(self, has_model: bool = False) -> bool:
        """Worth reading the row's last token back before planning (rule 4)."""
        if has_model and self.may_draft_model():
            return True
        return self.may_draft() and (self.num_misses < MISSES_BEFORE_PIPELINE
                                     or self.steps_since_draft % PROBE_EVERY == 0)

    def record(self, num_drafted: int, num_accepted: int) -> None:
        """One step's outcome (num_drafted 0: a plain decode step); the source is
        `last_source` ("model": the draft model's average, else prompt lookup's)."""
        model, self.last_source = self.last_source == "model", ""
        if num_drafted <= 0:
            self.steps_since_draft += 1
            self.steps_since_model_draft += 1
            return
        self.num_drafted += num_drafted
        self.num_accepted += num_accepted
        rate = num_accepted / num_drafted
        if model:
            self.steps_since_model_draft = 0
            self.steps_since_draft += 1
            self.model_alpha = (1 - ALPHA_DECAY) * self.model_alpha + ALPHA_DECAY * rate
        else:
            self.steps_since_draft = 0
            self.steps_since_model_draft += 1
            self.alpha = (1 - ALPHA_DECAY) * self.alpha + ALPHA_DECAY * rate
            self.cursor = self.draft_from + num_accepted

    def expected_tokens(self, k: int, model: bool = False) -> float:
        """E(k) of rule 3: 1 + a + ... + a^k, a the source's acceptance average."""
        a = min(self.model_alpha if model else self.alpha, 0.999)
        return (1 - a ** (k + 1)) / (1 - a)
