"""Ollama API wire structs (/api/chat, /api/generate, /api/embed, /api/embeddings, ...).

Shapes follow Ollama's docs/api.md and what the official `ollama` Python
client sends (it drops None fields before sending). Rules:
1. Unknown top-level and message fields are refused by name, as on the other
   protocols here; `options` is checked field by field in translate.py
   (OPTION_TREATMENT), so an option that cannot change the answer is a
   documented no-op and one that would is refused naming `options.<name>`.
2. `stream` defaults to true, as in Ollama (a client that says nothing gets NDJSON).
3. `format` is "" / "json" or a JSON Schema object; `think` is a bool or an
   effort ("low", "medium", "high"); `keep_alive` a duration string or seconds.
4. Tool-call arguments are JSON objects on this wire (not JSON text as on OpenAI's).
"""

from __future__ import annotations

from typing import Any, Union

import msgspec

Format = Union[str, dict[str, Any], None]
Think = Union[bool, str, None]
KeepAlive = Union[str, float, None]


class ToolCallFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    arguments: dict[str, Any] = msgspec.field(default_factory=dict)
    index: int | None = None


class ToolCall(msgspec.Struct, forbid_unknown_fields=True):
    function: ToolCallFunction
    id: str | None = None
    type: str | None = None


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True):
    role: str
    content: str | None = None
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None
    tool_call_id: str | None = None


class ToolFunction(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolSpec(msgspec.Struct, forbid_unknown_fields=True):
    function: ToolFunction
    type: str = "function"


class _Generating(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str = ""
    stream: bool = True
    format: Format = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    think: Think = None
    logprobs: bool | None = None
    top_logprobs: int | None = None


class ChatRequest(_Generating, kw_only=True):
    messages: list[ChatMessage] | None = None
    tools: list[ToolSpec] | None = None


class GenerateRequest(_Generating, kw_only=True):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool | None = None
    images: list[str] | None = None


class EmbedRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: str = ""
    input: Union[str, list[str]]
    truncate: bool = True          # Ollama's default: cut inputs to the context length
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The legacy single-prompt embeddings route."""

    model: str = ""
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class ModelRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """/api/show and /api/pull: `model` (older clients send `name`)."""

    model: str = ""
    name: str = ""
    verbose: bool = False
    insecure: bool = False
    stream: bool = True

    @property
    def model_name(self) -> str:
        return self.model or self.name
