"""A `GrammarSpec` as the grammar text llguidance compiles (engine/constraints.py compiles it).

Rules:
1. JSON Schemas, regexes, GBNF (through llguidance's converter) and Lark each
   become llguidance's top-level grammar; whatever llguidance refuses is an
   `InvalidRequest` naming the spec's field.
2. A spec's embeds (custom tools' inputs, core/custom_calls.py) join the
   top-level grammar as named grammars (`@tool_input_N`). Each client's text
   is checked alone first, so a bad definition is a 400 naming its own field
   (`tools[i].format.definition`), then JSON-quoted (core/json_quote.py) and
   checked again (a rewrite llguidance cannot read is named the same way).
   The rewrite grows a grammar (an escaped `.` is two lexemes of classes);
   past MAX_QUOTED_CHARS it is refused, naming the definition.
3. `text_matches` tells whether a finished text is in a grammar: the same
   matcher, fed the text's tokens (any tokenization of the text is accepted).
"""

from __future__ import annotations

import json
from typing import Any

from ..core.custom_calls import Embed
from ..core.json_quote import quote_lark, quote_regex_grammar
from ..core.structured import MAX_SPEC_CHARS, GrammarSpec
from ..errors import InvalidRequest

MAX_ERROR_CHARS = 600
MAX_QUOTED_CHARS = 4 * MAX_SPEC_CHARS   # rule 2: a definition may grow this far, rewritten


def to_llguidance(spec: GrammarSpec) -> str:
    """The llguidance grammar text for `spec`; InvalidRequest when it cannot be converted."""
    from llguidance import LLMatcher
    from llguidance.gbnf_to_lark import any_to_lark

    try:
        if spec.kind == "json_schema":
            grammar = LLMatcher.grammar_from_json_schema(spec.text)
        elif spec.kind == "regex":
            grammar = LLMatcher.grammar_from_regex(spec.text)
        elif spec.kind == "gbnf":
            grammar = LLMatcher.grammar_from_lark(any_to_lark(spec.text))
        else:
            grammar = LLMatcher.grammar_from_lark(spec.text)
    except Exception as exc:  # noqa: BLE001 - the GBNF converter raises its own types
        raise InvalidRequest(describe(spec, str(exc)), param=spec.param) from exc
    if not spec.embeds:
        return grammar
    top: dict[str, Any] = (json.loads(grammar) if grammar.lstrip().startswith("{")
                           else {"grammars": [{"lark_grammar": grammar}]})
    top["grammars"] += [{"name": embed.name, "lark_grammar": embed_lark(embed)}
                        for embed in spec.embeds]
    return json.dumps(top)


def embed_lark(embed: Embed) -> str:
    """Rule 2: one custom tool's grammar as the Lark text of a named grammar."""
    from llguidance import LLMatcher

    tool = embed.grammar
    own = (LLMatcher.grammar_from_lark(tool.definition) if tool.syntax == "lark"
           else LLMatcher.grammar_from_regex(tool.definition))
    _check(own, tool.syntax, tool.param)
    if not embed.json_quoted:
        return tool.definition if tool.syntax == "lark" else \
            str(json.loads(own)["grammars"][0]["lark_grammar"])
    lark = (quote_lark(tool.definition, tool.param) if tool.syntax == "lark"
            else quote_regex_grammar(tool.definition, tool.param))
    if len(lark) > MAX_QUOTED_CHARS:
        raise InvalidRequest(
            f"The grammar in '{tool.param}' is {len(lark)} characters once written for text "
            f"inside a JSON string; the limit is {MAX_QUOTED_CHARS}.", param=tool.param)
    _check(LLMatcher.grammar_from_lark(lark), tool.syntax, tool.param, rewritten=True)
    return lark


def _check(grammar: str, syntax: str, param: str, *, rewritten: bool = False) -> None:
    from llguidance import LLMatcher

    error = LLMatcher.validate_grammar(grammar)
    if error:
        what = "Lark grammar" if syntax == "lark" else "regular expression"
        how = " once written inside a JSON string" if rewritten else ""
        raise InvalidRequest(f"The {what} in '{param}' cannot be used{how}: "
                             f"{error.strip()[:MAX_ERROR_CHARS]}", param=param)


def describe(spec: GrammarSpec, why: str) -> str:
    what = {"json_schema": "JSON Schema", "regex": "regular expression",
            "gbnf": "GBNF grammar", "lark": "grammar"}[spec.kind]
    return f"The {what} in '{spec.param}' cannot be used: {why.strip()[:MAX_ERROR_CHARS]}"


def text_matches(matcher: Any, token_ids: list[int]) -> bool:
    """Rule 3: whether `token_ids` take a fresh copy of `matcher` to an accepting end."""
    row = matcher.deep_copy()
    return bool(row.consume_tokens(token_ids)) and not row.is_error() and bool(row.is_accepting())
