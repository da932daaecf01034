"""The step cost model of rule 3 (engine/speculative/__init__.py): is a wider step worth it?

Why fitted, not fixed: how much an extra verify position costs relative to
the step's fixed part (streaming every weight once) depends on the machine,
the model, the batch and the context: every position attends over its row's
context, and rows are padded to the longest (kv/paged.py), so on the CPU
backend a position at 1,000 tokens of context costs several times one at
100 (benchmarks/results/spec_cost_bench-*.txt). The model is

    step time = c0 + c1 * P + c2 * P * T / 1000     (P = rows x width, T = context)

and the ratios c1 / c0, c2 / c0 start from a prior measured on the 2-core
CPU backend, refined by the steps the engine times: decayed least squares,
ridge-regressed toward the prior (a batch that never changes width says
nothing about what width costs, and one row at a steady context cannot tell
the two terms apart: there the prior decides).
Floats only: nothing here imports MLX.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .lookup import RowDrafter

PRIOR_COST_RATIO = 0.02      # c1 / c0 before any step is timed
PRIOR_CONTEXT_RATIO = 0.125  # c2 / c0: per position, per 1,000 tokens of context
PRIOR_WEIGHT = 1.0           # the prior counts as this many observed steps
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
        """Ridge regression toward the prior: least squares for (c0, c1, c2), then again
        with each c_j pulled toward r_j * c0 (r_j its prior ratio, c0 the first
        pass's) with the weight of `PRIOR_WEIGHT` steps at the regressor's mean square.
        Where the steps leave a direction undetermined (one row, a context that barely
        moves: P and P * T nearly proportional), the prior decides it."""
        n, a = self.num_steps, list(self.ff)
        tiny = 1e-9 * (a[0] + a[4] + a[8])
        first = _solve3([v + (tiny if i in (0, 4, 8) else 0.0) for i, v in enumerate(a)],
                        self.fy)
        c0 = first[0] if first is not None and first[0] > 0 else self.fy[0] / max(a[0], 1e-12)
        priors = (PRIOR_COST_RATIO, PRIOR_CONTEXT_RATIO)
        b = list(self.fy)
        for j, prior in zip((1, 2), priors):
            weight = PRIOR_WEIGHT * max(a[4 * j] / n, 1e-6)
            a[4 * j] += weight
            b[j] += weight * prior * c0
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
