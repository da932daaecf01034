"""The step cost model of rule 3 (engine/speculative/__init__.py): is a wider step worth it?

Why fitted, not fixed: how much an extra verify position costs relative to
the step's fixed part (streaming every weight once) depends on the machine,
the model, the batch and the context: every position attends over its row's
context, and rows are padded to the longest (kv/paged.py), so on the CPU
backend a position at 1,000 tokens of context costs several times one at
100 (benchmarks/results/spec_cost_bench-*.txt). The model is

    step time = c0 + c1 * P + c2 * P * T / 1000     (P = rows x width, T = context)

and the ratios c1 / c0, c2 / c0 start from a prior measured on the 2-core
CPU backend, refined by the steps the engine times: decayed least squares
over the timed steps and the prior's pseudo-steps, which span the widths and
contexts the engine plans (`PRIOR_POINTS`). A slope the timed steps cannot
measure stays the prior's: a batch that never changes width says nothing
about what width costs, one row at a steady context cannot tell the two
terms apart, and on a loaded machine one stalled step (5x its peers) among
steps of one width and a context that barely moves would otherwise fit as
"positions cost everything" and switch speculation off for good (no wider
step is then timed to say otherwise). The pseudo-steps never decay, so a fit
that stopped wide steps drifts back to the prior and tries them again.
Floats only: nothing here imports MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .lookup import RowDrafter

PRIOR_COST_RATIO = 0.02      # c1 / c0 before any step is timed
PRIOR_CONTEXT_RATIO = 0.125  # c2 / c0: per position, per 1,000 tokens of context
PRIOR_POINTS = ((1, 0), (8, 0), (1, 2000), (8, 2000))  # (P, T) the prior is "timed" at
PRIOR_WEIGHT = 0.25          # per point: the prior counts as one observed step in all
COST_DECAY = 0.98            # older timed steps fade
MAX_RATIO = 10.0             # a fit with no fixed part: extra positions never pay


@dataclass(slots=True)
class StepCostModel:
    """Rule 3: the ratios of step time = c0 + c1 * P + c2 * P * T / 1000, fitted."""

    # decayed sums of f f^T and f y over timed steps, f = (1, P, P * T / 1000)
    ff: list[float] = field(default_factory=lambda: [0.0] * 9)
    fy: list[float] = field(default_factory=lambda: [0.0] * 3)
    num_steps: float = 0.0
    _ratios: tuple[float, float] | None = None

    def observe(self, num_positions: int, seconds: float, context: int = 0) -> None:
        """A timed decode/verify step (no prefill in it) of `num_positions` positions
        whose longest row reaches `context` tokens."""
        if num_positions <= 0 or seconds <= 0:
            return
        f = (1.0, float(num_positions), num_positions * context / 1000)
        self.ff = [v * COST_DECAY + f[i // 3] * f[i % 3] for i, v in enumerate(self.ff)]
        self.fy = [v * COST_DECAY + f[i] * seconds for i, v in enumerate(self.fy)]
        self.num_steps = self.num_steps * COST_DECAY + 1
        self._ratios = None

    @property
    def ratio(self) -> float:
        """c1 / c0."""
        return self.ratios[0]

    @property
    def ratios(self) -> tuple[float, float]:
        """(c1 / c0, c2 / c0): the ridge fit, or the prior before two steps are timed."""
        if self._ratios is None:
            self._ratios = self._fit() if self.num_steps >= 2 else \
                (PRIOR_COST_RATIO, PRIOR_CONTEXT_RATIO)
        return self._ratios

    def _fit(self) -> tuple[float, float]:
        """Least squares for (c0, c1, c2) over the timed steps plus the prior's pseudo-steps:
        `PRIOR_WEIGHT` steps at each of `PRIOR_POINTS`, timed as the prior says, its c0
        the one that explains the timed steps' mean. The pseudo-steps span the widths
        and contexts the engine plans, so a slope the timed steps cannot measure (one
        row, a context that barely moves, a width never tried) stays the prior's, and a
        stalled step on a loaded machine moves it little; a slope the steps do span
        (many of them, over far more than noise) is theirs. The timed steps decay, the
        pseudo-steps do not: a fit that stopped wide steps drifts back to the prior."""
        priors = (PRIOR_COST_RATIO, PRIOR_CONTEXT_RATIO)
        a, b = list(self.ff), list(self.fy)
        c0 = b[0] / max(a[0] + priors[0] * a[1] + priors[1] * a[2], 1e-12)
        for num_positions, context in PRIOR_POINTS:
            f = (1.0, float(num_positions), num_positions * context / 1000)
            y = c0 * (1 + priors[0] * f[1] + priors[1] * f[2])
            for i in range(9):
                a[i] += PRIOR_WEIGHT * f[i // 3] * f[i % 3]
            for i in range(3):
                b[i] += PRIOR_WEIGHT * f[i] * y
        solved = _solve3(a, b)
        if solved is None:
            return priors
        c0, c1, c2 = solved
        if c0 <= 0 or c0 * MAX_RATIO < c1 + max(c2, 0.0):
            return (MAX_RATIO, 0.0)  # all cost, no fixed part: never worth padding
        return (c1 / c0, c2 / c0)

    def choose_width(self, num_rows: int, rows: Sequence[tuple[RowDrafter, int]],
                     max_draft: int, model_rows: Sequence[tuple[RowDrafter, int]] = (),
                     draft_step_cost: float = 0.0, context: int = 0) -> int:
        """The step's positions per row L (1 = no speculation), rule 3.

        `num_rows`: every row of the decode call; `rows`: (drafter, draft length)
        of the rows with a prompt-lookup draft; `model_rows`: (drafter, most
        tokens it may draft) of the rows the draft model would draft for, each
        of whose L - 1 sequential draft steps costs `draft_step_cost` (relative
        to a plain step's fixed part c0; rule 7); `context`: the longest row's
        tokens (every row attends that far, padded).
        """
        if (not rows and not model_rows) or num_rows <= 0:
            return 1
        r1, r2 = self.ratios
        per_position = max(0.0, r1 + r2 * context / 1000)
        longest = min(max_draft, max(k for _, k in [*rows, *model_rows]))
        num_plain = num_rows - len(rows) - len(model_rows)
        best, best_value = 1, 0.0
        for width in range(1, longest + 2):
            gain = sum(d.expected_tokens(min(width - 1, k)) for d, k in rows)
            gain += sum(d.expected_tokens(min(width - 1, k), model=True) for d, k in model_rows)
            cost = 1.0 + per_position * num_rows * width
            if model_rows and width > 1:
                cost += draft_step_cost * (width - 1)
            value = (gain + num_plain) / cost
            if value > best_value * (1 + 1e-9):
                best, best_value = width, value
        return best


def _solve3(a: list[float], b: list[float]) -> tuple[float, float, float] | None:
    """x with A x = b for a 3x3 A (row-major), by Cramer's rule; None if singular."""
    def det(m: list[float]) -> float:
        return (m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6])
                + m[2] * (m[3] * m[7] - m[4] * m[6]))

    d = det(a)
    if abs(d) < 1e-300:
        return None
    out = []
    for col in range(3):
        m = list(a)
        for row in range(3):
            m[3 * row + col] = b[row]
        out.append(det(m) / d)
    return out[0], out[1], out[2]
