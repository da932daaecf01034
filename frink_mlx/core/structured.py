"""Structured output, the pure half: a request's constraint -> a grammar spec.

Clients ask for constrained output in several ways (OpenAI `response_format`,
Responses `text.format`, llama.cpp `json_schema` / `grammar`, a forced
`tool_choice`); every adapter translates its field into `GenRequest`
(`response_format`, `tools`, `tool_choice`). This module turns that into one
`GrammarSpec` -- plain text in one of the grammar languages llguidance reads --
which engine/constraints.py compiles (off the event loop, cached by
`GrammarSpec.key`) into one matcher per row. Nothing here imports llguidance
or MLX, so adapters and tests can call it freely.

Rules:
1. Validate what can be checked without compiling (shape of the schema,
   empty grammars, unknown tool names, oversized specs) and raise
   `InvalidRequest` naming the request field. Whatever only the grammar
   compiler can judge (unsupported keywords, bad regex, bad GBNF) is raised by
   `GrammarCompiler.compile` -- also before any byte is sent.
2. JSON is generated in one canonical layout (`", "` and `": "` separators, no
   other whitespace): fewer choices for the model, no runaway whitespace, and
   still what small models are used to reading.
3. `json_object` means "any JSON object" (OpenAI's JSON mode).
4. `strict` is recorded but never loosens anything: a keyword the compiler
   cannot enforce is refused, strict or not (refuse by name, never ignore).
5. A forced tool call (`tool_choice="required"` or a function's name) becomes
   a grammar for a call in the model's own tool-call markup, when that markup
   is known and JSON-shaped (`json_tools`: Hermes/Qwen `<tool_call>` blocks;
   `llama3_json`: a bare `{"name", "parameters"}` object). Mistral's
   `[TOOL_CALLS]` is a control token and qwen3_coder's calls are XML with raw
   values: for those and for unknown formats there is no grammar and the request runs as
   before (template + stream parser). A forced call takes precedence over
   `response_format` either way: that turn's output is the call itself.
   The call's arguments admit only the declared parameters (`closed_objects`).
6. `tool_choice: "auto"` with at least one `strict` tool (OpenAI's strict
   function calling; openai-agents marks every tool strict) and no
   `response_format`: free text, or calls in the model's `json_tools` markup
   whose arguments match the schema -- strict tools' own schemas, any JSON
   object for the others. The text before a call is a lazy lexeme that ends at
   the first `<tool_call>`, so once the model opens a call it can only write a
   valid one; with `parallel_tool_calls` off at most one call is allowed. Other
   markups (llama3_json has no opening marker, Mistral's is a control token)
   get no grammar, as in rule 5.
7. Custom tools with a grammar (`Tool.grammar`, Responses `custom` tools such
   as Codex's `apply_patch`) take part in rules 5 and 6 like function tools:
   their call writes its one string argument under the tool's Lark grammar
   or regex, JSON-quoted (core/custom_calls.py), so a forced call and, under
   `auto`, every call the model opens holds the grammar. Each definition is
   held to MAX_SPEC_CHARS and refused empty, naming it. Where rules 5-6 give
   no grammar (the markup is not JSON, or `response_format` under `auto`),
   `tool_grammars_held` says so, for the adapter to report.
8. Schemas of drafts 4 to 2019-09 keep their meaning: `items` as a list is the
   tuple form (2020-12's `prefixItems`; zod-to-json-schema and pydantic v1 still
   write it) and `additionalItems` bounds what follows; llguidance reads both.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from ..errors import InvalidRequest
from .custom_calls import Embed, dispatch_body, has_grammar_tools
from .parsers import MarkupInfo
from .request import GenRequest, ResponseFormat, Tool

GrammarKind = Literal["json_schema", "lark", "regex", "gbnf"]

MAX_SPEC_CHARS = 64 * 1024          # a schema/grammar bigger than this is refused
MAX_SCHEMA_DEPTH = 32
JSON_OPTIONS: dict[str, Any] = {
    "item_separator": ", ",
    "key_separator": ": ",
    "whitespace_flexible": False,
}
JSON_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
TOOL_FORMATS_WITH_GRAMMAR = frozenset({"json_tools", "llama3_json"})


@dataclass(frozen=True, slots=True)
class GrammarSpec:
    """One grammar in llguidance's input languages, plus where it came from.

    `text` is canonical (schemas are dumped with sorted keys), so equal specs
    share one compiled grammar: `key` is the cache key. `embeds` are the nested
    grammars `text` names (`@tool_input_N`, rule 7).
    """

    kind: GrammarKind
    text: str
    param: str = "response_format"
    embeds: tuple[Embed, ...] = ()

    @property
    def key(self) -> tuple[str, str, tuple[Embed, ...]]:
        return (self.kind, self.text, self.embeds)


def grammar_for_request(req: GenRequest, markup: MarkupInfo) -> GrammarSpec | None:
    """The grammar constraining every row of `req`, or None when unconstrained."""
    if req.tool_choice not in ("auto", "none"):
        return grammar_for_tools(req.tools, req.tool_choice, markup)
    if req.response_format is not None:
        return grammar_for_format(req.response_format)
    if req.tool_choice == "auto" and any(t.strict for t in req.tools):
        return grammar_for_strict_tools(req.tools, markup, parallel=req.parallel_tool_calls)
    return None


def tool_grammars_held(req: GenRequest, markup: MarkupInfo) -> bool:
    """Rule 7: whether the custom tools' grammars of `req` are enforced under `markup`."""
    if not has_grammar_tools(req.tools) or req.tool_choice == "none":
        return True
    if req.tool_choice == "auto":
        return markup.tool_format == "json_tools" and req.response_format is None
    forced = [t for t in req.tools if req.tool_choice in ("required", t.name)]
    return markup.tool_format in TOOL_FORMATS_WITH_GRAMMAR or not has_grammar_tools(forced)


def grammar_for_strict_tools(tools: list[Tool], markup: MarkupInfo, *, parallel: bool
                             ) -> GrammarSpec | None:
    """Rule 6: free text, or schema-valid calls once a call opens."""
    if markup.tool_format != "json_tools":
        return None
    for i, tool in enumerate(tools):
        if tool.strict:
            check_schema(tool.parameters, f"tools[{i}].parameters")
    check_tool_grammars(tools)
    start = json.dumps(markup.tool_call_start or "<tool_call>")
    end = json.dumps(markup.tool_call_end or "</tool_call>")
    calls = "call*" if parallel else "call?"
    body, embeds = _body(tools, "arguments", strict_only=True)
    return GrammarSpec("lark", _bounded_tools((
        "%llguidance {}\n"
        f"start: {calls} tail\n"
        "tail: TEXT\n"
        "TEXT: /(.|\\n)*/\n"
        f"opening[lazy]: TEXT {start}\n"
        f'call: opening "\\n" body "\\n" {end}\n'
        f"{body}"
    )), "tools", embeds)


def grammar_for_format(fmt: ResponseFormat) -> GrammarSpec:
    """Translate one `ResponseFormat`; raises InvalidRequest naming the field."""
    param = fmt.param or "response_format"
    if fmt.kind == "json_object":
        return GrammarSpec("json_schema", _dump_schema({"type": "object"}, param), param)
    if fmt.kind == "json_schema":
        if fmt.schema is None:
            raise InvalidRequest(f"'{param}' needs a JSON Schema.", param=param)
        check_schema(fmt.schema, param)
        return GrammarSpec("json_schema", _dump_schema(fmt.schema, param), param)
    if fmt.kind == "grammar":
        text = _require_text(fmt.grammar, param, "a GBNF grammar")
        return GrammarSpec("gbnf", text, param)
    if fmt.kind == "regex":
        text = _require_text(fmt.pattern, param, "a regular expression")
        return GrammarSpec("regex", text, param)
    raise InvalidRequest(f"'{param}': unknown format kind '{fmt.kind}'.", param=param)


def check_schema(schema: Any, param: str) -> None:
    """Shape checks a JSON Schema must pass before it is worth compiling.

    Only what is cheap and certain: the root is an object (or `true`), `type`
    names real JSON types, `properties` is an object of schemas, `required` is
    a list of strings, nesting is bounded. The compiler judges the rest.
    """
    if schema is True:
        return
    if not isinstance(schema, dict):
        raise InvalidRequest(
            f"'{param}' must be a JSON Schema object, got {type(schema).__name__}.", param=param)
    _check_node(schema, param, "#", 0)


def grammar_for_tools(tools: list[Tool], tool_choice: str, markup: MarkupInfo) -> GrammarSpec | None:
    """A grammar forcing a call of an offered tool, or None when not forced/not expressible."""
    if tool_choice in ("auto", "none"):
        return None
    if not tools:
        raise InvalidRequest(
            f"tool_choice '{tool_choice}' needs at least one tool in 'tools'.", param="tool_choice")
    if tool_choice == "required":
        chosen, repeat = tools, True
    else:
        chosen = [t for t in tools if t.name == tool_choice]
        if not chosen:
            names = ", ".join(t.name for t in tools)
            raise InvalidRequest(
                f"tool_choice names '{tool_choice}', which is not among the offered tools ({names}).",
                param="tool_choice")
        repeat = False
    if markup.tool_format not in TOOL_FORMATS_WITH_GRAMMAR:
        return None
    for i, tool in enumerate(tools):   # named by the index the client sent
        if repeat or tool.name == tool_choice:
            check_schema(tool.parameters, f"tools[{i}].parameters")
    check_tool_grammars(chosen)
    text, embeds = _tool_call_lark(chosen, markup, repeat=repeat)
    return GrammarSpec("lark", _bounded_tools(text), "tools", embeds)


def _bounded_tools(text: str) -> str:
    """A tool grammar is held to the grammar limit like any other (rule 1)."""
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidRequest(f"The tools' parameter schemas make a grammar of {len(text)} "
                             f"characters; the limit is {MAX_SPEC_CHARS}.", param="tools")
    return text


def check_tool_grammars(tools: list[Tool]) -> None:
    """Rule 7: each custom tool's definition is non-empty and within MAX_SPEC_CHARS."""
    for tool in tools:
        if tool.grammar is not None:
            what = "a Lark grammar" if tool.grammar.syntax == "lark" else "a regular expression"
            _require_text(tool.grammar.definition, tool.grammar.param, what)


def _tool_call_lark(tools: list[Tool], markup: MarkupInfo, *, repeat: bool
                    ) -> tuple[str, tuple[Embed, ...]]:
    """Lark for one (or, when `repeat`, one or more) calls in the model's markup.

    json_tools:  <tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>  (calls joined by \\n)
    llama3_json: {"name": ..., "parameters": {...}}                           (calls joined by "; ")
    """
    args_key = "parameters" if markup.tool_format == "llama3_json" else "arguments"
    body, embeds = _body(tools, args_key, strict_only=False)
    if markup.tool_format == "llama3_json":
        separator, call = '"; "', "body"
    else:
        start = json.dumps(markup.tool_call_start or "<tool_call>")
        end = json.dumps(markup.tool_call_end or "</tool_call>")
        separator, call = '"\\n"', f'{start} "\\n" body "\\n" {end}'
    calls = f"call ({separator} call)*" if repeat else "call"
    return (
        "%llguidance {}\n"
        f"start: {calls}\n"
        f"call: {call}\n"
        f"{body}"
    ), embeds


def _body(tools: list[Tool], args_key: str, *, strict_only: bool
          ) -> tuple[str, tuple[Embed, ...]]:
    """The `body` rule (one call object); name-dispatched when a custom tool has a grammar."""
    if has_grammar_tools(tools):
        return dispatch_body(tools, args_key, lambda t: {
            **_arguments_schema(t, strict_only), "x-guidance": JSON_OPTIONS})
    return f"body: %json {json.dumps(_call_schema(tools, args_key, strict_only))}\n", ()


def _arguments_schema(tool: Tool, strict_only: bool) -> dict[str, Any]:
    """`strict_only`: non-strict tools take any JSON object as arguments (rule 6)."""
    if tool.strict or not strict_only:
        return dict(closed_objects(tool.parameters))
    return {"type": "object"}


def _call_schema(tools: list[Tool], args_key: str, strict_only: bool) -> dict[str, Any]:
    """One call object: `name` one of the tools, `args_key` its parameters."""
    variants = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name},
                           args_key: _arguments_schema(t, strict_only)},
            "required": ["name", args_key],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return {**schema, "x-guidance": JSON_OPTIONS}


_NESTED_ONE = ("items", "additionalItems", "contains", "not", "if", "then", "else")
_NESTED_MANY = ("anyOf", "oneOf", "allOf", "prefixItems")
_NESTED_MAP = ("properties", "patternProperties", "$defs", "definitions")


def closed_objects(schema: Any) -> Any:
    """A copy of a tool's parameter schema whose objects admit only declared properties.

    A function accepts the parameters it declares. JSON Schema's default
    (`additionalProperties` true) would let a forced call wander into invented
    keys until the token cap; so every object schema that does not say otherwise
    is closed, as OpenAI's strict function calling does. An explicit
    `additionalProperties` is kept as the client wrote it.
    """
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = dict(schema)
    for key in _NESTED_ONE:
        if key in out:
            out[key] = closed_objects(out[key])
    for key in _NESTED_MANY:
        if isinstance(out.get(key), list):
            out[key] = [closed_objects(s) for s in out[key]]
    for key in _NESTED_MAP:
        if isinstance(out.get(key), dict):
            out[key] = {k: closed_objects(v) for k, v in out[key].items()}
    is_object = out.get("type") == "object" or "properties" in out
    if is_object and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _dump_schema(schema: Any, param: str) -> str:
    """Canonical schema text with our JSON layout options (a client's own x-guidance wins)."""
    body: dict[str, Any] = schema if isinstance(schema, dict) else {}
    own = body.get("x-guidance", {})
    if not isinstance(own, dict):
        raise InvalidRequest(f"'{param}': 'x-guidance' must be an object.", param=param)
    merged = {**body, "x-guidance": {**JSON_OPTIONS, **own}}
    try:
        text = json.dumps(merged, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"'{param}' is not plain JSON: {exc}.", param=param) from exc
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidRequest(
            f"The JSON Schema in '{param}' is {len(text)} characters; the limit is "
            f"{MAX_SPEC_CHARS}.", param=param)
    return text


def _require_text(text: str | None, param: str, what: str) -> str:
    if text is None or not text.strip():
        raise InvalidRequest(f"'{param}' needs {what}; it is empty.", param=param)
    if len(text) > MAX_SPEC_CHARS:
        raise InvalidRequest(
            f"'{param}' is {len(text)} characters; the limit is {MAX_SPEC_CHARS}.", param=param)
    return text


_SUBSCHEMA_MAPS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")
_SUBSCHEMA_ONE = ("additionalProperties", "contains", "propertyNames", "not", "if", "then",
                  "else", "unevaluatedProperties", "unevaluatedItems", "additionalItems")


def _check_node(node: Any, param: str, where: str, depth: int) -> None:
    """Recursive shape check of one (sub)schema at JSON pointer `where`."""
    if isinstance(node, bool):
        return
    if not isinstance(node, dict):
        _bad(param, where, f"a schema must be an object or a boolean, got {type(node).__name__}")
    if depth > MAX_SCHEMA_DEPTH:
        _bad(param, where, f"schemas nest deeper than {MAX_SCHEMA_DEPTH} levels")
    _check_type(node.get("type"), param, where)
    required = node.get("required")
    if required is not None and not (
            isinstance(required, list) and all(isinstance(r, str) for r in required)):
        _bad(param, f"{where}/required", "'required' must be a list of property names")
    if "enum" in node and not isinstance(node["enum"], list):
        _bad(param, f"{where}/enum", "'enum' must be a list")
    for key in _SUBSCHEMA_MAPS:
        if key in node:
            sub = node[key]
            if not isinstance(sub, dict):
                _bad(param, f"{where}/{key}", f"'{key}' must be an object of schemas")
            for name, child in sub.items():
                _check_node(child, param, f"{where}/{key}/{name}", depth + 1)
    for key in _SUBSCHEMA_LISTS:
        if key in node:
            sub = node[key]
            if not isinstance(sub, list) or (key != "prefixItems" and not sub):
                _bad(param, f"{where}/{key}", f"'{key}' must be a non-empty list of schemas")
            for i, child in enumerate(sub):
                _check_node(child, param, f"{where}/{key}/{i}", depth + 1)
    for key in _SUBSCHEMA_ONE:
        if key in node:
            _check_node(node[key], param, f"{where}/{key}", depth + 1)
    items = node.get("items")
    if isinstance(items, list):  # rule 8: draft-04..2019 tuple form
        for i, child in enumerate(items):
            _check_node(child, param, f"{where}/items/{i}", depth + 1)
    elif "items" in node:
        _check_node(items, param, f"{where}/items", depth + 1)


def _check_type(type_: Any, param: str, where: str) -> None:
    if type_ is None:
        return
    names = type_ if isinstance(type_, list) else [type_]
    for name in names:
        if not isinstance(name, str) or name not in JSON_TYPES:
            _bad(param, f"{where}/type",
                 f"unknown type {json.dumps(name)} (expected one of {', '.join(sorted(JSON_TYPES))})")


def _bad(param: str, where: str, why: str) -> NoReturn:
    raise InvalidRequest(f"Invalid JSON Schema in '{param}' at {where}: {why}.", param=param)
