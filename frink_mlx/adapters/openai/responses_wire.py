"""OpenAI Responses API request structs (responses are built as dicts by responses.py).

Rules:
1. Unknown fields are reported, not refused (http/fields.py); the Responses
   features this server lacks and that would change the answer (`background`,
   `conversation`, `prompt`, `top_logprobs`, `max_tool_calls`, logprobs in
   `include`) are declared here and refused by name in responses.py; the ones
   that cannot change it (`prompt_cache_key`, `safety_identifier`,
   `service_tier`, `include` items we cannot produce, `text.verbosity`) are
   declared and accepted as no-ops (the field table: adapters/fields.py).
   The refusals run as the request decodes (`ResponsesRequest.__post_init__`).
2. `input` items are decoded per item `type` (a message may omit `type`), so
   an unsupported item (`item_reference`, `file_search_call`, ...) is refused
   naming its position, `input[3].type`.
3. Items echoed back from an earlier response (output messages, reasoning,
   function calls) carry `id`/`status`/`phase`/`caller`; those are
   bookkeeping of the earlier turn, accepted and not used. A call's
   `namespace` names the tool together with `name` (responses_tools.py rule 2).
4. `client_metadata` (Codex sends it) is a declared no-op.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

from ...errors import UnsupportedField


class _Item(msgspec.Struct, forbid_unknown_fields=False):
    pass


class InputText(msgspec.Struct, tag_field="type", tag="input_text", forbid_unknown_fields=False):
    text: str


class OutputText(msgspec.Struct, tag_field="type", tag="output_text", forbid_unknown_fields=False):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] | None = None


class InputImage(msgspec.Struct, tag_field="type", tag="input_image", forbid_unknown_fields=False):
    image_url: str | None = None
    file_id: str | None = None
    detail: str | None = None


class InputFile(msgspec.Struct, tag_field="type", tag="input_file", forbid_unknown_fields=False):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


class Refusal(msgspec.Struct, tag_field="type", tag="refusal", forbid_unknown_fields=False):
    refusal: str


ContentPart = Union[InputText, OutputText, InputImage, InputFile, Refusal]


class MessageItem(_Item):
    role: Literal["user", "assistant", "system", "developer"]
    content: Union[str, list[ContentPart]]
    type: Literal["message"] = "message"
    id: str | None = None
    status: str | None = None
    phase: str | None = None


class FunctionCallItem(_Item):
    call_id: str
    name: str
    arguments: str
    type: Literal["function_call"] = "function_call"
    id: str | None = None
    status: str | None = None
    caller: dict[str, Any] | None = None
    namespace: str | None = None
    is_async: bool | None = msgspec.field(default=None, name="async")


class FunctionCallOutputItem(_Item):
    call_id: str
    output: Union[str, list[ContentPart]]
    type: Literal["function_call_output"] = "function_call_output"
    id: str | None = None
    status: str | None = None
    caller: dict[str, Any] | None = None
    name: str | None = None
    namespace: str | None = None


class ReasoningText(msgspec.Struct, forbid_unknown_fields=False):
    text: str
    type: str = "reasoning_text"


class ReasoningItem(_Item):
    summary: list[ReasoningText] = msgspec.field(default_factory=list)
    content: list[ReasoningText] | None = None
    type: Literal["reasoning"] = "reasoning"
    id: str | None = None
    status: str | None = None
    encrypted_content: str | None = None


INPUT_ITEM_TYPES: dict[str, type[_Item]] = {
    "message": MessageItem,
    "function_call": FunctionCallItem,
    "function_call_output": FunctionCallOutputItem,
    "reasoning": ReasoningItem,
}


class CustomToolCallItem(_Item):
    call_id: str
    name: str
    input: str
    type: Literal["custom_tool_call"] = "custom_tool_call"
    id: str | None = None
    status: str | None = None
    caller: dict[str, Any] | None = None
    namespace: str | None = None
    is_async: bool | None = msgspec.field(default=None, name="async")


class CustomToolCallOutputItem(_Item):
    call_id: str
    output: Union[str, list[ContentPart]]
    type: Literal["custom_tool_call_output"] = "custom_tool_call_output"
    id: str | None = None
    status: str | None = None
    caller: dict[str, Any] | None = None
    name: str | None = None
    namespace: str | None = None


INPUT_ITEM_TYPES.update({"custom_tool_call": CustomToolCallItem,
                         "custom_tool_call_output": CustomToolCallOutputItem})


class FunctionTool(msgspec.Struct, forbid_unknown_fields=False):
    """One `tools` entry the server offers (responses_tools.py); hosted tools never
    decode as this (`ResponsesRequest.tools` stays raw so their fields are not
    reported as unknown)."""

    type: str
    name: str | None = None
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    tools: list[FunctionTool] | None = None    # namespace: its member function tools
    format: dict[str, Any] | None = None       # custom: text, or a lark/regex grammar
    execution: str | None = None               # tool_search: "client" in Codex


class FunctionChoice(msgspec.Struct, forbid_unknown_fields=False):
    type: str
    name: str | None = None


class Reasoning(msgspec.Struct, forbid_unknown_fields=False):
    effort: str | None = None
    summary: str | None = None
    generate_summary: str | None = None


class TextFormat(msgspec.Struct, forbid_unknown_fields=False):
    type: Literal["text", "json_object", "json_schema"]
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextConfig(msgspec.Struct, forbid_unknown_fields=False):
    format: TextFormat | None = None
    verbosity: str | None = None


class ResponsesRequest(msgspec.Struct, forbid_unknown_fields=False):
    model: str | None = None
    input: Union[str, list[dict[str, Any]], None] = None
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None    # decoded per type by responses_tools.py
    tool_choice: Union[Literal["auto", "none", "required"], FunctionChoice, None] = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    reasoning: Reasoning | None = None
    store: bool = True
    previous_response_id: str | None = None
    stream: bool = False
    metadata: dict[str, str] | None = None
    parallel_tool_calls: bool | None = None
    text: TextConfig | None = None
    user: str | None = None
    truncation: Literal["disabled"] | None = None
    include: list[str] | None = None
    prompt_cache_key: str | None = None
    prompt_cache_retention: str | None = None
    safety_identifier: str | None = None
    service_tier: str | None = None
    stream_options: dict[str, Any] | None = None
    client_metadata: dict[str, Any] | None = None   # Codex's: a no-op
    # known but not honoured: refused by name in responses.py when set
    background: bool | None = None
    conversation: Any = None
    prompt: Any = None
    top_logprobs: int | None = None
    max_tool_calls: int | None = None

    def __post_init__(self) -> None:
        refuse_unsupported(self)


# include items naming output this server never produces (responses.py rule 7)
NOOP_INCLUDES = frozenset({
    "reasoning.encrypted_content", "file_search_call.results", "web_search_call.results",
    "web_search_call.action.sources", "code_interpreter_call.outputs",
    "computer_call_output.output.image_url", "message.input_image.image_url",
})
_REFUSED = (("conversation", "is not supported; use previous_response_id"),
            ("prompt", "(stored prompt templates) is not supported"),
            ("max_tool_calls", "is not supported"),
            ("top_logprobs", "is not supported (no logprobs in Responses)"))


def refuse_unsupported(req: ResponsesRequest) -> None:
    """Fields whose absence from the answer the client would notice (rule 1)."""
    for i, item in enumerate(req.include or []):
        if item not in NOOP_INCLUDES:
            raise UnsupportedField(f"include[{i}]", f"'{item}' cannot be produced by this server")
    if req.background:
        raise UnsupportedField("background", "is not supported (responses run in the foreground)")
    for name, why in _REFUSED:
        if getattr(req, name) not in (None, 0):
            raise UnsupportedField(name, why)
