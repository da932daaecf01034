"""llama.cpp server wire structs: /completion, /infill, /tokenize, /detokenize.

Rules:
1. Unknown fields are reported, not refused (x-frink-ignored-fields;
   http/fields.py), as llama-server ignores what it does not know. Sampler
   knobs we do not implement and that change the output when set (`mirostat`,
   `typical_p`, `dynatemp_range`, `xtc_probability`, `dry_multiplier`,
   `top_n_sigma`, `lora`) are declared in `REFUSED_UNLESS` and refused by name
   when they differ from llama.cpp's neutral default.
2. `model` is a frink extension (llama.cpp serves one model); absent = default.
   So is `speculative` (false: no speculative decoding for this request); the
   drafts counts come back as llama-server's `timings.draft_n` / `draft_n_accepted`.
3. `prompt` is a string, a list of token ids, or a mix of both; a list of
   strings, or a list holding lists, is llama.cpp's "several prompts" form
   (translate.py rule 9).
4. What llama.vim and llama.vscode send on every request is declared:
   `t_max_prompt_ms`, `samplers`, `id_slot`, `input_extra[].time` are accepted
   no-ops (the field table in adapters/fields.py says why); `response_fields`,
   `cache_prompt`, `n_predict: 0` (a warm-up), `n_probs`, `return_tokens`,
   `t_max_predict_ms` and `n_indent` are honoured (translate.py, frames.py).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

from ...errors import UnsupportedField


class _Sampling(msgspec.Struct, forbid_unknown_fields=False):
    model: str | None = None
    n_predict: int = -1
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: list[str] | None = None
    stream: bool = False
    cache_prompt: bool = True
    ignore_eos: bool = False
    n_probs: int = 0
    post_sampling_probs: bool = False
    return_tokens: bool = False
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    logit_bias: Union[list[list[Any]], dict[str, Any], None] = None
    response_fields: list[str] | None = None
    speculative: bool = True      # frink extension: False = no speculative drafts
    # accepted, no effect (rule 4)
    id_slot: int | None = None
    n_indent: int | None = None
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None
    samplers: Union[list[str], str, None] = None
    n_keep: int | None = None
    min_keep: int | None = None
    timings_per_token: bool | None = None
    # refused unless neutral (rule 1)
    mirostat: int = 0
    typical_p: float = 1.0
    dynatemp_range: float = 0.0
    xtc_probability: float = 0.0
    dry_multiplier: float = 0.0
    top_n_sigma: float = -1.0
    n_cmpl: int = 1               # completions of one prompt (1..4); an array when > 1
    lora: Any = None

    def __post_init__(self) -> None:
        for name, neutral in REFUSED_UNLESS.items():
            if getattr(self, name) not in neutral:
                raise UnsupportedField(name, "is not supported by this server's sampler "
                                       f"(only {neutral[0]!r})")


# field -> the values that mean "off" (the first is llama.cpp's default)
REFUSED_UNLESS: dict[str, tuple[Any, ...]] = {
    "mirostat": (0,), "typical_p": (1.0,), "dynatemp_range": (0.0,),
    "xtc_probability": (0.0,), "dry_multiplier": (0.0,), "top_n_sigma": (-1.0, 0.0),
    "lora": (None, []), "post_sampling_probs": (False,),
}


class PromptObject(msgspec.Struct, forbid_unknown_fields=False):
    """llama-server's JSON prompt: text plus media (`multimodal_data`, refused: text only)."""

    prompt_string: str
    multimodal_data: list[Any] | None = None


Prompts = Union[str, PromptObject, list[Union[int, str, PromptObject, list[Union[int, str]]]]]


class CompletionRequest(_Sampling):
    prompt: Prompts = ""


class InfillExtra(msgspec.Struct, forbid_unknown_fields=False):
    text: str
    filename: str = ""
    time: Any = None              # llama.vim's reltime() of the chunk; no effect


class InfillRequest(_Sampling):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillExtra] | None = None
    prompt: str = ""


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=False):
    content: str
    add_special: bool = False
    with_pieces: bool = False
    parse_special: bool = True
    model: str | None = None


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=False):
    tokens: list[int]
    model: str | None = None


def time_budget_ms(t_max_predict_ms: int | None) -> float | None:
    """llama-server's `t_max_predict_ms`: > 0 bounds a completion once it wrote a newline
    (core/output.py rule 8); 0 or less is no budget."""
    return t_max_predict_ms if t_max_predict_ms is not None and t_max_predict_ms > 0 else None


def indent_limit(n_indent: int | None) -> int | None:
    """llama-server's `n_indent`: > 0 ends the answer at the first later line indented
    less (core/output.py rule 9); 0 or less is no limit."""
    return n_indent if n_indent is not None and n_indent > 0 else None
