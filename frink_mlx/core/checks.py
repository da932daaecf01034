"""Range and size checks on a request, stated once for every protocol.

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
4. Sizes, because their cost is paid per token or per step, for every other
   request too (an Anthropic request with 1,000,000 stop_sequences stalled
   the daemon): at most MAX_STOP_SEQUENCES stop strings of at most
   MAX_STOP_CHARS characters each; at most MAX_LOGIT_BIAS logit_bias entries
   (counted as token ids, after llama.cpp's texts are tokenized: its route
   also counts the entries before tokenizing); at most MAX_TOOLS tools; a
   batch of prompts (OpenAI completions, llama.cpp's several prompts) at most
   max_n choices in all, prompts times n (`check_batch`, before any prompt is
   translated). Each refusal names the protocol's field (`stop_sequences`,
   `options.stop`, ...) and says the limit; values are never echoed whole.
5. A logit_bias key sent as text is a token id only when it is 1 to 10 ASCII
   digits, optionally after a minus (`token_id_of`): "\u00b2" passes str.isdigit
   but is no number, and int() of a 4,400-digit key raises -- both were 500s.
   Ids outside the model's vocabulary are refused once its tokenizer is known
   (serving/handles.py).
"""

from __future__ import annotations

import math
import re
from typing import Mapping

from ..errors import InvalidRequest
from .request import GenRequest, SamplingParams

__all__ = ["MAX_LOGIT_BIAS", "MAX_STOP_CHARS", "MAX_STOP_SEQUENCES", "MAX_TOOLS",
           "MAX_TOP_LOGPROBS", "check_batch", "check_request", "check_sampling", "check_sizes",
           "token_id_of"]

MAX_TOP_LOGPROBS = 20
MAX_ABS_LOGIT_BIAS = 1e9
MAX_STOP_SEQUENCES = 64        # rule 4
MAX_STOP_CHARS = 256
MAX_LOGIT_BIAS = 1024
MAX_TOOLS = 512
_TOKEN_ID = re.compile(r"-?[0-9]{1,10}")
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
    """Rules 3-4 for a whole request: cheap, and run before anything is allocated per choice."""
    names = req.param_names
    if not 1 <= req.n <= max_n:
        raise _refuse("n", names, f"between 1 and {max_n} (the server's max_batch)", req.n)
    if req.max_tokens is not None and req.max_tokens < 1:
        raise _refuse("max_tokens", names, "at least 1", req.max_tokens)
    check_sizes(req)
    check_sampling(req.sampling, names)


def _too_many(name: str, names: Mapping[str, str], count: int, limit: int, what: str
              ) -> InvalidRequest:
    wire = names.get(name, name)
    return InvalidRequest(f"'{wire}' holds {count} {what}; at most {limit} are accepted.",
                          param=wire)


def check_sizes(req: GenRequest) -> None:
    """Rule 4's per-request sizes (stop strings, logit_bias entries, tools)."""
    names = req.param_names
    if len(req.stop) > MAX_STOP_SEQUENCES:
        raise _too_many("stop", names, len(req.stop), MAX_STOP_SEQUENCES, "stop sequences")
    for i, stop in enumerate(req.stop):
        if len(stop) > MAX_STOP_CHARS:
            wire = names.get("stop", "stop")
            raise InvalidRequest(f"'{wire}[{i}]' is {len(stop)} characters long; a stop "
                                 f"sequence may be at most {MAX_STOP_CHARS}.", param=wire)
    bias = req.sampling.logit_bias
    if bias is not None and len(bias) > MAX_LOGIT_BIAS:
        raise _too_many("logit_bias", names, len(bias), MAX_LOGIT_BIAS, "entries")
    if len(req.tools) > MAX_TOOLS:
        raise _too_many("tools", names, len(req.tools), MAX_TOOLS, "tools")


def check_batch(num_prompts: int, n: int, *, max_n: int, param: str = "prompt") -> None:
    """Rule 4: a batch of prompts is at most `max_n` choices in all (prompts times n)."""
    if num_prompts > 1 and num_prompts * max(n, 1) > max_n:
        raise InvalidRequest(f"'{param}' holds {num_prompts} prompts of {n} choice(s) each, "
                             f"{num_prompts * n} in all; at most {max_n} (the server's "
                             "max_batch) run in one request.", param=param)


def token_id_of(key: str) -> int | None:
    """Rule 5: a logit_bias key that spells a token id, as an int; None for anything else."""
    return int(key) if _TOKEN_ID.fullmatch(key) else None
