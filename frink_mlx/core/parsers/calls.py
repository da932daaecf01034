"""What every output format shares: parsed calls, argument text, the call book, held-back text.

The families differ in their markup (tool_formats.py, xml_formats.py,
harmony.py), not in what a call becomes. This module is that common half:

1. A body parser returns `ParsedCall`s: the tool's name and its arguments as
   JSON object text (`arguments_text` normalises whatever the family wrote).
2. `typed_value` turns a parameter written as raw text (the XML-like families:
   Qwen3-Coder, GLM-4.5/4.7, MiniMax-M2) into the JSON type its schema
   declares; a declared string stays text, `null` is null. `untyped` says what
   a value with no declared type becomes: "text" (kept as written),
   "structured" (objects and arrays decoded, scalars kept as text) or "json"
   (any JSON value decoded).
3. `CallBook` decides which calls go out and numbers them: a call to a tool
   that was not offered (or any call when tool_choice is "none") is refused,
   and with `parallel_tool_calls` off only the first call is allowed.
4. `safe_prefix_len` says how much of a buffer cannot be the start of any
   marker, so a marker split across chunks never leaks as text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Literal, NamedTuple

from ..events import Event, ToolCallStart
from ..request import GenRequest

Schemas = Mapping[str, dict[str, Any]]   # tool name -> its JSON-schema parameters
NO_SCHEMAS: Schemas = MappingProxyType({})
Untyped = Literal["text", "structured", "json"]


class ParsedCall(NamedTuple):
    name: str
    arguments: str   # JSON object text


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def arguments_text(value: Any) -> str:
    """Arguments as JSON object text; a JSON string holding an object is unwrapped."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise ValueError("tool-call arguments are not JSON") from exc
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise ValueError("tool-call arguments are not a JSON object")
    return json.dumps(value, ensure_ascii=False)


def _declared_types(schema: Any) -> set[str]:
    """The JSON types a parameter schema admits (type, type lists, enum, anyOf/oneOf)."""
    if not isinstance(schema, dict):
        return set()
    kind = schema.get("type")
    types = {kind.lower()} if isinstance(kind, str) else \
        {t.lower() for t in kind if isinstance(t, str)} if isinstance(kind, list) else set()
    if isinstance(schema.get("enum"), list) and all(isinstance(v, str) for v in schema["enum"]):
        types.add("string")
    for key in ("anyOf", "oneOf"):
        for choice in schema.get(key) or []:
            types |= _declared_types(choice)
    return types


def typed_value(raw: str, schema: Any, untyped: Untyped = "structured") -> Any:
    """Rule 2: a parameter's text as the JSON type its schema declares."""
    if raw.lower() == "null":
        return None
    types = _declared_types(schema)
    if types & {"string", "str", "text", "enum"} and not types - {"string", "str", "text",
                                                                  "enum", "null"}:
        return raw
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    if types:
        return value
    if untyped == "text" or untyped == "structured" and not isinstance(value, (dict, list)):
        return raw
    return value


def safe_prefix_len(buf: str, markers: list[str]) -> int:
    """Rule 4: length of `buf` that cannot be the beginning of any marker."""
    hold = 0
    for marker in markers:
        for k in range(min(len(marker) - 1, len(buf)), hold, -1):
            if buf.endswith(marker[:k]):
                hold = k
                break
    return len(buf) - hold


def allowed_tool_names(request: GenRequest) -> frozenset[str]:
    offered = frozenset(tool.name for tool in request.tools)
    if request.tool_choice == "none":
        return frozenset()
    if request.tool_choice in ("auto", "required"):
        return offered
    return offered & {request.tool_choice}


class CallBook:
    """Rule 3: which calls of one choice go out, and their call indexes."""

    def __init__(self, request: GenRequest, index: int) -> None:
        self.index = index
        self.allowed = allowed_tool_names(request)
        self.schemas: Schemas = {tool.name: tool.parameters for tool in request.tools}
        self.max_calls = None if request.parallel_tool_calls else 1
        self.num_calls = 0
        self.saw_tool_call = False

    def may_call(self, name: str) -> bool:
        if self.max_calls is not None and self.num_calls >= self.max_calls:
            return False
        return name in self.allowed

    def start(self, out: list[Event], name: str) -> int:
        call_index = self.num_calls
        self.num_calls += 1
        self.saw_tool_call = True
        out.append(ToolCallStart(call_index, new_call_id(), name, index=self.index))
        return call_index
