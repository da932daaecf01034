"""Range checks on a request's sampling knobs and `n`, stated once for every protocol.

Why one place: every adapter translates its wire format into `SamplingParams`,
and a value out of range that reaches the engine (min_p 2.0, repeat_penalty
1e308 overflowing float32) breaks a batched step -- other requests' rows
with it -- while a huge `n` makes the daemon build per-choice state before the
engine could refuse it. So the daemon checks here, before leasing a model or
allocating anything per choice, and the engine checks the sampling part again
at `submit` (its own callers, e.g. the in-process CLI, skip the daemon).

Rules:
1. Checks use the neutral names (`SamplingParams` fields, `n`, `max_tokens`);
   an adapter whose protocol spells a field differently says so in
   `GenRequest.param_names` (llama.cpp `repeat_penalty`, completions
   `logprobs`), and the InvalidRequest names the field the client sent.
2. Only ranges the engine cannot honour are refused; protocol-specific rules
   (OpenAI's temperature <= 2, Anthropic's <= 1) stay in the adapters.
3. Bounds: temperature 0 (greedy) or in [1e-5, 100]; top_p in (0, 1];
   top_k >= 0 (0 = off); min_p in [0, 1]; presence/frequency penalties in
   [-2, 2]; repetition_penalty in (0, 10]; penalty_context_size >= 0;
   logit_bias values finite with |bias| <= 1e9 (how llama.cpp's `false`, a
   banned token, is written); top_logprobs in [0, 20]; n in [1, max_n].
"""

from __future__ import annotations

import math
from typing import Mapping

from ..errors import InvalidRequest
from .request import GenRequest, SamplingParams

__all__ = ["MAX_TOP_LOGPROBS", "check_request", "check_sampling"]

MAX_TOP_LOGPROBS = 20
MAX_ABS_LOGIT_BIAS = 1e9
_NO_NAMES: Mapping[str, str] = {}


def _refuse(name: str, names: Mapping[str, str], must: str, value: object) -> InvalidRequest:
    wire = names.get(name, name)
    return InvalidRequest(f"'{wire}' must be {must}; got {value!r}.", param=wire)


def _in(value: float, low: float, high: float, *, low_open: bool = False) -> bool:
    if not math.isfinite(value):
        return False
    return (low < value if low_open else low <= value) and value <= high


def check_sampling(params: SamplingParams, names: Mapping[str, str] = _NO_NAMES) -> None:
    """Rule 3 for one row's knobs; raises InvalidRequest naming the first bad field."""
    t = params.temperature
    if not (t == 0.0 or _in(t, 1e-5, 100.0)):
        raise _refuse("temperature", names, "0 (greedy) or between 1e-05 and 100", t)
    if not _in(params.top_p, 0.0, 1.0, low_open=True):
        raise _refuse("top_p", names, "greater than 0 and at most 1", params.top_p)
    if params.top_k < 0:
        raise _refuse("top_k", names, "at least 0 (0 disables it)", params.top_k)
    if not _in(params.min_p, 0.0, 1.0):
        raise _refuse("min_p", names, "between 0 and 1", params.min_p)
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(params, name)
        if not _in(value, -2.0, 2.0):
            raise _refuse(name, names, "between -2 and 2", value)
    if not _in(params.repetition_penalty, 0.0, 10.0, low_open=True):
        raise _refuse("repetition_penalty", names, "greater than 0 and at most 10 (1 = off)",
                      params.repetition_penalty)
    if params.penalty_context_size < 0:
        raise _refuse("penalty_context_size", names, "at least 0", params.penalty_context_size)
    for token, bias in (params.logit_bias or {}).items():
        if not _in(bias, -MAX_ABS_LOGIT_BIAS, MAX_ABS_LOGIT_BIAS):
            raise _refuse("logit_bias", names, f"finite, at most {MAX_ABS_LOGIT_BIAS:g} in size "
                          f"(token {token})", bias)
    if not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
        raise _refuse("top_logprobs", names, f"between 0 and {MAX_TOP_LOGPROBS}",
                      params.top_logprobs)


def check_request(req: GenRequest, *, max_n: int) -> None:
    """Rule 3 for a whole request: cheap, and run before anything is allocated per choice."""
    names = req.param_names
    if not 1 <= req.n <= max_n:
        raise _refuse("n", names, f"between 1 and {max_n} (the server's max_batch)", req.n)
    if req.max_tokens is not None and req.max_tokens < 1:
        raise _refuse("max_tokens", names, "at least 1", req.max_tokens)
    check_sampling(req.sampling, names)
