"""Responses `tools`: what is offered to the model, and how its calls map back.

Rules (Codex CLI sends all of these on its first request):
1. `function` tools are offered as they are (`strict` defaults to true, as in
   the API).
2. `namespace` tools group function tools: each member is offered flat as
   `flat_name(namespace, name)` = the namespace without trailing underscores,
   `__`, the member's name (`multi_agent` + `spawn` -> `multi_agent__spawn`;
   Codex's `mcp__srv__` + `f` -> `mcp__srv__f`). Only `[A-Za-z0-9_-]` go into
   a name the chat templates and the models were trained on, hence no dot. A
   call of a flattened name comes back as a `function_call` with `name` the
   member's and `namespace` set; history items carrying `namespace` render
   under the flat name again.
3. `custom` tools (free-form input, e.g. Codex's `apply_patch`) are offered as
   a function taking one string, `{"input": "..."}`; a call comes back as a
   `custom_tool_call` item whose `input` is that string. A `format` of type
   `grammar` (`syntax` `lark` or `regex`, its `definition`) is enforced on that
   string (core/structured.py rule 7: a forced call, and under `auto` every
   call the model opens, in JSON tool-call markup); `text` (or none) leaves
   it free. Another type or syntax is refused naming `tools[i].format.type`
   or `.syntax`; an unusable definition names `tools[i].format.definition`.
   A call cut short (max_output_tokens) carries the string written so far.
   A model whose tool calls are not JSON (qwen3_coder's XML, Mistral's) gets
   no grammar: the tool is still offered, and `tools[i].format` is noted in
   `x-frink-ignored-fields` and the log (`note_unheld`).
4. `tool_search` (client-executed in Codex) is offered as a function named
   `tool_search` with its `parameters` (else any object).
5. Hosted tools the server cannot run (`HOSTED`: web search, file search,
   code interpreter, image generation, computer use, MCP, local shell) are not
   offered; each is noted as `tools[i]` in the `x-frink-ignored-fields` header
   and a log line. Any other `type` is refused by name (`tools[i].type`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
from starlette.requests import Request

from ...core.parsers import MarkupInfo
from ...core.request import GenRequest, Tool, ToolGrammar
from ...core.structured import tool_grammars_held
from ...errors import InvalidRequest, UnsupportedField
from ...http.body import validation_param
from ...http.fields import note_dropped, report, unknown_fields
from . import responses_wire as w

HOSTED = frozenset({"file_search", "code_interpreter", "image_generation", "computer_use",
                    "computer_use_preview", "mcp", "local_shell", "shell"})
CUSTOM_INPUT = "input"
_CUSTOM_SCHEMA = {"type": "object", "properties": {CUSTOM_INPUT: {"type": "string"}},
                  "required": [CUSTOM_INPUT], "additionalProperties": False}
_ANY_OBJECT: dict[str, Any] = {"type": "object", "properties": {}}


def flat_name(namespace: str | None, name: str) -> str:
    """Rule 2: the name a namespace member is offered (and rendered in history) under."""
    return f"{namespace.rstrip('_')}__{name}" if namespace else name


def is_hosted(kind: str) -> bool:
    return kind in HOSTED or kind.startswith("web_search")


@dataclass(slots=True)
class Offered:
    """The tools offered to the model, and how to name its calls in the output."""

    tools: list[Tool] = field(default_factory=list)
    namespaced: dict[str, tuple[str, str]] = field(default_factory=dict)  # flat -> (ns, name)
    custom: set[str] = field(default_factory=set)
    grammar_fields: list[str] = field(default_factory=list)   # tools[i].format (rule 3)

    def function(self, tool: w.FunctionTool, where: str, namespace: str | None = None,
                 grammar: ToolGrammar | None = None) -> None:
        if not tool.name:
            raise InvalidRequest(f"'{where}.name' is required.", param=f"{where}.name")
        name = flat_name(namespace, tool.name)
        if namespace:
            self.namespaced[name] = (namespace, tool.name)
        self.tools.append(Tool(name, tool.description or "", tool.parameters or _ANY_OBJECT,
                               strict=tool.strict is not False,  # the API's default: true
                               grammar=grammar))

    def output_item(self, item: dict[str, Any]) -> dict[str, Any]:
        """A fresh function_call item as the client named the tool (rules 2-3)."""
        name = item["name"]
        if name in self.custom:
            return {"id": item["id"].replace("fc_", "ctc_", 1), "type": "custom_tool_call",
                    "status": item["status"], "call_id": item["call_id"], "name": name,
                    "input": ""}
        if name in self.namespaced:
            namespace, item["name"] = self.namespaced[name]
            item["namespace"] = namespace
        return item


_INPUT_OPENING = re.compile(r'\s*\{\s*"' + CUSTOM_INPUT + r'"\s*:\s*"')


def note_unheld(request: Request | None, offered: Offered, gen: GenRequest,
                markup: MarkupInfo) -> None:
    """Rule 3: custom tools' grammars this model's markup cannot carry, noted by name."""
    if offered.grammar_fields and not tool_grammars_held(gen, markup):
        note_dropped(request, offered.grammar_fields, "this model's tool calls are not JSON "
                     f"({markup.tool_format or 'unknown format'}): the grammar is not enforced")


def custom_input(arguments: str) -> str:
    """Rule 3: the string a custom tool's call carries (the raw text if not our shape)."""
    try:
        args = json.loads(arguments)
    except ValueError:
        return _cut_input(arguments)
    if isinstance(args, dict) and isinstance(args.get(CUSTOM_INPUT), str):
        return args[CUSTOM_INPUT]
    return arguments


def _cut_input(arguments: str) -> str:
    """Rule 3: a cut call's string so far; a half-written escape at its end is left out."""
    opening = _INPUT_OPENING.match(arguments)
    if opening is None:
        return arguments
    body = arguments[opening.end():]
    for cut in range(min(len(body), 6) + 1):
        try:
            return str(json.loads('"' + body[:len(body) - cut] + '"'))
        except ValueError:
            continue
    return arguments


def custom_arguments(text: str) -> str:
    """A custom tool call's input as the offered function's arguments (history)."""
    return json.dumps({CUSTOM_INPUT: text}, ensure_ascii=False)


def custom_grammar(fmt: dict[str, Any] | None, where: str) -> ToolGrammar | None:
    """Rule 3: a custom tool's `format` as the grammar of its input (None: free text)."""
    if fmt is None or fmt.get("type", "text") == "text":
        return None
    if fmt.get("type") != "grammar":
        raise UnsupportedField(f"{where}.format.type", f"'{fmt.get('type')}' is not a custom "
                               "tool format; use 'text' or 'grammar'")
    syntax = fmt.get("syntax")
    if syntax not in ("lark", "regex"):
        raise UnsupportedField(f"{where}.format.syntax", f"'{syntax}' is not supported; use "
                               "'lark' or 'regex'")
    definition = fmt.get("definition")
    if not isinstance(definition, str):
        raise InvalidRequest(f"'{where}.format.definition' must be a string.",
                             param=f"{where}.format.definition")
    return ToolGrammar(syntax, definition, f"{where}.format.definition", argument=CUSTOM_INPUT)


def _decode(raw: Any, where: str, request: Request | None) -> w.FunctionTool:
    try:
        tool = msgspec.convert(raw, w.FunctionTool)
    except msgspec.ValidationError as exc:
        inner = validation_param(exc)
        raise InvalidRequest(f"Invalid tool: {exc}",
                             param=where + (f".{inner}" if inner else "")) from None
    report(request, unknown_fields(raw, w.FunctionTool, prefix="tools[]"))
    return tool


def offer_tools(tools: list[dict[str, Any]] | None, request: Request | None = None) -> Offered:
    offered = Offered()
    for i, raw in enumerate(tools or []):
        where = f"tools[{i}]"
        kind = raw.get("type") if isinstance(raw, dict) else None
        if isinstance(kind, str) and is_hosted(kind):
            note_dropped(request, [where], f"'{kind}' is a hosted tool this server cannot run")
            continue
        tool = _decode(raw, where, request)
        if tool.type == "function":
            offered.function(tool, where)
        elif tool.type == "namespace":
            if not tool.name:
                raise InvalidRequest(f"'{where}.name' is required.", param=f"{where}.name")
            for j, member in enumerate(tool.tools or []):
                if member.type != "function":
                    raise UnsupportedField(f"{where}.tools[{j}].type", f"'{member.type}' "
                                           "cannot be in a namespace; only 'function'")
                offered.function(member, f"{where}.tools[{j}]", namespace=tool.name)
        elif tool.type == "custom":
            grammar = custom_grammar(tool.format, where)
            offered.function(w.FunctionTool("function", tool.name, tool.description,
                                            _CUSTOM_SCHEMA, strict=True), where, grammar=grammar)
            offered.custom.add(tool.name or "")
            if grammar is not None:
                offered.grammar_fields.append(f"{where}.format")
        elif tool.type == "tool_search":
            offered.function(w.FunctionTool("function", tool.name or "tool_search",
                                            tool.description, tool.parameters,
                                            strict=False), where)
        else:
            raise UnsupportedField(f"{where}.type", f"'{tool.type}' tools are not supported; "
                                   "only 'function', 'namespace', 'custom', 'tool_search' "
                                   "(hosted tools are dropped)")
    return offered
