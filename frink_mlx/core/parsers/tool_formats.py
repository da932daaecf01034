"""Tool-call markup per model family: where a call starts and ends, and how its body parses.

mlx-lm ships one `parse_tool_call(text, tools)` module per family under
`mlx_lm.tool_parsers`, but importing any of them runs `mlx_lm/__init__.py`,
which imports MLX -- and `core/` must never import MLX (it is used by adapters
and tests with no accelerator). So the families we serve are re-implemented
here and in xml_formats.py, small, following mlx-lm's modules of the same
names and the families' own chat templates:

1. `json_tools` (Hermes, Qwen 2.5/3): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
   one JSON object per tag pair, tags may repeat.
2. `mistral`: `[TOOL_CALLS]` then either a JSON list `[{"name", "arguments"}, ...]`
   (v0.3) or repeated `name[ARGS]{...}` (v11+); no end marker, runs to EOS.
3. `qwen3_coder`, `glm47`, `minimax_m2`, `gemma4`: tags and raw values
   (xml_formats.py states them).
4. `llama3_json` (Llama 3.1/3.2 JSON tool calling): the whole reply is
   `{"name": ..., "parameters": {...}}` (several joined by `;`), optionally after
   `<|python_tag|>`; no end marker. Recognised only at the very start of a reply
   and only when tools were offered (a JSON-mode reply must stay text).
5. `kimi_k2` (Kimi K2): `<|tool_calls_section_begin|>` then, per call,
   `<|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{...}<|tool_call_end|>`,
   then `<|tool_calls_section_end|>`; the name is NAME.
6. `deepseek_v31` (DeepSeek-V3.1, V3.2-Exp's template, R1-0528): `<｜tool▁calls▁begin｜>`
   then, per call, `<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>`, then
   `<｜tool▁calls▁end｜>`; V3's older `function<｜tool▁sep｜>NAME` + a ```json fence is read too.
7. `harmony` (gpt-oss) is not a tool markup inside text but a whole message
   structure; harmony.py parses it, `detect_format` only names it.

A body parser takes the body and the offered tools' parameter schemas and
returns `[ParsedCall(name, arguments_json_text), ...]`; it raises
`ValueError` for a body that is not a tool call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .calls import NO_SCHEMAS, ParsedCall, Schemas, arguments_text
from .xml_formats import parse_gemma4, parse_glm47, parse_minimax_m2, parse_qwen3_coder

HARMONY = "harmony"


def _call_from_object(obj: Any, args_keys: tuple[str, ...]) -> ParsedCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        raise ValueError("not a tool call object")
    for key in args_keys:
        if key in obj:
            return ParsedCall(obj["name"], arguments_text(obj[key]))
    return ParsedCall(obj["name"], "{}")


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
        calls.append(ParsedCall(match.group(1), arguments_text(arguments)))
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


_KIMI_CALL = re.compile(r"<\|tool_call_begin\|>\s*(?:functions\.)?([\w.\-]+?)(?::\d+)?\s*"
                        r"<\|tool_call_argument_begin\|>(.*?)<\|tool_call_end\|>", re.DOTALL)
_DEEPSEEK_CALL = re.compile(r"<｜tool▁call▁begin｜>\s*([\w.\-]+)\s*<｜tool▁sep｜>(.*?)<｜tool▁call▁end｜>",
                            re.DOTALL)
_DEEPSEEK_V3_ARGS = re.compile(r"\s*([\w.\-]+)\s*\n```(?:json)?\s*\n(.*?)\n?```\s*", re.DOTALL)


def _calls_in(pattern: re.Pattern[str], body: str, family: str,
              read: Callable[[str, str], ParsedCall]) -> list[ParsedCall]:
    """Every complete call in `body` that reads; one that does not (cut short, or
    arguments that are no JSON object) is left out, and a body with none is no call."""
    calls = []
    for match in pattern.finditer(body):
        try:
            calls.append(read(match.group(1), match.group(2)))
        except ValueError:
            continue
    if not calls:
        raise ValueError(f"not a {family} tool call")
    return calls


def _kimi_call(name: str, args: str) -> ParsedCall:
    return ParsedCall(name, arguments_text(args.strip()))


def _deepseek_call(name: str, args: str) -> ParsedCall:
    fenced = _DEEPSEEK_V3_ARGS.fullmatch(args) if name == "function" else None
    if fenced is not None:   # V3: function<｜tool▁sep｜>NAME ```json {...} ```
        name, args = fenced.group(1), fenced.group(2)
    return ParsedCall(name, arguments_text(args.strip()))


def parse_kimi_k2(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    return _calls_in(_KIMI_CALL, body, "kimi_k2", _kimi_call)


def parse_deepseek_v31(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    return _calls_in(_DEEPSEEK_CALL, body, "deepseek_v31", _deepseek_call)


@dataclass(frozen=True, slots=True)
class ToolFormat:
    """One family's markers. `end` None: the call runs to the end of the reply.

    `streams_arguments`: the body is `{"name": "...", "arguments": {...}}`, so the
    arguments can be forwarded as they are generated instead of at the end.
    `reply_start`: extra markers that open a call only at the start of a reply.
    `after_call`: a marker the family writes right after its calls (Gemma 4's
    `<|tool_response>`, asking for the results); dropped there, never text.
    """

    name: str
    start: str | None
    end: str | None
    parse: Callable[[str, Schemas], list[ParsedCall]]
    streams_arguments: bool = False
    reply_start: tuple[str, ...] = ()
    after_call: str | None = None


FORMATS: dict[str, ToolFormat] = {
    "json_tools": ToolFormat("json_tools", "<tool_call>", "</tool_call>", parse_json_tools,
                             streams_arguments=True),
    "mistral": ToolFormat("mistral", "[TOOL_CALLS]", None, parse_mistral),
    "qwen3_coder": ToolFormat("qwen3_coder", "<tool_call>", "</tool_call>", parse_qwen3_coder),
    "llama3_json": ToolFormat("llama3_json", "<|python_tag|>", None, parse_llama3_json,
                              reply_start=("{",)),
    "glm47": ToolFormat("glm47", "<tool_call>", "</tool_call>", parse_glm47),
    "minimax_m2": ToolFormat("minimax_m2", "<minimax:tool_call>", "</minimax:tool_call>",
                             parse_minimax_m2),
    "gemma4": ToolFormat("gemma4", "<|tool_call>", "<tool_call|>", parse_gemma4,
                         after_call="<|tool_response>"),
    "kimi_k2": ToolFormat("kimi_k2", "<|tool_calls_section_begin|>",
                          "<|tool_calls_section_end|>", parse_kimi_k2),
    "deepseek_v31": ToolFormat("deepseek_v31", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>",
                               parse_deepseek_v31),
}

# (marker in the template -> format), first match wins: mlx-lm's own order
# (tokenizer_utils._infer_tool_parser), plus the families it has no parser for.
_TEMPLATE_MARKERS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("<|channel|>", "<|message|>"), HARMONY),
    (("<minimax:tool_call>",), "minimax_m2"),
    (("<|tool_call>", "<tool_call|>"), "gemma4"),
    (("<arg_key>",), "glm47"),
    (("<tool_call>\\n<function=",), "qwen3_coder"),
    (("<tool_call>\n<function=",), "qwen3_coder"),
    (("<|tool_calls_section_begin|>",), "kimi_k2"),
    (("<｜tool▁calls▁begin｜>",), "deepseek_v31"),
    (("<tool_call>",), "json_tools"),
    (("[TOOL_CALLS]",), "mistral"),
    (("<|python_tag|>",), "llama3_json"),
    (("<|start_header_id|>", '"parameters"'), "llama3_json"),
)


def detect_format(chat_template: str | None) -> str | None:
    """The tool format a chat template speaks, for templates mlx-lm leaves undetected.

    mlx-lm's own detection (`tokenizer_utils._infer_tool_parser`) is preferred by
    the daemon; this covers the families it has no parser for (gpt-oss Harmony,
    DeepSeek-V3.1, Llama 3.1 JSON) and templates installed after loading.
    """
    if not chat_template:
        return None
    for markers, name in _TEMPLATE_MARKERS:
        if all(marker in chat_template for marker in markers):
            return name
    return None
