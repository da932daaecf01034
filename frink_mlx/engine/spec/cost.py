"""The step cost model of rule 3 (engine/spec/__init__.py): is a wider step worth it?

Why fitted, not fixed: how much an extra verify position costs relative to
the step's fixed part (streaming every weight once) depends on the machine,
the model and the batch; a prior gets the first steps right and the engine's
timed steps refine it. Floats only: nothing here imports MLX.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from .lookup import RowDrafter

PRIOR_COST_RATIO = 0.14  # rule 3: c1 / c0 before any step is timed
PRIOR_WEIGHT = 4.0       # the prior counts as this many observed steps
COST_DECAY = 0.98        # older timed steps fade


@dataclass(slots=True)
class StepCostModel:
    """Rule 3: c1 / c0 of step time = c0 + c1 * positions, fitted from timed steps."""

    s: float = 0.0
    sx: float = 0.0
    sy: float = 0.0
    sxx: float = 0.0
    sxy: float = 0.0

    def observe(self, num_positions: int, seconds: float) -> None:
        """A timed decode/verify step (no prefill in it) of `num_positions` positions."""
        if num_positions <= 0 or seconds <= 0:
            return
        x, y = float(num_positions), seconds
        self.s = self.s * COST_DECAY + 1
        self.sx = self.sx * COST_DECAY + x
        self.sy = self.sy * COST_DECAY + y
        self.sxx = self.sxx * COST_DECAY + x * x
        self.sxy = self.sxy * COST_DECAY + x * y

    @property
    def ratio(self) -> float:
        """c1 / c0, the fitted value blended with the prior by how much spread was seen."""
        var = self.sxx * self.s - self.sx * self.sx
        if self.s < 2 or var <= 1e-9 * max(1.0, self.sxx * self.s):
            return PRIOR_COST_RATIO
        c1 = (self.s * self.sxy - self.sx * self.sy) / var
        c0 = (self.sy - c1 * self.sx) / self.s
        if c1 <= 0:
            fitted = 0.0                   # extra positions looked free
        elif c0 <= c1 * 0.1:
            fitted = 10.0                  # all cost, no fixed part: never worth padding
        else:
            fitted = c1 / c0
        # the spread of x decides how much the fit is worth
        weight = min(self.s, var / max(1.0, self.s * self.s))
        return (weight * fitted + PRIOR_WEIGHT * PRIOR_COST_RATIO) / (weight + PRIOR_WEIGHT)

    def choose_width(self, num_rows: int, rows: Sequence[tuple[RowDrafter, int]],
                     max_draft: int, model_rows: Sequence[tuple[RowDrafter, int]] = (),
                     draft_step_cost: float = 0.0) -> int:
        """The step's positions per row L (1 = no speculation), rule 3.

        `num_rows`: every row of the decode call; `rows`: (drafter, draft length)
        of the rows with a prompt-lookup draft; `model_rows`: (drafter, most
        tokens it may draft) of the rows the draft model would draft for, each
        of whose L - 1 sequential draft steps costs `draft_step_cost` (relative
        to a plain step's fixed part c0; rule 7).
        """
        if (not rows and not model_rows) or num_rows <= 0:
            return 1
        ratio = self.ratio
        longest = min(max_draft, max(k for _, k in [*rows, *model_rows]))
        num_plain = num_rows - len(rows) - len(model_rows)
        best, best_value = 1, 0.0
        for width in range(1, longest + 2):
            gain = sum(d.expected_tokens(min(width - 1, k)) for d, k in rows)
            gain += sum(d.expected_tokens(min(width - 1, k), model=True) for d, k in model_rows)
            cost = 1.0 + ratio * num_rows * width
            if model_rows and width > 1:
                cost += draft_step_cost * (width - 1)
            value = (gain + num_plain) / cost
            if value > best_value * (1 + 1e-9):
                best, best_value = width, value
        return best
