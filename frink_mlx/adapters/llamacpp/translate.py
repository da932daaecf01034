"""llama.cpp /completion and /infill <-> GenRequest / events. Pure functions, no I/O.

Request rules:
1. `n_predict` -1 means "until EOS or the context ceiling" (max_tokens None);
   0 and below -1 are refused (llama.cpp's 0 = "evaluate only" is not served).
2. `seed` -1 means random (None). `repeat_penalty` is repetition_penalty over
   the last `repeat_last_n` tokens (llama.cpp's default window is 64; -1 = the
   whole context). `top_k` <= 0 disables top-k. Ranges are checked by
   core/checks.py, which names llama.cpp's fields (PARAM_NAMES).
3. `cache_prompt: false` sets GenRequest.cache_prompt False: the engine then
   neither reuses nor publishes prefix blocks for this request.
4. `grammar` (GBNF) and `json_schema` become the structured-output constraint.
5. `logit_bias` as `[[id, bias|false], ...]` or `{"id": bias}`; `false` bans
   the token. String-token keys are refused by name.
6. A mixed prompt (ids and strings) is resolved to ids by the route through the
   model's tokenizer: the first string piece gets BOS when `add_special` would.

Response rules:
7. Non-streaming: one object with `content`, `stop: true`, `stop_type`
   (eos / word / limit / none), `stopping_word`, `tokens_predicted`,
   `tokens_evaluated`, `tokens_cached`, `timings`, `truncated`.
8. Streaming: `data: {"content", "stop": false}` per text piece, then one final
   frame with `stop: true` and everything of rule 7 (content ""); no `[DONE]`.
"""

from __future__ import annotations

from typing import Any

from ...core.events import Done, ErrorEvent, Event, TextDelta
from ...core.request import GenRequest, ResponseFormat, SamplingParams
from ...errors import InvalidRequest, UnsupportedField
from . import wire

_SAMPLING_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                    "min_p": "min_p", "repeat_penalty": "repetition_penalty",
                    "presence_penalty": "presence_penalty",
                    "frequency_penalty": "frequency_penalty"}
BANNED_BIAS = -1e9
WHOLE_CONTEXT = 1 << 31   # repeat_last_n -1
# core/checks.py names refused fields by these (neutral name -> llama.cpp's)
PARAM_NAMES = {"repetition_penalty": "repeat_penalty", "penalty_context_size": "repeat_last_n",
               "max_tokens": "n_predict", "top_logprobs": "n_probs"}


def logit_bias(raw: list[list[Any]] | dict[str, Any] | None) -> dict[int, float] | None:
    if raw is None:
        return None
    pairs = list(raw.items()) if isinstance(raw, dict) else [tuple(p) for p in raw]
    out: dict[int, float] = {}
    for i, pair in enumerate(pairs):
        if len(pair) != 2:
            raise InvalidRequest(f"'logit_bias[{i}]' must be a [token_id, bias] pair.",
                                 param=f"logit_bias[{i}]")
        token, bias = pair
        if isinstance(token, str) and token.lstrip("-").isdigit():
            token = int(token)
        if not isinstance(token, int) or isinstance(token, bool):
            raise UnsupportedField(f"logit_bias[{i}]", "names a token by its text; use its id")
        if bias is False:
            out[token] = BANNED_BIAS
        elif isinstance(bias, (int, float)) and not isinstance(bias, bool):
            out[token] = float(bias)
        else:
            raise InvalidRequest(f"'logit_bias[{i}]' bias must be a number or false.",
                                 param=f"logit_bias[{i}]")
    return out


def sampling_of(body: wire._Sampling) -> tuple[SamplingParams, frozenset[str]]:
    sampling = SamplingParams()
    sent = set()
    for wire_name, name in _SAMPLING_FIELDS.items():
        value = getattr(body, wire_name)
        if value is not None:
            setattr(sampling, name, value)
            sent.add(name)
    if sampling.top_k < 0:
        sampling.top_k = 0  # llama.cpp: top_k <= 0 disables it
    if body.repeat_last_n is not None:
        # llama.cpp: -1 = the whole context; below -1 is refused by core/checks.py
        sampling.penalty_context_size = (WHOLE_CONTEXT if body.repeat_last_n == -1
                                         else body.repeat_last_n)
    if body.seed is not None and body.seed != -1:
        sampling.seed = body.seed
    sampling.logit_bias = logit_bias(body.logit_bias)
    return sampling, frozenset(sent)


def _response_format(body: wire._Sampling) -> ResponseFormat | None:
    if body.grammar and body.json_schema is not None:
        raise InvalidRequest("Send either 'grammar' or 'json_schema', not both.", param="grammar")
    if body.grammar:
        return ResponseFormat("grammar", grammar=body.grammar, param="grammar")
    if body.json_schema is not None:
        return ResponseFormat("json_schema", schema=body.json_schema, param="json_schema")
    return None


def check_prompt(prompt: str | list[int | str]) -> None:
    if isinstance(prompt, list):
        if prompt and all(isinstance(p, str) for p in prompt) and len(prompt) > 1:
            raise UnsupportedField("prompt", "holds several prompts; send one per request")
        if not prompt:
            raise InvalidRequest("'prompt' must not be empty.", param="prompt")
    elif not prompt:
        raise InvalidRequest("'prompt' must not be empty.", param="prompt")


def to_gen_request(body: wire._Sampling, prompt: str | list[int | str]) -> GenRequest:
    """`prompt` is the body's prompt already resolved (rule 6) or the infill prompt."""
    if body.n_predict == 0 or body.n_predict < -1:
        raise InvalidRequest("'n_predict' must be -1 (until the end) or at least 1.",
                             param="n_predict")
    if body.n_probs:
        raise UnsupportedField("n_probs", "(completion_probabilities) is not supported; use "
                               "/v1/completions with logprobs")
    if body.id_slot not in (None, -1):
        raise UnsupportedField("id_slot", "cannot pin a slot: the engine batches all requests")
    sampling, sent = sampling_of(body)
    return GenRequest(model=body.model or "default", prompt=prompt,
                      max_tokens=None if body.n_predict == -1 else body.n_predict,
                      stop=list(body.stop or []), sampling=sampling, sampling_sent=sent,
                      stream=body.stream, cache_prompt=body.cache_prompt,
                      speculative=body.speculative, ignore_eos=body.ignore_eos,
                      response_format=_response_format(body),
                      param_names=dict(PARAM_NAMES))


def stop_type(done: Done) -> str:
    return {"eos": "eos", "stop_sequence": "word", "length": "limit"}.get(done.stop_kind, "none")


def timings(done: Done) -> dict[str, float]:
    """llama.cpp's timings block from Done.timings (prompt_ms, predicted_ms), with
    `draft_n` / `draft_n_accepted` when drafts were made (llama-server adds them only
    when its own draft count is above zero)."""
    usage = done.usage
    prompt_n = usage.prompt_tokens - usage.cached_tokens
    prompt_ms = float(done.timings.get("prompt_ms", 0.0))
    predicted_ms = float(done.timings.get("predicted_ms", 0.0))
    predicted_n = usage.completion_tokens
    return {"prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1e3 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1e3 * predicted_n / predicted_ms if predicted_ms else 0.0,
            **({"draft_n": usage.draft_tokens, "draft_n_accepted": usage.draft_accepted or 0}
               if usage.draft_tokens else {})}


def final_fields(done: Done, model: str, prompt: str | None) -> dict[str, Any]:
    """Rule 7's fields, minus `content`."""
    kind = stop_type(done)
    return {"stop": True, "model": model, "id_slot": 0, "index": done.index,
            "stop_type": kind, "stopping_word": (done.stop_sequence or "") if kind == "word" else "",
            "tokens_predicted": done.usage.completion_tokens,
            "tokens_evaluated": done.usage.prompt_tokens,
            "tokens_cached": done.usage.cached_tokens,
            "truncated": False, "has_new_line": False, "timings": timings(done),
            **({"prompt": prompt} if prompt is not None else {})}


class CompletionBuilder:
    """Events of one choice -> llama.cpp stream frames and the final object."""

    def __init__(self, model: str, prompt: str | None = None) -> None:
        self.model = model
        self.prompt = prompt
        self.content: list[str] = []
        self.done: Done | None = None

    def feed(self, event: Event) -> list[dict[str, Any]]:
        if isinstance(event, TextDelta):
            if not event.text:
                return []
            self.content.append(event.text)
            return [{"content": event.text, "stop": False, "id_slot": 0, "index": event.index}]
        if isinstance(event, Done):
            self.done = event
            return [{"content": "", **final_fields(event, self.model, self.prompt)}]
        if isinstance(event, ErrorEvent):
            return [{"error": {"code": event.status, "message": event.message,
                               "type": "server_error"}}]
        return []

    def result(self) -> dict[str, Any]:
        if self.done is None:
            raise RuntimeError("result() before Done")
        text = "".join(self.content)
        fields = final_fields(self.done, self.model, self.prompt)
        fields["has_new_line"] = "\n" in text
        return {"content": text, **fields}


# -- infill --------------------------------------------------------------------
FIM_STYLES: tuple[tuple[str, str, str, str | None], ...] = (
    # prefix, suffix, middle, file separator (None: the style has none)
    ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"),   # Qwen2.5-Coder
    ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"),           # StarCoder
    ("<|fim▁begin|>", "<|fim▁hole|>", "<|fim▁end|>", None),                  # DeepSeek-Coder
)


def infill_prompt(body: wire.InfillRequest, style: tuple[str, str, str, str | None]) -> str:
    """llama.cpp's PSM order: [extra files] PRE prefix SUF suffix MID prompt."""
    pre, suf, mid, sep = style
    head = ""
    if body.input_extra:
        if sep is None:
            raise UnsupportedField("input_extra", "needs a file-separator token, which this "
                                   "model's vocabulary lacks")
        head = "".join(f"{sep}{extra.filename}\n{extra.text}" for extra in body.input_extra)
        head += f"{sep}filename\n"   # the current file, as llama.cpp names it
    return f"{head}{pre}{body.input_prefix}{suf}{body.input_suffix}{mid}{body.prompt}"
