"""Tool-call bodies written as tags and raw values, not as one JSON object.

Each family's chat template writes earlier calls this way, so the model writes
its own the same way (the templates named below are the reference, with
mlx-lm's `tool_parsers` modules of the same names). Values are raw text; a
value's JSON type comes from the offered tool's schema (calls.py rule 2).

1. `qwen3_coder` (Qwen3-Coder, Qwen3.5+): inside `<tool_call>...</tool_call>`,
   `<function=NAME><parameter=KEY>\\nvalue\\n</parameter>...</function>`;
   an undeclared value is decoded only when it is an object or array.
2. `glm47` (GLM-4.5, 4.6, 4.7): inside `<tool_call>...</tool_call>`,
   `NAME<arg_key>KEY</arg_key><arg_value>value</arg_value>...`, newlines
   between the tags in 4.5, none in 4.7; the template writes strings raw and
   everything else as JSON, so an undeclared value is decoded when it is JSON.
   A call with no arguments is the name alone.
3. `minimax_m2` (MiniMax-M2, M2.5): inside `<minimax:tool_call>...</minimax:tool_call>`,
   one or more `<invoke name="NAME"><parameter name="KEY">value</parameter>...</invoke>`;
   an undeclared value stays text (as mlx-lm reads it).
4. `gemma4` (Gemma 4): inside `<|tool_call>...<tool_call|>`, `call:NAME{key:value,...}`
   in Gemma's own notation: bare keys, strings between `<|"|>` delimiters,
   numbers / booleans / null bare, nested `{}` and `[]`. Types are written
   out, so no schema is needed.

Each parser raises `ValueError` for a body that is not a call of its family.
"""

from __future__ import annotations

import json
import re
from typing import Any

from .calls import NO_SCHEMAS, ParsedCall, Schemas, Untyped, typed_value

_QWEN_FUNCTION = re.compile(r"<function=([^>\s]+)>(.*?)</function>", re.DOTALL)
_QWEN_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.DOTALL)
_GLM_ARG = re.compile(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)
_MINIMAX_INVOKE = re.compile(r"<invoke\s+name=([\"']?)([^\"'>]+)\1\s*>(.*?)</invoke>", re.DOTALL)
_MINIMAX_PARAMETER = re.compile(
    r"<parameter\s+name=([\"']?)([^\"'>]+)\1\s*>\n?(.*?)\n?</parameter>", re.DOTALL)
_NAME = re.compile(r"[\w.\-]+")


def _typed_arguments(name: str, pairs: list[tuple[str, str]], schemas: Schemas,
                     untyped: Untyped) -> ParsedCall:
    props = schemas.get(name, {}).get("properties", {})
    arguments = {key.strip(): typed_value(value, props.get(key.strip()), untyped)
                 for key, value in pairs}
    return ParsedCall(name, json.dumps(arguments, ensure_ascii=False))


def parse_qwen3_coder(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    calls = [_typed_arguments(name, _QWEN_PARAMETER.findall(inner), schemas, "structured")
             for name, inner in _QWEN_FUNCTION.findall(body)]
    if not calls:
        raise ValueError("not a qwen3_coder tool call")
    return calls


def parse_glm47(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    head, _, _ = body.partition("<arg_key>")
    name = head.strip()
    if not _NAME.fullmatch(name):
        raise ValueError("not a glm47 tool call")
    return [_typed_arguments(name, _GLM_ARG.findall(body), schemas, "json")]


def parse_minimax_m2(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    calls = []
    for _, name, inner in _MINIMAX_INVOKE.findall(body):
        pairs = [(key, value) for _, key, value in _MINIMAX_PARAMETER.findall(inner)]
        calls.append(_typed_arguments(name.strip(), pairs, schemas, "text"))
    if not calls:
        raise ValueError("not a minimax_m2 tool call")
    return calls


GEMMA_QUOTE = '<|"|>'
_GEMMA_CALL = re.compile(r"\s*call:([\w.\-]+)\s*(?=\{)")
_GEMMA_BARE_KEY = re.compile(r"[^,:{}\[\]]*")
_GEMMA_BARE_VALUE = re.compile(r"[^,{}\[\]]*")


class _GemmaReader:
    """Rule 4: a recursive-descent reader of Gemma 4's argument notation."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def expect(self, char: str) -> None:
        self.skip_ws()
        if not self.text.startswith(char, self.pos):
            raise ValueError(f"gemma4 arguments: expected {char!r} at {self.pos}")
        self.pos += len(char)

    def peek(self, char: str) -> bool:
        self.skip_ws()
        return self.text.startswith(char, self.pos)

    def value(self) -> Any:
        self.skip_ws()
        if self.peek(GEMMA_QUOTE):
            return self.quoted()
        if self.peek("{"):
            return self.members("{", "}", keyed=True)
        if self.peek("["):
            return self.members("[", "]", keyed=False)
        if self.peek('"'):
            value, self.pos = json.JSONDecoder().raw_decode(self.text, self.pos)
            return value
        match = _GEMMA_BARE_VALUE.match(self.text, self.pos)
        raw = match.group(0).strip() if match else ""
        if not raw:
            raise ValueError(f"gemma4 arguments: no value at {self.pos}")
        self.pos = match.end() if match else self.pos
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return raw

    def quoted(self) -> str:
        start = self.pos + len(GEMMA_QUOTE)
        end = self.text.find(GEMMA_QUOTE, start)
        if end < 0:
            raise ValueError("gemma4 arguments: unterminated string")
        self.pos = end + len(GEMMA_QUOTE)
        return self.text[start:end]

    def key(self) -> str:
        if self.peek(GEMMA_QUOTE):
            return self.quoted()
        match = _GEMMA_BARE_KEY.match(self.text, self.pos)
        key = match.group(0).strip() if match else ""
        if not key:
            raise ValueError(f"gemma4 arguments: no key at {self.pos}")
        self.pos = match.end() if match else self.pos
        return key

    def members(self, open_: str, close: str, *, keyed: bool) -> Any:
        self.expect(open_)
        items: Any = {} if keyed else []
        while not self.peek(close):
            if keyed:
                key = self.key()
                self.expect(":")
                items[key] = self.value()
            else:
                items.append(self.value())
            if not self.peek(","):
                break
            self.expect(",")
        self.expect(close)
        return items


def parse_gemma4(body: str, schemas: Schemas = NO_SCHEMAS) -> list[ParsedCall]:
    calls = []
    reader = _GemmaReader(body)
    while (head := _GEMMA_CALL.match(body, reader.pos)) is not None:
        reader.pos = head.end()
        arguments = reader.members("{", "}", keyed=True)
        calls.append(ParsedCall(head.group(1), json.dumps(arguments, ensure_ascii=False)))
    reader.skip_ws()
    if not calls or reader.pos != len(body):
        raise ValueError("not a gemma4 tool call")
    return calls
