"""core/json_quote.py and json_quote_regex.py: grammars for text inside a JSON string.

The rewritten grammar must accept exactly the JSON-escaped strings of the
original: checked with llguidance's matcher (grammar_support.py) on escaped
texts, against Python's `re` for regexes and by hand for Lark grammars.
"""

from __future__ import annotations

import json
import random
import re

import pytest
from grammar_support import CODEX_GRAMMAR, matches

from frink_mlx.core.json_quote import quote_lark, quote_regex_grammar
from frink_mlx.core.json_quote_regex import escape_char
from frink_mlx.errors import InvalidRequest


def escaped(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)[1:-1]


def lark_accepts(grammar: str, text: str) -> bool:
    return matches(quote_lark(grammar, "g"), escaped(text))


def test_escapes_are_json_dumps_own() -> None:
    for c in [chr(i) for i in range(0x80)] + ["é", "\u2028", "😀"]:
        assert escape_char(c) == escaped(c), repr(c)


REGEXES = [r"a.b", r"[^a]*", r"(ab|\n)+c?", r"\s+", r"\S{2,3}", r'["\\]x', r"[\x00-\x1f]*",
           r"(?s:.)\n", r"(?i)AB\t", r"[a-c\t-\r]+", r"x|\d+|\W", r"[^\n]*\n", r'(?:"[^"]*")+',
           r"\\n", r"[a-z&&[^b]]+", r"[[:space:]]*", r"^(yes|no)$", r"a{2}[\n\t]{1,2}"]
ALPHABET = ["a", "b", "c", "x", "A", "B", "1", "\n", "\t", '"', "\\", "\x01", "\r", " ", "n",
            "\x0b"]


def _python(rx: str) -> str:
    """The same regex for Python's `re` on this ASCII alphabet (Rust's \\s is Unicode
    White_Space, which unlike Python's leaves out \\x1c-\\x1f)."""
    space = r"\t\n\x0b\x0c\r "
    return (rx.replace("[[:space:]]", f"[{space}]").replace("[a-z&&[^b]]", "[ac-z]")
            .replace(r"\s", f"[{space}]").replace(r"\S", f"[^{space}]"))


@pytest.mark.parametrize("rx", REGEXES)
def test_an_escaped_regex_accepts_exactly_the_escapes_of_its_strings(rx: str) -> None:
    grammar = quote_regex_grammar(rx, "g")
    rng = random.Random(rx)
    texts = ["".join(rng.choice(ALPHABET) for _ in range(rng.randint(1, 5))) for _ in range(60)]
    texts += ["ab", "a\tb", "abab\nc", " \t", '"x', "\\x", "\x01\x1f", "\n\n", "AB\t", "ab\t",
              "\\n", "yes", "aa\n\t", '"a"""']
    positives = 0
    for text in texts:
        want = re.fullmatch(_python(rx), text) is not None
        assert matches(grammar, escaped(text)) == want, (rx, text)
        positives += want
    assert positives, rx


PATCH = ('*** Begin Patch\n*** Update File: src/a "b".py\n@@ def f():\n-    return "\\t"\n'
         "+    return 1\t# a tab\n*** Add File: notes\\today.md\n+# Notes\n+\n*** End Patch\n")


def test_codex_apply_patch_grammar() -> None:
    assert lark_accepts(CODEX_GRAMMAR, PATCH)
    assert lark_accepts(CODEX_GRAMMAR, "*** Begin Patch\n*** Delete File: x\n*** End Patch")
    assert not lark_accepts(CODEX_GRAMMAR, PATCH.replace("@@", "@!"))
    assert not lark_accepts(CODEX_GRAMMAR, PATCH.replace("*** End Patch\n", ""))
    assert not matches(quote_lark(CODEX_GRAMMAR, "g"), PATCH)   # the raw text is not JSON
    rewritten = quote_lark(CODEX_GRAMMAR, "g")
    assert "# Codex CLI's apply_patch grammar" in rewritten   # comments are kept
    assert 'q-lf: ("\\\\n")' in rewritten and "%import" not in rewritten


def test_a_terminal_that_needs_escapes_becomes_a_rule_and_its_references_follow() -> None:
    grammar = 'start: LINE+\nLINE: TEXT "\\n"\nTEXT: /[^\\n]*/\nWORD: /[a-z]+/\n'
    rewritten = quote_lark(grammar, "g")
    assert "q-line" in rewritten and "q-text" in rewritten and "WORD: /[a-z]+/" in rewritten
    assert lark_accepts(grammar, 'a "q"\n\tb\n')
    assert not lark_accepts(grammar, "a\nb")


def test_literals_ranges_and_options() -> None:
    assert lark_accepts('start: "say \\"hi\\"\\n"', 'say "hi"\n')
    assert lark_accepts('start: ("a".."c")+ SEP "x"i\nSEP: "\\t".."\\r"', "abca\rX")
    assert not lark_accepts('start: ("a".."c")+ SEP "x"i\nSEP: "\\t".."\\r"', "abca\x0eX")
    assert lark_accepts('%llguidance {}\nstart: "a" NL\n%import common.LF -> NL', "a\n")
    assert lark_accepts("start: INT WS_INLINE LF\n%import common (INT, WS_INLINE, LF)", "42 \t\n")
    assert lark_accepts('start: w ("," w)*\nw: /[a-z]+/\n%ignore " "', "ab, cd ,e")
    assert lark_accepts("start: /a\\/b/ /\\x{22}/", 'a/b"')
    assert matches(quote_regex_grammar('a/b"', "g"), 'a/b\\"')


@pytest.mark.parametrize(("grammar", "needle"), [
    ('start: "a" <|im_end|>', "special tokens"),
    ("start: @sub", "nested grammars"),
    ('start: %json {"type": "object"}', "%json"),
    ('start: A\nA: ~"a"', "negated"),
    ('start: A\nA: /[a-z\\n]+/ & /a+/', "'&'"),
    ('start: "a"\n%ignore /[ \\t]/', "ignored"),
    ("start: ESCAPED_STRING\n%import common.ESCAPED_STRING", "ESCAPED_STRING"),
    ("start: /\\p{L}+/", "Unicode classes"),
    ("start: /(?=a)a/", "group"),
    ("start: /a*?/", "lazy"),
    ("start: /(?x)a/", "verbose"),
])
def test_what_the_rewrite_cannot_express_is_refused_by_name(grammar: str, needle: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        quote_lark(grammar, "tools[1].format.definition")
    assert err.value.param == "tools[1].format.definition" and needle in str(err.value)


def test_a_repetition_count_is_not_a_negation() -> None:
    assert lark_accepts('start: "a\\n" ~ 2', "a\na\n")
