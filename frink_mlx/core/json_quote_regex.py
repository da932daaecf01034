"""Regexes for text written inside a JSON string, as Lark expressions (core/json_quote.py).

A regex (Rust syntax, as llguidance reads it) is parsed into a small tree and
written back as a Lark *rule* expression over the JSON-escaped text, where
every escape sequence is a lexeme of its own. Why not one escaped regex:
llguidance's lexer is greedy with one byte of lookahead, and every escape
starts with a backslash, so an escaped `/(.*)/` followed by the escaped
newline `\\n` would read the backslash as the start of another escape inside
the first lexeme and fail at the `n` (the raw grammar has no such conflict:
`.` does not match a newline). With the escapes as their own lexemes the
parser, not the lexer, chooses between them, one escape at a time.

Rules:
1. A regex whose language holds no special character (`"`, `\\`, controls) is
   kept as one lexeme, unchanged (returned as None).
2. Otherwise: runs of safe characters stay literals; a special character is
   the literal of its escape; a class, `.` or `\\d`-style class becomes its
   safe part (class intersection `[C&&[^"\\\\\\x00-\\x1F]]`, one lexeme, a
   whole run of them under `*` or `+`) or one lexeme of the escapes of the
   special characters it holds. Groups, alternation and quantifiers become
   the same Lark operators; `^` and `$` (only valid at the ends) are dropped;
   `i` and `s` flags are honoured (escapes never fold case).
3. Refused: lazy quantifiers (llguidance refuses them too), lookarounds,
   backreferences, word boundaries, `\\p{...}` classes, the `x` flag.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NoReturn, Union

SPECIALS = frozenset([chr(c) for c in range(0x20)] + ['"', "\\"])
SAFE_CLASS = r'[^"\\\x00-\x1F]'
SHORT_ESCAPES = {'"': '"', "\\": "\\", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}
_PERL = {"d": frozenset(), "w": frozenset(), "s": frozenset("\t\n\v\f\r")}
_POSIX = {"space": frozenset("\t\n\v\f\r"), "cntrl": frozenset(chr(c) for c in range(0x20)),
          "blank": frozenset("\t"), "punct": frozenset('"\\'), "print": frozenset('"\\'),
          "graph": frozenset('"\\'), "ascii": SPECIALS}
_CHAR_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "f": "\f", "v": "\v", "a": "\a"}
_HEX_DIGITS = {"x": 2, "u": 4, "U": 8}


class Refused(ValueError):
    """A construct the rewrite cannot express (the caller names the request field)."""


def refuse(why: str) -> NoReturn:
    raise Refused(why)


def escape_char(c: str) -> str:
    """One character as json.dumps writes it inside a string (canonical escapes)."""
    if c in SHORT_ESCAPES:
        return "\\" + SHORT_ESCAPES[c]
    return f"\\u{ord(c):04x}" if ord(c) < 0x20 else c


def lark_string(text: str) -> str:
    """A Lark string literal for `text`."""
    body = "".join('\\"' if c == '"' else "\\\\" if c == "\\"
                   else f"\\u{ord(c):04x}" if ord(c) < 0x20 or c == "\x7f" else c
                   for c in text)
    return f'"{body}"'


@dataclass(slots=True)
class Char:
    c: str
    src: str          # as written in the regex (kept for safe characters)
    fold: bool


@dataclass(slots=True)
class CharSet:
    src: str          # the class as written: [..], \d, .
    specials: frozenset[str]
    fold: bool


@dataclass(slots=True)
class Alt:
    options: list[list["Item"]] = field(default_factory=list)


Node = Union[Char, CharSet, Alt]
Item = tuple[Node, str]   # a node and its quantifier ('' when none)


# -- parsing ---------------------------------------------------------------------------
def _escape_at(rx: str, i: int) -> tuple[str | None, frozenset[str] | None, int]:
    """The escape at rx[i] == '\\': (char, None, end) or (None, specials of a class, end)."""
    if i + 1 >= len(rx):
        refuse("the regex ends in a lone backslash")
    c = rx[i + 1]
    if c in _CHAR_ESCAPES:
        return _CHAR_ESCAPES[c], None, i + 2
    if c in _HEX_DIGITS:
        if rx.startswith("{", i + 2):
            end = rx.find("}", i + 3)
            digits, stop = rx[i + 3:max(end, i + 3)], end + 1
        else:
            digits, stop = rx[i + 2:i + 2 + _HEX_DIGITS[c]], i + 2 + _HEX_DIGITS[c]
        try:
            return chr(int(digits, 16)), None, stop
        except ValueError:
            refuse(f"bad escape {rx[i:i + 12]!r}")
    if c.lower() in _PERL:
        inside = _PERL[c.lower()]
        return None, inside if c.islower() else SPECIALS - inside, i + 2
    if c in "pP":
        refuse("Unicode classes (\\p{...}) are not supported here")
    if c.isalnum():
        refuse(f"the escape \\{c} is not supported here")
    return c, None, i + 2


def _class_item(rx: str, i: int) -> tuple[frozenset[str], int]:
    """One item of a class at rx[i]: a char, a range, an escape class, a nested or POSIX class."""
    if rx.startswith("[:", i):
        end = rx.find(":]", i + 2)
        if end < 0:
            refuse("unclosed POSIX class")
        name = rx[i + 2:end]
        inside = _POSIX.get(name.lstrip("^"), frozenset())
        return (SPECIALS - inside if name.startswith("^") else inside), end + 2
    if rx[i] == "[":
        return class_at(rx, i)
    if rx[i] == "\\":
        lo, specials, j = _escape_at(rx, i)
        if specials is not None:
            return specials, j
    else:
        lo, j = rx[i], i + 1
    assert lo is not None
    if j + 1 < len(rx) and rx[j] == "-" and rx[j + 1] != "]":
        if rx[j + 1] == "\\":
            hi, hi_set, j = _escape_at(rx, j + 1)
        else:
            hi, hi_set, j = rx[j + 1], None, j + 2
        if hi is None or hi_set is not None:
            refuse("a class range ends in a class")
        return frozenset(s for s in SPECIALS if lo <= s <= hi), j
    return frozenset({lo}) & SPECIALS, j


def class_at(rx: str, i: int) -> tuple[frozenset[str], int]:
    """The specials the bracket class at rx[i] == '[' holds, and where it ends.

    Rust's precedence: union binds tighter than &&, -- and ~~ (left to right);
    a leading ^ negates the whole; ']' right after '[' or '[^' is literal."""
    j = i + 1
    negated = rx.startswith("^", j)
    j += negated
    result: frozenset[str] | None = None
    union: frozenset[str] = frozenset()
    op, first = "", True
    while True:
        if j >= len(rx):
            refuse("unclosed character class")
        if rx[j] == "]" and not first:
            break
        if rx[j:j + 2] in ("&&", "--", "~~"):
            result = _combine(result, op, union)
            op, union, j = rx[j:j + 2], frozenset(), j + 2
            continue
        item, j = _class_item(rx, j)
        union, first = union | item, False
    result = _combine(result, op, union)
    return (SPECIALS - result if negated else result), j + 1


def _combine(left: frozenset[str] | None, op: str, right: frozenset[str]) -> frozenset[str]:
    if left is None:
        return right
    return {"&&": left & right, "--": left - right, "~~": left ^ right}[op]


@dataclass(slots=True)
class _Parser:
    rx: str
    i: int = 0

    def alt(self, fold: bool, dotall: bool) -> Alt:
        """Alternatives up to ')' or the end; inline flags apply to the rest of the group."""
        node, seq = Alt(), list[Item]()
        while self.i < len(self.rx) and self.rx[self.i] != ")":
            c = self.rx[self.i]
            if c == "|":
                node.options.append(seq)
                seq, self.i = [], self.i + 1
                continue
            if c in "^$":
                self.i += 1
                continue
            if self.rx.startswith("(?", self.i) and (flags := self._inline_flags()) is not None:
                fold, dotall = _apply_flags(flags, fold, dotall)
                continue
            atom = self.atom(fold, dotall)
            seq.append((atom, self.quantifier()))
        node.options.append(seq)
        return node

    def _inline_flags(self) -> str | None:
        """`(?is)`: flags for the rest of the group (consumed); None for other groups."""
        end = self.rx.find(")", self.i)
        body = self.rx[self.i + 2:end] if end > 0 else ""
        if end < 0 or not body or not all(ch.isalpha() or ch == "-" for ch in body):
            return None
        self.i = end + 1
        return body

    def atom(self, fold: bool, dotall: bool) -> Node:
        rx, i = self.rx, self.i
        if rx[i] == "\\":
            char, specials, self.i = _escape_at(rx, i)
            if specials is not None:
                return CharSet(rx[i:self.i], specials, fold)
            return Char(char or "", rx[i:self.i], fold)
        if rx[i] == "[":
            specials, self.i = class_at(rx, i)
            return CharSet(rx[i:self.i], specials, fold)
        if rx[i] == ".":
            self.i += 1
            return CharSet(".", SPECIALS if dotall else SPECIALS - {"\n"}, fold)
        if rx[i] == "(":
            return self.group(fold, dotall)
        if rx[i] in "*+?" or (rx[i] == "{" and _repeat_at(rx, i)):
            refuse(f"a quantifier with nothing to repeat at {i}")
        self.i += 1
        return Char(rx[i], "\\{" if rx[i] == "{" else rx[i], fold)

    def group(self, fold: bool, dotall: bool) -> Alt:
        rx = self.rx
        if rx.startswith("(?", self.i):
            if rx.startswith(("(?P<", "(?<"), self.i) and rx[self.i + 3:self.i + 4] not in "=!":
                self.i = rx.index(">", self.i) + 1
            else:
                colon = rx.find(":", self.i)
                flags = rx[self.i + 2:colon]
                if colon < 0 or not all(ch.isalpha() or ch == "-" for ch in flags):
                    refuse(f"the group {rx[self.i:self.i + 4]!r} is not supported")
                fold, dotall = _apply_flags(flags, fold, dotall)
                self.i = colon + 1
        else:
            self.i += 1
        node = self.alt(fold, dotall)
        if self.i >= len(rx):
            refuse("unclosed group")
        self.i += 1
        return node

    def quantifier(self) -> str:
        rx, i = self.rx, self.i
        if i < len(rx) and rx[i] in "*+?":
            q, self.i = rx[i], i + 1
        elif (end := _repeat_at(rx, i)) is not None:
            q, self.i = rx[i:end], end
        else:
            return ""
        if self.i < len(rx) and rx[self.i] in "?+":
            refuse("lazy quantifiers are not supported")
        return q


def _repeat_at(rx: str, i: int) -> int | None:
    """The end of a `{n}`, `{n,}` or `{n,m}` counted repeat at rx[i], or None."""
    if not rx.startswith("{", i):
        return None
    end = rx.find("}", i)
    body = rx[i + 1:end] if end > 0 else ""
    lo, _, hi = body.partition(",")
    if not lo.isdigit() or (hi and not hi.isdigit()):
        return None
    return end + 1


def _apply_flags(flags: str, fold: bool, dotall: bool) -> tuple[bool, bool]:
    on, _, off = flags.partition("-")
    if "x" in on:
        refuse("the x (verbose) flag is not supported")
    return ("i" in on or (fold and "i" not in off)), ("s" in on or (dotall and "s" not in off))


def parse_regex(rx: str, flags: str = "") -> Alt:
    """The tree of `rx` (Rust syntax) under Lark regex flags (`i`, `s`)."""
    fold, dotall = _apply_flags(flags, False, False)
    parser = _Parser(rx)
    tree = parser.alt(fold, dotall)
    if parser.i < len(rx):
        refuse(f"unbalanced ')' at {parser.i}")
    return tree


# -- writing ---------------------------------------------------------------------------
def has_specials(node: Node) -> bool:
    if isinstance(node, Char):
        return node.c in SPECIALS
    if isinstance(node, CharSet):
        return bool(node.specials)
    return any(has_specials(n) for seq in node.options for n, _ in seq)


def quoted_expression(rx: str, flags: str = "") -> str | None:
    """Rules 1-2: a Lark expression for the escaped strings of `rx`, or None when
    no string of it needs escaping (the regex can stay as it is)."""
    tree = parse_regex(rx, flags)
    return f"({_alt(tree)})" if has_specials(tree) else None


def _alt(node: Alt) -> str:
    return " | ".join(_seq(seq) for seq in node.options)


def _seq(seq: list[Item]) -> str:
    """Unquantified safe characters of one case mode join into one literal."""
    parts: list[str] = []
    run: list[Char] = []

    def flush() -> None:
        if run:
            parts.append(_safe_run(run))
            run.clear()

    for node, q in seq:
        if isinstance(node, Char) and node.c not in SPECIALS:
            if q:
                flush()
                parts.append(_safe_run([node]) + q)
            else:
                if run and run[0].fold != node.fold:
                    flush()
                run.append(node)
            continue
        flush()
        parts.append(_item(node, q))
    flush()
    return " ".join(parts) or '""'


def _slashes_escaped(src: str) -> str:
    """`src` with every unescaped '/' escaped, to sit inside Lark's /.../."""
    out, i = [], 0
    while i < len(src):
        if src[i] == "\\":
            out.append(src[i:i + 2])
            i += 2
            continue
        out.append("\\/" if src[i] == "/" else src[i])
        i += 1
    return "".join(out)


def _lexeme(source: str, fold: bool) -> str:
    return f"/(?i:{source})/" if fold else f"/{source}/"


def _safe_run(run: list[Char]) -> str:
    if not run[0].fold:
        return lark_string("".join(ch.c for ch in run))
    return _lexeme(_slashes_escaped("".join(ch.src for ch in run)), True)


def _item(node: Node, q: str) -> str:
    if isinstance(node, Char):   # a special character: the literal of its escape
        return lark_string(escape_char(node.c)) + q
    if isinstance(node, Alt):
        return f"({_alt(node)}){q}"
    src = _slashes_escaped(node.src)
    if not node.specials:
        return _lexeme(src, node.fold) + q
    safe = SAFE_CLASS if src == "." else f"[{src}&&{SAFE_CLASS}]"
    runs = "+" if q in ("*", "+") else ""
    units = [_lexeme(safe + runs, node.fold), "/" + escapes_regex(node.specials) + "/"]
    return f"({' | '.join(units)}){q}"


def escapes_regex(specials: frozenset[str]) -> str:
    """One regex for the escapes of `specials` (2-character ones, then \\u00xx)."""
    short = "".join(sorted(SHORT_ESCAPES[c] for c in specials if c in SHORT_ESCAPES))
    codes = sorted(f"{ord(c):02x}" for c in specials if c not in SHORT_ESCAPES)
    parts = []
    if short:
        parts.append("\\\\[" + short.replace("\\", "\\\\") + "]")
    if codes:
        parts.append("\\\\u00(?:" + "|".join(codes) + ")")
    return "(?-i:" + "|".join(parts) + ")"
