"""OpenAI wire structs (requests) and the refusal list.

One base struct for the domain: `forbid_unknown_fields=False`, because clients
send fields newer than this file and OpenAI ignores harmless ones -- but every
field we know we cannot honour is declared here and refused *by name* in
`refuse_unsupported` (rule 8 of STYLE.md: never silently ignore). Ranges are
msgspec constraints, so a bad value is a 400 whose `param` names the field.

Extensions beyond OpenAI (as vLLM / mlx-lm accept them): `top_k`, `min_p`,
`repetition_penalty`, `ignore_eos`, `cache_salt`, `speculative` (false opts out of
speculative decoding; it never changes the output), `chat_template_kwargs`
(`enable_thinking` only), `add_generation_prompt`, `continue_final_message`,
`reasoning_content` on assistant messages.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

import msgspec

from ...errors import InvalidRequest, UnsupportedField

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


class StreamOptions(Wire):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class SamplingWire(Wire):
    """Fields shared by chat and completions."""

    model: str = "default"
    max_tokens: PositiveInt | None = None
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
    # known but not honoured: refused by name
    best_of: int | None = None
    suffix: Any = None
    functions: Any = None
    function_call: Any = None
    audio: Any = None
    modalities: Any = None
    prediction: Any = None
    web_search_options: Any = None
    store: bool | None = None
    metadata: Any = None
    service_tier: str | None = None
    logprobs: Any = None  # chat: bool; completions: int -- each adapter checks its own


class ChatCompletionRequest(SamplingWire):
    messages: list[ChatMessage] = msgspec.field(default_factory=list)
    max_completion_tokens: PositiveInt | None = None
    top_logprobs: TopLogprobs | None = None
    tools: list[WireTool] | None = None
    tool_choice: Union[str, ToolChoiceObject, None] = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormatWire | None = None
    reasoning_effort: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
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
    "metadata": "is not supported (completions are not stored)",
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
    if req.store:
        raise UnsupportedField("store", "is not supported (completions are not stored)")
    if req.service_tier not in (None, "auto", "default"):
        raise UnsupportedField("service_tier", "only 'auto' and 'default' are supported")
    if req.stream_options is not None and not req.stream:
        raise InvalidRequest("'stream_options' is only allowed when 'stream' is true.",
                             param="stream_options")


def logit_bias_ids(bias: dict[str, float] | None) -> dict[int, float] | None:
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        if not key.lstrip("-").isdigit() or int(key) < 0:
            raise InvalidRequest(f"'logit_bias' keys must be token ids, got {key!r}.",
                                 param="logit_bias")
        if not -100.0 <= value <= 100.0:
            raise InvalidRequest(f"'logit_bias[{key}]' must be between -100 and 100.",
                                 param="logit_bias")
        out[int(key)] = float(value)
    return out


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > 16:
        raise InvalidRequest("'stop' may hold at most 16 sequences.", param="stop")
    return [s for s in stops if s]
