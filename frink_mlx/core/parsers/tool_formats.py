"""Tool-call markup per model family: where a call starts and ends, and how its body parses.

mlx-lm ships one `parse_tool_call(text, tools)` module per family under
`mlx_lm.tool_parsers`, but importing any of them runs `mlx_lm/__init__.py`,
which imports MLX -- and `core/` must never import MLX (it is used by adapters
and tests with no accelerator). So the three families we must serve are
re-implemented here, small, following mlx-lm's modules of the same names:

1. `json_tools` (Hermes, Qwen 2.5/3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
   one JSON object per tag pair, tags may repeat.
2. `mistral`: `[TOOL_CALLS]` then either a JSON list `[{"name", "arguments"}, ...]`
   (v0.3) or repeated `name[ARGS]{...}` (v11+); no end marker, runs to EOS.
3. `qwen3_coder` (Qwen3-Coder): `<tool_call><function=NAME><parameter=KEY>value
   </parameter>...</function></tool_call>`; values take the type the tool's
   schema declares.
4. `llama3_json` (Llama 3.1/3.2 JSON tool calling): the whole reply is
   `{"name": ..., "parameters": {...}}` (several joined by `;`), optionally after
   `<|python_tag|>`; no end marker. Recognised only at the very start of a reply
   and only when tools were offered (a JSON-mode reply must stay text).

A body parser takes the body and the offered tools' parameter schemas and
returns `[(name, arguments_json_text), ...]`; it raises
`ValueError` for a body that is not a tool call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

ParsedCall = tuple[str, str]
Schemas = Mapping[str, dict[str, Any]]   # tool name -> its JSON-schema parameters
NO_SCHEMAS: Schemas = MappingProxyType({})


def _arguments_text(value: Any) -> str:
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


def _call_from_object(obj: Any, args_keys: tuple[str, ...]) -> ParsedCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a tool call object")
    for key in args_keys:
        if key in obj:
            return obj["name"], _arguments_text(obj[key])
    return obj["name"], "{}"


def parse_json_tools(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    return [_call_from_object(json.loads(body.strip()), ("arguments", "parameters"))]


_MISTRAL_HEADER = re.compile(r"([\w.-]+)\s*\[ARGS\]\s*")


def parse_mistral(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    text = body.strip()
    if text.startswith("["):
        payload = json.loads(text)
        if not isinstance(payload, list) or not payload:
            raise ValueError("empty mistral tool-call list")
        return [_call_from_object(item, ("arguments", "parameters")) for item in payload]
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    pos = 0
    while (match := _MISTRAL_HEADER.match(text, pos)) is not None:
        arguments, pos = decoder.raw_decode(text, match.end())
        calls.append((match.group(1), _arguments_text(arguments)))
        while pos < len(text) and text[pos] in " \n\t,":
            pos += 1
    if not calls or pos != len(text):
        raise ValueError("not a mistral tool call")
    return calls


def parse_llama3_json(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    text = body.strip()
    decoder = json.JSONDecoder()
    calls: list[ParsedCall] = []
    pos = 0
    while pos < len(text):
        obj, pos = decoder.raw_decode(text, pos)
        calls.append(_call_from_object(obj, ("parameters", "arguments")))
        while pos < len(text) and text[pos] in " \n\t;":
            pos += 1
    if not calls:
        raise ValueError("empty llama3 tool call")
    return calls


_QWEN_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)


def _qwen_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's text as the JSON type its schema declares (strings stay text)."""
    kind = str((schema or {}).get("type", "")).lower()
    if raw.lower() == "null":
        return None
    if kind in ("string", "str", "text", "enum"):
        return raw
    try:
        value = json.loads(raw)
    except json.JSONDecodeError:
        return raw
    if not kind and not isinstance(value, (dict, list)):
        return raw   # untyped: only structured values are decoded
    return value


def parse_qwen3_coder(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    calls = []
    for name, inner in _QWEN_FUNCTION.findall(body):
        props = schemas.get(name, {}).get("properties", {})
        arguments = {key: _qwen_value(value, props.get(key))
                     for key, value in _QWEN_PARAMETER.findall(inner)}
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    if not calls:
        raise ValueError("not a qwen3_coder tool call")
    return calls


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """One family's markers. `end` None: the call runs to the end of the reply.

    `streams_arguments`: the body is `{"name": "...", "arguments": {...}}`, so the
    arguments can be forwarded as they are generated instead of at the end.
    `reply_start`: extra markers that open a call only at the start of a reply.
    """

    name: str
    start: str | None
    end: str | None
    parse: Callable[[str, Schemas], list[ParsedCall]]
    streams_arguments: bool = False
    reply_start: tuple[str, ...] = ()


FORMATS: dict[str, ToolFormat] = {
    "json_tools": ToolFormat("json_tools", "<tool_call>", "</tool_call>", parse_json_tools,
                             streams_arguments=True),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", None, parse_mistral),
    "qwen3_coder": ToolFormat("qwen3_coder", "<tool_call>", "</tool_call>", parse_qwen3_coder),
    "llama3_json": ToolFormat("llama3_json", "<|python_tag|>", None, parse_llama3_json,
                              reply_start=("{",)),
}


def detect_format(chat_template: str | None) -> str | None:
    """The tool format a chat template speaks, for templates mlx-lm leaves undetected.

    mlx-lm's own detection (`tokenizer_utils._infer_tool_parser`) is preferred by
    the daemon; this covers the Llama 3.1 JSON style, which mlx-lm has no parser for.
    """
    if not chat_template:
        return None
    if "<tool_call>\\n<function=" in chat_template or "<tool_call>\n<function=" in chat_template:
        return "qwen3_coder"
    if "<tool_call>" in chat_template:
        return "json_tools"
    if "[TOOL_CALLS]" in chat_template:
        return "mistral"
    if "<|python_tag|>" in chat_template or (
        "<|start_header_id|>" in chat_template and '"parameters"' in chat_template
    ):
        return "llama3_json"
    return None
