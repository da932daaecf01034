"""llama.cpp /completion and /infill -> GenRequest. Pure functions, no I/O.

Request rules:
1. `n_predict` -1 means "until EOS or the context ceiling" (max_tokens None);
   0 is a warm-up (llama.vim sends one whenever its context changes): the
   prompt is prefilled -- which publishes its blocks to the prefix cache -- with
   one decode step whose token is discarded (frames.py rule 6); below -1 is
   refused.
2. `seed` -1 means random (None). `repeat_penalty` is repetition_penalty over
   the last `repeat_last_n` tokens (llama.cpp's default window is 64; -1 = the
   whole context). `top_k` <= 0 disables top-k. Ranges are checked by
   core/checks.py, which names llama.cpp's fields (PARAM_NAMES).
3. `cache_prompt: false` sets GenRequest.cache_prompt False: the engine then
   neither reuses nor publishes prefix blocks for this request.
4. `grammar` (GBNF) and `json_schema` become the structured-output constraint.
5. `logit_bias` as `[[id, bias|false], ...]` or `{"id": bias}`; `false` bans
   the token. Text keys arrive here already tokenized (the route's rule 6).
6. A mixed prompt (ids and strings) is resolved to ids by the route through the
   model's tokenizer: the first string piece gets BOS when `add_special` would.

7. `n_cmpl` N > 1 (llama.vscode sends 3) samples N completions of the prompt,
   answered as an array of N results (non-streaming only, as llama-server).
8. `n_probs` N > 0 asks for logprobs with N alternatives per token
   (`completion_probabilities`, frames.py rule 4); `id_slot` is accepted and
   ignored: every request shares one prefix cache, so the slot a client pins
   cannot change what it gets, only where llama-server would have cached it.

9. Several prompts in one request (`["a", "b"]`, `[[12, 34], "c"]`: a list of
   strings, or a list holding lists -- llama-server's multi-prompt forms) run
   together and are answered as an array, one result per prompt (times
   `n_cmpl`), in order; not with `stream`. A single string or a list of ids
   and text pieces stays one prompt (rule 6).
10. A JSON prompt object `{"prompt_string": ..., "multimodal_data": [...]}`
   (llama-server's multimodal form, alone or as one of several prompts) is its
   text with its images: each `MEDIA_MARKER` in the text stands for the next
   entry of `multimodal_data` (base64, as llama-server takes it; a data: URL is
   read too), as mtmd substitutes them, and becomes an image part
   (core/images.py rule 1) named `prompt.multimodal_data[k]` (or
   `prompt[i].multimodal_data[k]`): a vision model reads it where the marker
   stood (serving/vision.py rule 6), a text-only model the placeholder text. A
   marker count that differs from the entries, or an entry that is not a
   string, is a 400 naming `multimodal_data`.
11. `t_max_predict_ms` > 0 bounds the time a completion may run once it has
   written a newline (core/output.py rule 8), as llama-server does: llama.vim
   sends 1000 so a slow machine still answers a FIM request in about a second.
   `n_indent` > 0 ends it at the first later line indented less (core/output.py
   rule 9): llama.vim sends the cursor line's indentation, so a suggestion stops
   where the block does.

Responses are built by frames.py.
"""

from __future__ import annotations

from typing import Any

from ...core.checks import check_batch, token_id_of
from ...core.images import ImageRef, from_url, image_part
from ...core.request import GenRequest, ResponseFormat, SamplingParams
from ...errors import InvalidRequest, UnsupportedField
from . import wire
from .frames import CompletionBuilder, stop_type, timings  # noqa: F401 - re-exported

_SAMPLING_FIELDS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p",
                    "min_p": "min_p", "repeat_penalty": "repetition_penalty",
                    "presence_penalty": "presence_penalty",
                    "frequency_penalty": "frequency_penalty"}
BANNED_BIAS = -1e9
MEDIA_MARKER = "<__media__>"   # rule 10: mtmd's default marker (/props `media_marker`)
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
        if isinstance(token, str):
            token = token_id_of(token)   # texts were tokenized by the route (rule 5)
        if not isinstance(token, int) or isinstance(token, bool):
            raise InvalidRequest(f"'logit_bias[{i}]' must name a token id or a text.",
                                 param=f"logit_bias[{i}]")
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


def _text_of(prompt: Any, where: str, images: list[ImageRef]) -> Any:
    """Rule 10: a JSON prompt object is its text, its media as image parts in `images`."""
    if not isinstance(prompt, wire.PromptObject):
        return prompt
    media = prompt.multimodal_data or []
    pieces = prompt.prompt_string.split(MEDIA_MARKER)
    if len(pieces) - 1 != len(media):
        raise InvalidRequest(f"'{where}.multimodal_data' holds {len(media)} entries for "
                             f"{len(pieces) - 1} {MEDIA_MARKER} markers in the prompt; send one "
                             "marker per entry.", param=f"{where}.multimodal_data")
    text = pieces[0]
    for k, (data, piece) in enumerate(zip(media, pieces[1:])):
        path = f"{where}.multimodal_data[{k}]"
        if not isinstance(data, str):
            raise InvalidRequest(f"'{path}' must be a base64 string.", param=path)
        ref = from_url(path, data) if data.startswith("data:") else ImageRef(path, data=data)
        text += image_part(ref, images) + piece
    return text


Prompt = tuple[str | list[int | str], list[ImageRef]]   # a prompt and its image parts


def split_prompts(prompt: wire.Prompts, *, stream: bool, n: int = 1, max_n: int | None = None
                  ) -> list[Prompt]:
    """Rule 9: the prompts of one request -- several for `["a", "b"]` or `[[1, 2], "c"]` --
    each with the image parts of its prompt object (rule 10); with `max_n`, at most that
    many choices in all (core/checks.py rule 4)."""
    images: list[list[ImageRef]] = []
    if isinstance(prompt, list):
        images = [[] for _ in prompt]
        prompt = [_text_of(p, f"prompt[{i}]", images[i]) for i, p in enumerate(prompt)]
    else:
        images = [[]]
        prompt = _text_of(prompt, "prompt", images[0])
    if not isinstance(prompt, list) or not prompt:
        return [(prompt, images[0])]   # type: ignore[list-item]
    nested = any(isinstance(p, list) for p in prompt)
    if not nested and not all(isinstance(p, str) for p in prompt):
        return [(prompt, [])]   # type: ignore[list-item]  # ids, or ids mixed with text: one prompt
    if len(prompt) == 1:
        return [(prompt[0], images[0])]   # type: ignore[list-item]
    if nested and any(isinstance(p, int) for p in prompt):
        raise InvalidRequest("'prompt' mixes token ids with a list of prompts; send each prompt "
                             "as a string or a list.", param="prompt")
    if stream:
        raise UnsupportedField("prompt", "holds several prompts, which cannot be streamed; "
                               "send one per request or stream: false")
    if max_n is not None:
        check_batch(len(prompt), n, max_n=max_n)
    return list(zip(prompt, images))   # type: ignore[arg-type]


def check_prompt(prompt: str | list[int | str]) -> None:
    if not prompt:
        raise InvalidRequest("'prompt' must not be empty.", param="prompt")


def to_gen_request(body: wire._Sampling, prompt: str | list[int | str],
                   images: list[ImageRef] | None = None) -> GenRequest:
    """`prompt` is the body's prompt already resolved (rule 6) or the infill prompt;
    `images` its image parts (rule 10)."""
    if body.n_predict < -1:
        raise InvalidRequest("'n_predict' must be -1 (until the end), 0 (a warm-up) or a "
                             "token count.", param="n_predict")
    if not 1 <= body.n_cmpl <= 4:
        raise InvalidRequest("'n_cmpl' must be between 1 and 4.", param="n_cmpl")
    if body.n_cmpl > 1 and body.stream:
        raise UnsupportedField("n_cmpl", "above 1 is not supported with stream")
    if body.n_probs < 0:
        raise InvalidRequest("'n_probs' must not be negative.", param="n_probs")
    sampling, sent = sampling_of(body)
    if body.n_probs:
        sampling.logprobs, sampling.top_logprobs = True, body.n_probs
    max_tokens = None if body.n_predict == -1 else max(1, body.n_predict)  # rule 1
    return GenRequest(model=body.model or "default", prompt=prompt, max_tokens=max_tokens,
                      n=body.n_cmpl, images=list(images or []),
                      stop=list(body.stop or []), sampling=sampling, sampling_sent=sent,
                      stream=body.stream, cache_prompt=body.cache_prompt,
                      speculative=body.speculative, ignore_eos=body.ignore_eos,
                      max_predict_ms=wire.time_budget_ms(body.t_max_predict_ms),  # rule 11
                      min_indent=wire.indent_limit(body.n_indent),
                      response_format=_response_format(body),
                      param_names=dict(PARAM_NAMES))


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


def generation_settings(body: wire._Sampling, req: GenRequest,
                        sampling: SamplingParams | None = None) -> dict[str, Any]:
    """The parameters this request ran with, in llama.cpp's names (`generation_settings`):
    `sampling` is what the run used (the model's defaults filled in), else the request's."""
    s = sampling if sampling is not None else req.sampling
    return {"n_predict": body.n_predict, "seed": s.seed if s.seed is not None else -1,
            "temperature": s.temperature, "top_k": s.top_k, "top_p": s.top_p, "min_p": s.min_p,
            "repeat_penalty": s.repetition_penalty,
            "repeat_last_n": -1 if s.penalty_context_size == WHOLE_CONTEXT
            else s.penalty_context_size,
            "presence_penalty": s.presence_penalty, "frequency_penalty": s.frequency_penalty,
            "stop": list(req.stop), "stream": req.stream, "n_probs": body.n_probs,
            "ignore_eos": req.ignore_eos, "cache_prompt": req.cache_prompt,
            "grammar": body.grammar or "", "samplers": body.samplers or [],
            "logit_bias": [{"bias": None if bias <= BANNED_BIAS else bias, "token": token}
                           for token, bias in (s.logit_bias or {}).items()],
            "model": req.model}
