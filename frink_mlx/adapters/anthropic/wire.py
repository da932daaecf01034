"""Anthropic Messages API wire structs (requests only; responses are built as dicts).

Rules:
1. Unknown fields are reported, not refused (x-frink-ignored-fields; http/fields.py),
   as with every protocol. Known fields this server cannot honour and whose
   absence would change the answer (`container`, `mcp_servers`) are declared
   and refused by name as the request decodes (`MessagesRequest.__post_init__`);
   `service_tier` and `metadata` are accepted and have no effect on the answer.
2. Content blocks are a tagged union on `type`. Blocks the server cannot serve
   (images, documents, server-tool results) decode into `OtherBlock`-like structs
   so translate.py can refuse them naming their position, rather than failing
   with an opaque union error.
3. `temperature`/`top_p`/`top_k` are kept although the 2026 SDK no longer
   lists them (older clients and `extra_body` still send them).
4. `cache_control` (per block and top-level) is accepted everywhere the API allows it and has no effect
   beyond what the automatic prefix cache already does (it is a hint, not a
   semantic change); `citations` on text blocks sent back by a client likewise.
5. `speculative: false` (a frink extension, e.g. through the SDK's `extra_body`)
   turns speculative decoding off for the request; it never changes the answer.
   Usage then carries `draft_tokens` / `draft_accepted` only when it speculated.
"""

from __future__ import annotations

from typing import Any, Literal, Union

import msgspec

from ...errors import UnsupportedField


class _Block(msgspec.Struct, tag_field="type", forbid_unknown_fields=False, omit_defaults=True):
    pass


class TextBlock(_Block, tag="text"):
    text: str
    cache_control: dict[str, Any] | None = None
    citations: list[dict[str, Any]] | None = None


class ToolUseBlock(_Block, tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: dict[str, Any] | None = None
    caller: dict[str, Any] | None = None        # echoed back by SDK clients; not used
    toolset_name: str | None = None


class ImageBlock(_Block, tag="image"):
    source: dict[str, Any]
    cache_control: dict[str, Any] | None = None


class DocumentBlock(_Block, tag="document"):
    source: dict[str, Any]
    title: str | None = None
    context: str | None = None
    citations: dict[str, Any] | None = None
    cache_control: dict[str, Any] | None = None


class ToolReferenceBlock(_Block, tag="tool_reference"):
    """A tool search's result: loads the deferred tool it names (translate rule 7)."""

    tool_name: str


class ToolResultBlock(_Block, tag="tool_result"):
    tool_use_id: str
    content: Union[str, list[Union[TextBlock, ImageBlock, DocumentBlock,
                                   ToolReferenceBlock]]] = ""
    is_error: bool = False
    cache_control: dict[str, Any] | None = None
    toolset_name: str | None = None


class ThinkingBlock(_Block, tag="thinking"):
    thinking: str
    signature: str = ""


class RedactedThinkingBlock(_Block, tag="redacted_thinking"):
    data: str


ContentBlock = Union[TextBlock, ToolUseBlock, ToolResultBlock, ThinkingBlock,
                     RedactedThinkingBlock, ImageBlock, DocumentBlock]


class MessageParam(msgspec.Struct, forbid_unknown_fields=False):
    role: Literal["user", "assistant", "system"]   # "system": Claude Code 2.1 (translate rule 1)
    content: Union[str, list[ContentBlock]]


class ToolParam(msgspec.Struct, forbid_unknown_fields=False):
    name: str
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    description: str = ""
    type: str | None = None            # "custom" or absent; server tools are refused by name
    cache_control: dict[str, Any] | None = None
    strict: bool | None = None         # true: arguments grammar-bound (core/structured.py rule 6)
    eager_input_streaming: bool | None = None   # input is always streamed as generated
    defer_loading: bool = False        # true: out of the prompt until referenced (translate rule 7)


class _Choice(msgspec.Struct, tag_field="type", forbid_unknown_fields=False):
    pass


class ToolChoiceAuto(_Choice, tag="auto"):
    disable_parallel_tool_use: bool = False


class ToolChoiceAny(_Choice, tag="any"):
    disable_parallel_tool_use: bool = False


class ToolChoiceTool(_Choice, tag="tool"):
    name: str
    disable_parallel_tool_use: bool = False


class ToolChoiceNone(_Choice, tag="none"):
    pass


ToolChoice = Union[ToolChoiceAuto, ToolChoiceAny, ToolChoiceTool, ToolChoiceNone]


# `display`: "summarized" and "updates" (Claude Code 2.1) are no-ops -- a local model's
# thinking is returned whole, which is what both ask to see; "omitted" leaves the text out
# (translate rule 5, frames rule 2).
ThinkingDisplay = Literal["summarized", "updates", "omitted"]


class ThinkingEnabled(_Choice, tag="enabled"):
    budget_tokens: int
    display: ThinkingDisplay | None = None


class ThinkingAdaptive(_Choice, tag="adaptive"):
    display: ThinkingDisplay | None = None


class ThinkingBetweenTools(_Choice, tag="between_tools"):
    pass


class ThinkingDisabled(_Choice, tag="disabled"):
    pass


Thinking = Union[ThinkingEnabled, ThinkingAdaptive, ThinkingBetweenTools, ThinkingDisabled]


class JSONOutputFormat(msgspec.Struct, forbid_unknown_fields=False):
    type: Literal["json_schema"]
    schema: dict[str, Any]


class OutputConfig(msgspec.Struct, forbid_unknown_fields=False):
    format: JSONOutputFormat | None = None
    effort: Literal["low", "medium", "high", "xhigh", "max"] | None = None   # translate rule 5


class KeepTurns(msgspec.Struct, forbid_unknown_fields=False):
    type: Literal["thinking_turns"]
    value: int


class ContextEdit(msgspec.Struct, forbid_unknown_fields=False):
    """One `context_management.edits[]` entry (translate rule 8); `trigger`, `clear_at_least`
    and the other knobs of `clear_tool_uses_*` are not declared: that edit is refused."""

    type: str
    keep: Union[Literal["all"], KeepTurns, None] = None


class ContextManagement(msgspec.Struct, forbid_unknown_fields=False):
    edits: list[ContextEdit] = msgspec.field(default_factory=list)


class Metadata(msgspec.Struct, forbid_unknown_fields=False):
    user_id: str | None = None


class _ServerFeatures(msgspec.Struct, kw_only=True):
    """Request-level fields of server-side features (rule 1)."""

    service_tier: str | None = None               # no-op: one local tier
    container: Any = None                          # refused by name when set
    mcp_servers: Any = None                        # refused by name when set

    def __post_init__(self) -> None:
        for name, why in (("container", "is not supported (no server-side code execution)"),
                          ("mcp_servers", "is not supported (no server-side MCP connector)")):
            if getattr(self, name) not in (None, [], ""):
                raise UnsupportedField(name, why)


class CountTokensRequest(_ServerFeatures, forbid_unknown_fields=False):
    model: str
    messages: list[MessageParam]
    system: Union[str, list[TextBlock], None] = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    cache_control: dict[str, Any] | None = None


class MessagesRequest(_ServerFeatures, forbid_unknown_fields=False):
    model: str
    max_tokens: int
    messages: list[MessageParam]
    system: Union[str, list[TextBlock], None] = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None
    metadata: Metadata | None = None
    output_config: OutputConfig | None = None
    context_management: ContextManagement | None = None
    cache_control: dict[str, Any] | None = None
    speculative: bool = True  # frink extension (rule 5): False opts out of speculation
