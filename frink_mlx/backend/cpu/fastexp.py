"""exp of t <= 0 without `mx.exp`, for the CPU kernels (kernels.py): softmax and SiLU.

Why: on MLX's Linux CPU backend `mx.exp` is scalar, ~25 ns per element
(numpy's vectorised exp: ~0.5 ns). Multiplies, adds and abs fuse under
`mx.compile` into one generated loop, so e**t is built from them:

y = max(t, -24) / 32, p = a degree-6 polynomial for e^y on [-0.75, 0]
(least squares on Chebyshev nodes), squared five times: p^32 = e^t,
minus its value at t = -24 (3.8e-11) and clamped at 0, so masked
scores give weight exactly 0 with no select in the loop (a select on a
boolean is not vectorised and cost more than all the rest of SwiGLU).
Both clamps are relu(v) = (v + |v|) / 2, not `mx.maximum`: MLX's CPU
maximum tests for NaN first and branches, so where t falls below -24 at
random the mispredictions cost more than the polynomial
(benchmarks/results/cpu_backend-measurements.md). relu(v) is exact;
y = relu(t/32 + 0.75) - 0.75 rounds t by <= 2e-6 absolute. relu(-inf) is NaN, so masks are additive
`MASKED` (-1e9, finite: kernels.py) instead of -inf: a masked score still lands on
weight 0, and a row with every key masked (a padding row) gets finite
garbage instead of NaN.
Relative error <= 3e-6 near 0, <= 1e-5 where e^t > 5e-5, and never more
than 1e-5 relative + 4e-11 absolute (`mx.exp` itself is off by up to
3.5e-6 relative here).
"""

from __future__ import annotations

from functools import partial

import mlx.core as mx
import numpy as np

# e^y on [-0.75, 0], lowest degree first: least squares (relative error) on
# Chebyshev nodes; with five squarings it covers e^t on [-24, 0].
_EXP_COEFFS = (0.9999999967040782, 0.9999996079438743, 0.4999921593017254,
               0.16660660779608683, 0.04144344299904352, 0.007897733332690473,
               0.0009497848131088273)
_EXP_SQUARINGS = 5
_EXP_FLOOR = -24.0


def _relu(v: mx.array) -> mx.array:
    """max(v, 0) without a branch (module docstring); exact, NaN for -inf."""
    return 0.5 * (v + mx.abs(v))


def _exp_unfloored(t: mx.array) -> mx.array:
    """The polynomial-and-squarings e**t of `max(t, _EXP_FLOOR)`."""
    low = _EXP_FLOOR / (1 << _EXP_SQUARINGS)
    y = _relu(t * (1.0 / (1 << _EXP_SQUARINGS)) - low) + low
    p = y * _EXP_COEFFS[-1] + _EXP_COEFFS[-2]
    for c in _EXP_COEFFS[-3::-1]:
        p = p * y + c
    for _ in range(_EXP_SQUARINGS):
        p = p * p
    return p


# What `_exp_unfloored` gives at the floor (3.8e-11), nudged up by 1e-4 relative
# so a fused loop that rounds differently (contracted multiply-adds) still
# lands on exactly 0 there.
_EXP_AT_FLOOR = float(np.asarray(_exp_unfloored(mx.array([_EXP_FLOOR], mx.float32)))[0]) * (1 + 1e-4)


def exp_nonpositive(t: mx.array) -> mx.array:
    """e**t for float32 t <= 0, exactly 0 at and below `_EXP_FLOOR` (module docstring).

    Only multiplies, adds and abs, so `mx.compile` fuses it (and whatever
    elementwise work surrounds it). Subtracting the value at the floor (3.8e-11)
    instead of selecting 0 below it keeps booleans out of the loop: a select
    on a boolean intermediate is not vectorised by the JIT and costs ~7 ns
    per element, more than the whole rest of SwiGLU.
    """
    return _relu(_exp_unfloored(t) - _EXP_AT_FLOOR)


@partial(mx.compile, shapeless=True)
def softmax_numerator(scores: mx.array, row_max: mx.array) -> mx.array:
    """e**(scores - row_max), one fused loop: a softmax's numerator."""
    return exp_nonpositive(scores - row_max)
