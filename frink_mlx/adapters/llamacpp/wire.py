"""llama.cpp server wire structs: /completion, /infill, /tokenize, /detokenize.

Rules:
1. Unknown fields are refused by name (msgspec's "unknown field `mirostat`"):
   llama.cpp has dozens of sampler knobs; the ones listed here are honoured.
2. `model` is a frink extension (llama.cpp serves one model); absent = default.
   So is `speculative` (false: no speculative decoding for this request); the
   drafts counts come back as llama-server's `timings.draft_n` / `draft_n_accepted`.
3. `prompt` is a string, a list of token ids, or a mix of both; a list of
   strings only is llama.cpp's "several prompts" form, refused in translate.py.
"""

from __future__ import annotations

from typing import Any, Union

import msgspec


class _Sampling(msgspec.Struct, forbid_unknown_fields=True):
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
    json_schema: dict[str, Any] | None = None
    grammar: str | None = None
    logit_bias: Union[list[list[Any]], dict[str, Any], None] = None
    id_slot: int | None = None           # accepted only as -1 ("any slot")
    speculative: bool = True             # frink extension: False = no speculative drafts


class CompletionRequest(_Sampling):
    prompt: Union[str, list[Union[int, str]]] = ""


class InfillExtra(msgspec.Struct, forbid_unknown_fields=True):
    text: str
    filename: str = ""


class InfillRequest(_Sampling):
    input_prefix: str = ""
    input_suffix: str = ""
    input_extra: list[InfillExtra] | None = None
    prompt: str = ""


class TokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    content: str
    add_special: bool = False
    with_pieces: bool = False
    parse_special: bool = True
    model: str | None = None


class DetokenizeRequest(msgspec.Struct, forbid_unknown_fields=True):
    tokens: list[int]
    model: str | None = None
