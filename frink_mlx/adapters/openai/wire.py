"""OpenAI wire structs (requests) and the refusal list.

One base struct for the domain: `forbid_unknown_fields=False`, because clients
send fields newer than this file and OpenAI ignores harmless ones; unknown ones
are reported in `x-frink-ignored-fields` (http/fields.py). Every field we know
we cannot honour is declared here and refused *by name* in `refuse_unsupported`
(never silently ignore: docs/ARCHITECTURE.md, field policy); fields that cannot change the
answer (`store`, `metadata`, `service_tier`, `prompt_cache_key`,
`safety_identifier`, `verbosity`, llama.cpp's `id_slot`, `samplers`,
`t_max_prompt_ms`) are declared and accepted as no-ops. The field table
(adapters/fields.py, in the README) says which is which. Ranges are msgspec
constraints, so a bad value is a 400 whose `param` names the field.

Extensions beyond OpenAI (as vLLM / mlx-lm / llama-server accept them): `top_k`,
`min_p`, `repetition_penalty`, `ignore_eos`, `cache_salt`, `speculative` (false opts out of
speculative decoding; it never changes the output), `chat_template_kwargs`
(keys the model's template reads; others refused by name), `add_generation_prompt`, `continue_final_message`,
`reasoning_content` on assistant messages; llama-server's `n_predict`,
`cache_prompt`, `grammar`, `json_schema`, `response_format.schema`,
`t_max_predict_ms`, `n_indent` (core/output.py rules 8-9);
`max_tokens: -1` = no limit (up to the context ceiling); `"model": null` = default.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from ...core.checks import MAX_LOGIT_BIAS, MAX_STOP_SEQUENCES, token_id_of
from ...core.request import ResponseFormat
from ...errors import InvalidRequest, UnsupportedField

# llama-server's extensions, honoured on /v1 too (re-exported: the OpenAI adapters call wire.*)
from ..llamacpp.wire import indent_limit as indent_limit
from ..llamacpp.wire import time_budget_ms as time_budget_ms

Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
Unit = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
PositiveInt = Annotated[int, msgspec.Meta(ge=1)]
TopLogprobs = Annotated[int, msgspec.Meta(ge=0, le=20)]


class Wire(msgspec.Struct, forbid_unknown_fields=False, omit_defaults=True):
    """Base for OpenAI request structs: unknown fields pass, known ones are typed."""


class ContentPart(Wire):
    type: str
    text: str | None = None
    image_url: Any = None
    input_audio: Any = None
    file: Any = None


class FunctionCall(Wire):
    name: str
    arguments: str = ""


class WireToolCall(Wire):
    function: FunctionCall
    id: str = ""
    type: str = "function"


class ChatMessage(Wire):
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[WireToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    reasoning: str | None = None
    refusal: str | None = None
    audio: Any = None
    function_call: Any = None


class FunctionDef(Wire):
    name: str
    description: str = ""
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class WireTool(Wire):
    function: FunctionDef
    type: str = "function"


class NamedFunction(Wire):
    name: str


class ToolChoiceObject(Wire):
    function: NamedFunction
    type: str = "function"


class JsonSchemaFormat(Wire):
    name: str = "response"
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class ResponseFormatWire(Wire):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None
    schema: dict[str, Any] | None = None   # llama-server: {"type": "json_object", "schema": ...}


class StreamOptions(Wire):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingWire(Wire):
    """Fields shared by chat and completions."""

    model: str | None = None
    max_tokens: int | None = None          # -1 = no limit; else at least 1 (max_tokens())
    temperature: Temperature | None = None
    top_p: Unit | None = None
    top_k: Annotated[int, msgspec.Meta(ge=-1)] | None = None
    min_p: Unit | None = None
    seed: int | None = None
    stop: Union[str, list[str], None] = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] | None = None
    logit_bias: dict[str, float] | None = None
    n: PositiveInt = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    ignore_eos: bool = False
    cache_salt: str | None = None
    speculative: bool = True  # extension: False opts out of speculative decoding
    # llama-server extensions
    n_predict: int | None = None
    cache_prompt: bool = True
    grammar: str | None = None
    json_schema: dict[str, Any] | None = None
    # accepted, no effect on the answer (module docstring)
    store: bool | None = None
    metadata: Any = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    verbosity: str | None = None
    id_slot: int | None = None
    samplers: Union[list[str], str, None] = None
    t_max_prompt_ms: int | None = None
    t_max_predict_ms: int | None = None   # honoured: time_budget_ms()
    n_indent: int | None = None           # honoured: indent_limit()
    response_fields: list[str] | None = None
    # known but not honoured: refused by name
    best_of: int | None = None
    suffix: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    logprobs: Any = None  # chat: bool; completions: int -- each adapter checks its own


class ChatCompletionRequest(SamplingWire):
    messages: list[ChatMessage] = msgspec.field(default_factory=list)
    max_completion_tokens: int | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[WireTool] | None = None
    tool_choice: Union[str, ToolChoiceObject, None] = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormatWire | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool | None = None   # None: true unless continue_final_message
    continue_final_message: bool = False


class CompletionRequest(SamplingWire):
    # str | list[int] | list[str] | list[list[int]]; the shape is checked in completions.py
    prompt: Union[str, list[Union[int, str, list[int]]], None] = None
    echo: bool = False


# field -> why; each is refused when present with a non-default value
UNSUPPORTED: dict[str, str] = {
    "best_of": "is not supported (use n)",
    "suffix": "is not supported (no fill-in-the-middle)",
    "functions": "is deprecated and not supported; use 'tools'",
    "function_call": "is deprecated and not supported; use 'tool_choice'",
    "audio": "is not supported (text only)",
    "modalities": "is not supported (text only)",
    "prediction": "is not supported (no predicted outputs)",
    "web_search_options": "is not supported (no web search)",
}


def refuse_unsupported(req: SamplingWire) -> None:
    """Refuse every known field this daemon cannot honour (by name)."""
    for name, why in UNSUPPORTED.items():
        value = getattr(req, name)
        if value is None or (name == "best_of" and value == req.n):
            continue
        if name == "modalities" and value == ["text"]:
            continue
        raise UnsupportedField(name, why)
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.",
                             param="stream_options")


def max_tokens(*sent: tuple[str, int | None]) -> int | None:
    """The first length limit the client sent: -1 = none (up to the context ceiling).

    `n_predict` (llama-server) 0 is its warm-up: one token, so the prompt's
    blocks reach the prefix cache."""
    for name, value in sent:
        if value is None:
            continue
        if value == -1:
            return None
        if value == 0 and name == "n_predict":
            return 1
        if value < 1:
            raise InvalidRequest(f"'{name}' must be at least 1 (or -1 for no limit).", param=name)
        return value
    return None


def llamacpp_format(req: SamplingWire, rf: ResponseFormatWire | None = None
                    ) -> ResponseFormat | None:
    """llama-server's `grammar` / `json_schema` / `response_format.schema`, as a ResponseFormat."""
    schema_rf = rf.schema if rf is not None and rf.type != "text" else None
    sent = [name for name, value in (("grammar", req.grammar), ("json_schema", req.json_schema),
                                     ("response_format.schema", schema_rf)) if value]
    if len(sent) > 1 or (sent and rf is not None and rf.json_schema is not None):
        raise InvalidRequest("Send one of 'grammar', 'json_schema' and 'response_format'.",
                             param=sent[0])
    if req.grammar:
        return ResponseFormat("grammar", grammar=req.grammar, param="grammar")
    schema = req.json_schema or schema_rf
    if schema:
        return ResponseFormat("json_schema", schema=schema, param=sent[0])
    return None


def logit_bias_ids(bias: dict[str, float] | None) -> dict[int, float] | None:
    """Keys must spell token ids (core/checks.py rule 5); values within OpenAI's +-100."""
    if not bias:
        return None
    if len(bias) > MAX_LOGIT_BIAS:   # before a key is parsed (core/checks.py rule 4)
        raise InvalidRequest(f"'logit_bias' holds {len(bias)} entries; at most "
                             f"{MAX_LOGIT_BIAS} are accepted.", param="logit_bias")
    out: dict[int, float] = {}
    for key, value in bias.items():
        token = token_id_of(key)
        if token is None or token < 0:
            raise InvalidRequest(f"'logit_bias' keys must be token ids, got {key[:32]!r}.",
                                 param="logit_bias")
        if not -100.0 <= value <= 100.0:
            raise InvalidRequest(f"'logit_bias[{key}]' must be between -100 and 100.",
                                 param="logit_bias")
        out[token] = float(value)
    return out


def stop_list(stop: str | list[str] | None) -> list[str]:
    """The stop strings, empty ones dropped; their count and lengths are checked for
    every protocol alike (core/checks.py rule 4)."""
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if len(stops) > MAX_STOP_SEQUENCES:   # before the list is copied
        raise InvalidRequest(f"'stop' holds {len(stops)} stop sequences; at most "
                             f"{MAX_STOP_SEQUENCES} are accepted.", param="stop")
    return [s for s in stops if s]

