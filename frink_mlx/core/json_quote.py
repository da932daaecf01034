"""Lark grammars for text that is written inside a JSON string.

Why: a custom tool (Responses `custom`, e.g. Codex's `apply_patch`) declares a
grammar for its raw input, but a model whose tool calls are JSON writes that
input as a JSON string value, `{"name": "apply_patch", "arguments": {"input":
"*** Begin Patch\\n..."}}`. Enforcing the grammar there means enforcing it on
the *escaped* text. JSON escaping replaces each character by a fixed string,
one character at a time, so the escaped language is the grammar with every
terminal's characters replaced by their escapes: concatenation, alternation
and repetition commute with it. This module rewrites the terminals of a
grammar and copies the rest as it stands. llguidance has JSON-quoted lexemes
internally (for schema `pattern`s) but not in Lark, hence the rewrite. Pure
text: no llguidance, no MLX.

Rules:
1. Escapes are the canonical ones `json.dumps` writes: `\\"`, `\\\\`, `\\b`,
   `\\f`, `\\n`, `\\r`, `\\t`, other controls as `\\u00xx`; every other
   character (non-ASCII too) stands for itself. `\\/` and `\\uXXXX` for a
   printable character are valid JSON but are not generated.
2. A string literal becomes the literal of its escaped text; `"..."i` and a
   range `"a".."z"` are regexes.
3. A regex goes through core/json_quote_regex.py: kept when nothing in it
   needs escaping, else a rule expression whose escapes are lexemes of their
   own (that module says why the lexer needs this).
4. A terminal (UPPERCASE) that holds anything needing escapes, or names such
   a terminal, becomes a rule (renamed `q-name`, every reference with it), so
   its escapes are lexemes too. Intersection (`&`) in it, or `%ignore` of it,
   is refused: rules have no intersection, and ignored text must be a lexeme.
5. `%import common.X`: names whose characters never need escaping are kept;
   LF, CR, NEWLINE, WS and WS_INLINE are defined here; others are refused.
6. Refused by name (`param`), because the rewrite cannot express them:
   special tokens (`<...>`), nested grammars (`@name`, `%json`, `%regex`,
   `%lark`), negated terminals (`~X`: the complement of an escaped language is
   not the escape of a complement), and rule 3's refusals.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from ..errors import InvalidRequest
from .json_quote_regex import SPECIALS, Refused, escape_char, lark_string, quoted_expression, refuse

COMMON_SPECIAL = {"LF": r"\n", "CR": r"\r", "NEWLINE": r"(\r?\n)+", "WS": r"[ \t\f\r\n]+",
                  "WS_INLINE": r"[ \t]+"}
COMMON_PLAIN = frozenset({"DIGIT", "HEXDIGIT", "INT", "SIGNED_INT", "DECIMAL", "FLOAT",
                          "SIGNED_FLOAT", "NUMBER", "SIGNED_NUMBER", "LCASE_LETTER",
                          "UCASE_LETTER", "LETTER", "WORD", "CNAME"})
_TOKEN = re.compile(r"""
  (?P<nl>(?:\r?\n)+)
| (?P<ws>[ \t]+)
| (?P<comment>(?:\#|//)[^\n]*)
| (?P<string>"(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}|x[0-9a-fA-F]{2})|[^"\\\x00-\x1f\x7f])*"i?)
| (?P<regex>/(?:\\.|[^/\\\n])+/[imslux]*)
| (?P<name>!?[_?]?[a-z][_a-z0-9\-]*|_?[A-Z][_A-Z0-9\-]*)
| (?P<directive>%[a-z]+)
| (?P<other>.)
""", re.X | re.S)
_IMPORT = re.compile(r"%import[ \t]+common[ \t]*(?:\.[ \t]*([A-Z_][A-Z0-9_]*)"
                     r"(?:[ \t]*->[ \t]*([A-Za-z_][A-Za-z0-9_]*))?|\(([^)]*)\))")
_TERMINAL = re.compile(r"_?[A-Z]")
_KEPT_DIRECTIVES = frozenset({"%ignore", "%declare", "%override", "%import"})  # rule 5 kept these imports


@dataclass(slots=True)
class _Token:
    kind: str
    text: str
    start: int
    statement: int = 0       # index of the statement it belongs to
    escaped: bool = False    # its rendering holds escapes (rule 4)


def quote_lark(grammar: str, param: str) -> str:
    """The Lark grammar of `grammar`'s strings as written inside a JSON string.

    Raises InvalidRequest naming `param` for what the rewrite cannot express (rule 6)."""
    try:
        return _quote(_expand_imports(grammar))
    except Refused as exc:
        raise InvalidRequest(
            f"The grammar in '{param}' cannot be enforced inside this model's JSON tool "
            f"calls: {exc}.", param=param) from None


def quote_regex_grammar(regex: str, param: str) -> str:
    """A Lark grammar for the escaped strings of one regex (a `regex` custom tool)."""
    try:
        expression = quoted_expression(regex)
    except Refused as exc:
        raise InvalidRequest(
            f"The regular expression in '{param}' cannot be enforced inside this model's "
            f"JSON tool calls: {exc}.", param=param) from None
    return f"start: {expression}\n" if expression else f"start: /{_slashes(regex)}/\n"


def _slashes(regex: str) -> str:
    return re.sub(r"(\\.)|/", lambda m: m[1] or "\\/", regex)


def decode_lark_string(token: str) -> tuple[str, bool]:
    """A Lark string literal's text (JSON escapes plus \\xHH) and its `i` flag."""
    insensitive = token.endswith("i")
    inner = token[1:-2] if insensitive else token[1:-1]
    json_text = re.sub(r"\\(x[0-9a-fA-F]{2}|.)",
                       lambda m: "\\u00" + m[1][1:] if len(m[1]) == 3 else m[0], inner)
    return str(json.loads(f'"{json_text}"')), insensitive


def _tokens(src: str) -> list[_Token]:
    return [_Token(m.lastgroup or "other", m.group(), m.start()) for m in _TOKEN.finditer(src)]


def _expand_imports(src: str) -> str:
    """Rule 5, before anything else: imports become definitions (or stay)."""
    out, i = [], 0
    for token in _tokens(src):
        if token.start < i:
            continue
        if token.kind == "directive" and token.text == "%import":
            m = _IMPORT.match(src, token.start)
            if m is None:
                refuse("only '%import common.NAME' is supported")
            names = [(m[1], m[2] or m[1])] if m[1] else \
                [(n.strip(), n.strip()) for n in m[3].split(",") if n.strip()]
            out.append("\n".join(_common(name, alias) for name, alias in names))
            i = m.end()
            continue
        out.append(token.text)
        i = token.start + len(token.text)
    return "".join(out)


def _common(name: str, alias: str) -> str:
    if name in COMMON_PLAIN:
        return f"%import common.{name}" + (f" -> {alias}" if alias != name else "")
    if name in COMMON_SPECIAL:
        return f"{alias}: /{COMMON_SPECIAL[name]}/"
    refuse(f"'%import common.{name}' is not supported")


def _quote(src: str) -> str:
    tokens = _tokens(src)
    heads = _statements(tokens)
    rendered = [_render(src, tokens, k) for k in range(len(tokens))]
    converted = _converted_terminals(tokens, heads)
    names = {t.text for t in tokens if t.kind == "name"}
    rename = {name: _rule_name(name, names) for name in converted}
    for k, token in enumerate(tokens):
        head = heads.get(token.statement)
        if token.kind == "name" and token.text in rename:
            rendered[k] = rename[token.text]
        elif token.text == "&" and head in converted:
            refuse(f"the terminal {head} needs escapes and uses '&'")
        elif head == "%ignore" and (token.escaped or token.text in converted):
            refuse("an ignored terminal cannot hold characters that need escapes")
    return "".join(r for r in rendered if r is not None)


def _statements(tokens: list[_Token]) -> dict[int, str]:
    """Number each token's statement; statement -> the name it defines (or its directive).

    A statement starts at a line's first token when that is a directive or a
    name followed (after an optional `.N` priority or `[...]` options) by ':'."""
    heads: dict[int, str] = {}
    number, line_start = 0, True
    for k, token in enumerate(tokens):
        if token.kind in ("nl", "comment"):
            line_start = line_start or token.kind == "nl"
        elif token.kind != "ws":
            if line_start and (token.kind == "directive" or
                               (token.kind == "name" and _defines(tokens, k))):
                number += 1
                heads[number] = token.text
            line_start = False
        token.statement = number
    return heads


def _defines(tokens: list[_Token], k: int) -> bool:
    depth = 0
    for token in tokens[k + 1:]:
        if token.kind == "ws":
            continue
        if depth:
            depth += (token.text == "[") - (token.text == "]")
        elif token.text == "[":
            depth = 1
        elif token.text == ":":
            return True
        elif not (token.text == "." or token.text.isdigit()):
            return False
    return False


def _render(src: str, tokens: list[_Token], k: int) -> str | None:
    """One token's text in the quoted grammar (None: consumed by the token before)."""
    token = tokens[k]
    if token.kind == "string":
        return _string(tokens, k)
    if token.kind == "regex":
        body, _, flags = token.text[1:].rpartition("/")
        expression = quoted_expression(body, flags)
        token.escaped = expression is not None
        return expression or token.text
    if token.kind == "directive":
        return _directive(src, tokens, k)
    if token.kind == "other":
        if token.text == "<":
            refuse("special tokens cannot be written inside a JSON string")
        if token.text == "@":
            refuse("nested grammars (@name) are not supported")
        if token.text == "~":
            after = next((t for t in tokens[k + 1:] if t.kind != "ws"), None)
            if after is None or not after.text[:1].isdigit():
                refuse("negated terminals (~X) are not supported")
    if token.text == "\x00consumed":
        return None
    return token.text


def _string(tokens: list[_Token], k: int) -> str:
    """Rule 2; a range's second string and its dots are marked consumed."""
    token = tokens[k]
    text, insensitive = decode_lark_string(token.text)
    rest = [j for j in range(k + 1, min(k + 8, len(tokens))) if tokens[j].kind != "ws"]
    if len(rest) >= 3 and [tokens[j].text for j in rest[:2]] == [".", "."] \
            and tokens[rest[2]].kind == "string":
        hi, hi_insensitive = decode_lark_string(tokens[rest[2]].text)
        if len(text) != 1 or len(hi) != 1 or insensitive or hi_insensitive:
            refuse("a range needs two single characters")
        for j in range(k + 1, rest[2] + 1):
            tokens[j].text = "\x00consumed"
            tokens[j].kind = "consumed"
        return _as_regex(token, f"[{_hex(text)}-{_hex(hi)}]",
                         f"/[{_hex(text)}-{_hex(hi)}]/")
    if insensitive:
        return _as_regex(token, "(?i:" + "".join(_hex(c) for c in text) + ")", token.text)
    token.escaped = any(c in SPECIALS for c in text)
    return lark_string("".join(escape_char(c) for c in text))


def _as_regex(token: _Token, regex: str, plain: str) -> str:
    expression = quoted_expression(regex)
    token.escaped = expression is not None
    return expression or plain


def _hex(c: str) -> str:
    return f"\\x{{{ord(c):x}}}"


def _directive(src: str, tokens: list[_Token], k: int) -> str:
    token = tokens[k]
    if token.text == "%llguidance":   # its JSON options, copied as they are
        j = token.start + len(token.text)
        while j < len(src) and src[j] in " \t":
            j += 1
        try:
            _, end = json.JSONDecoder().raw_decode(src, j)
        except ValueError:
            refuse("%llguidance needs a JSON object")
        for later in tokens[k + 1:]:
            if later.start >= end:
                break
            later.text, later.kind = "\x00consumed", "consumed"
        return src[token.start:end]
    if token.text in _KEPT_DIRECTIVES:
        return token.text
    refuse(f"{token.text} is not supported")


def _converted_terminals(tokens: list[_Token], heads: dict[int, str]) -> set[str]:
    """Rule 4: terminals holding escapes, and those that name them (to a fixpoint)."""
    terminals = {name for name in heads.values() if _TERMINAL.match(name)}
    converted = {heads[t.statement] for t in tokens
                 if t.escaped and heads.get(t.statement) in terminals}
    while True:
        more = {heads[t.statement] for t in tokens if t.kind == "name" and t.text in converted
                and heads.get(t.statement) in terminals} - converted
        if not more:
            return converted
        converted |= more


def _rule_name(terminal: str, taken: set[str]) -> str:
    name = "q-" + terminal.lower()
    while name in taken:
        name = "q" + name
    taken.add(name)
    return name
