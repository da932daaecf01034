"""Tool-call bodies when some offered tools are custom tools with a grammar.

Why: a custom tool (Responses `custom`, e.g. Codex's `apply_patch`;
core/request.py `ToolGrammar`) takes one free-form string whose text must
match a Lark grammar or a regex. In a model's JSON tool-call markup that
string is a JSON string value, so the call is written literally up to the
string's opening quote, and the grammar, JSON-quoted (core/json_quote.py),
constrains what follows up to the closing quote. core/structured.py rules 5
(forced calls) and 6 (strict calls under `auto`) use these bodies.

Rules:
1. A grammar tool's call object is `{"name": "apply_patch", "<args_key>":
   {"input": "` + the escaped text of its grammar + `"}}`, in structured.py
   rule 2's layout.
2. The grammar is a nested llguidance grammar (`@tool_input_N`, one `Embed`
   each), so its rules, imports and options stay its own. The engine compiles
   it (engine/constraints.py `to_llguidance`) after checking the client's text
   alone, so a bad grammar is a 400 naming `tools[i].format.definition`.
3. With a grammar tool among them, every call body dispatches on the name
   first: `{"name": ` then one alternative per tool, a function tool's
   arguments as `%json` of its schema. (A `%json` call object beside a
   literal that starts the same way does not work: llguidance's lexer commits
   to one of the two at the first byte, and the other dies.)
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .json_quote_regex import lark_string
from .request import Tool, ToolGrammar


@dataclass(frozen=True, slots=True)
class Embed:
    """One nested grammar of a spec: a custom tool's input, referenced as `@name`."""

    name: str
    grammar: ToolGrammar
    json_quoted: bool = True   # rule 1: the input is written inside a JSON string


def has_grammar_tools(tools: list[Tool]) -> bool:
    return any(t.grammar is not None for t in tools)


def dispatch_body(tools: list[Tool], args_key: str,
                  arguments: Callable[[Tool], dict[str, Any]]) -> tuple[str, tuple[Embed, ...]]:
    """Rule 3: the Lark rules defining `body` (one call object) and the embeds they name.

    `arguments(tool)` is a function tool's arguments schema, layout options included."""
    rules: list[str] = []
    names: list[str] = []
    embeds: list[Embed] = []
    for i, tool in enumerate(tools):
        head = f"{json.dumps(tool.name)}, {json.dumps(args_key)}: "
        if tool.grammar is None:
            rules.append(f"call_{i}: {lark_string(head)} %json {json.dumps(arguments(tool))} "
                         f"{lark_string('}')}")
        else:
            embed = Embed(f"tool_input_{len(embeds)}", tool.grammar)
            embeds.append(embed)
            opening = head + "{" + json.dumps(tool.grammar.argument) + ': "'
            rules.append(f"call_{i}: {lark_string(opening)} @{embed.name} "
                         f"{lark_string(chr(34) + '}}')}")
        names.append(f"call_{i}")
    body = f"body: {lark_string('{' + json.dumps('name') + ': ')} ({' | '.join(names)})"
    return "\n".join([body, *rules]) + "\n", tuple(embeds)
