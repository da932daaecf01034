"""Custom tools' grammars in the engine: under `auto` the call the model opens holds the
grammar (core/structured.py rules 6-7), with Codex's apply_patch grammar and the tiny
tokenizer; what the rows allow is judged token by token through GrammarConstraint."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from grammar_support import CODEX_GRAMMAR

from frink_mlx.core.parsers import MarkupInfo
from frink_mlx.core.request import GenRequest, Message, Tool, ToolGrammar
from frink_mlx.core.structured import grammar_for_request
from frink_mlx.engine.constraints import GrammarCompiler, GrammarConstraint
from frink_mlx.errors import InvalidRequest

HERMES = MarkupInfo(tool_call_start="<tool_call>", tool_call_end="</tool_call>",
                    tool_format="json_tools")
INPUT = {"type": "object", "properties": {"input": {"type": "string"}}, "required": ["input"],
         "additionalProperties": False}
PATCH = Tool("apply_patch", "Edit files", INPUT, strict=True,
             grammar=ToolGrammar("lark", CODEX_GRAMMAR, "tools[0].format.definition"))
SHELL = Tool("shell", "Run a command", {"type": "object", "properties": {
    "command": {"type": "array", "items": {"type": "string"}}}, "required": ["command"]})
GOOD_PATCH = ('*** Begin Patch\n*** Update File: src/a "b".py\n@@ def f():\n'
              '-    return "\\t"\n+    return 1\t# tab\n*** End Patch\n')
OPENING = '<tool_call>\n{"name": "apply_patch", "arguments": {"input": "'


@pytest.fixture(scope="module")
def tok(tiny_llama_dir: Path) -> Any:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(tiny_llama_dir)


@pytest.fixture(scope="module")
def compiler(tok: Any) -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(tok, vocab_size=len(tok._tokenizer))


def auto_row(compiler: GrammarCompiler, tools: list[Tool]) -> GrammarConstraint:
    spec = grammar_for_request(GenRequest(model="m", messages=[Message("user", "hi")],
                                          tools=tools), HERMES)
    assert spec is not None and spec.embeds
    return compiler.new_constraints(spec)[0]


def feed(tok: Any, row: GrammarConstraint, text: str) -> None:
    for token in tok.encode(text, add_special_tokens=False):
        assert row.allowed_mask()[token], (text, tok.decode([token]))
        assert row.accept(token), row.error


def allowed_texts(tok: Any, row: GrammarConstraint) -> set[str]:
    return {tok.decode([int(i)]) for i in np.flatnonzero(row.allowed_mask())}


def call(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def test_auto_leaves_text_free_and_binds_an_opened_custom_call(tok: Any,
                                                              compiler: GrammarCompiler) -> None:
    row = auto_row(compiler, [SHELL, PATCH])
    feed(tok, row, "Sure, I will edit <b>it</b>. ")
    assert row.allowed_mask()[tok.eos_token_id]   # text alone may end the turn
    feed(tok, row, OPENING)
    assert allowed_texts(tok, row) <= {"*", ""}, allowed_texts(tok, row)
    feed(tok, row, json.dumps(GOOD_PATCH)[1:-1] + '"}}\n</tool_call>')
    assert row.error is None and row.allowed_mask()[tok.eos_token_id]


def test_auto_refuses_a_patch_the_grammar_forbids(tok: Any, compiler: GrammarCompiler) -> None:
    row = auto_row(compiler, [SHELL, PATCH])
    feed(tok, row, OPENING + "*** Begin Patch\\n*** Update File: a.py\\n")
    newline = tok.encode("\n", add_special_tokens=False)
    assert len(newline) == 1 and not row.allowed_mask()[newline[0]]   # raw: not in JSON
    line = tok.encode("x", add_special_tokens=False)   # a change line opens with + - space @@
    assert len(line) == 1 and not row.allowed_mask()[line[0]]
    with pytest.raises(AssertionError):
        feed(tok, row, '"}}')   # a patch without "*** End Patch" cannot close the string


def test_auto_keeps_function_calls_and_several_calls(tok: Any, compiler: GrammarCompiler) -> None:
    row = auto_row(compiler, [SHELL, PATCH])
    feed(tok, row, call("shell", {"command": ["ls"]}) + "\n")
    feed(tok, row, call("apply_patch", {"input": "*** Begin Patch\n*** Delete File: x\n"
                                                 "*** End Patch"}))
    assert row.error is None and row.allowed_mask()[tok.eos_token_id]


def test_a_custom_tool_without_grammar_takes_any_string(compiler: GrammarCompiler) -> None:
    free = Tool("note", "", INPUT, strict=True)
    spec = grammar_for_request(GenRequest(model="m", messages=[Message("user", "hi")],
                                          tools=[free, PATCH], tool_choice="note"), HERMES)
    assert spec is not None and spec.embeds == ()   # only the chosen tool's body is built


def test_a_bad_definition_is_named_even_under_auto(compiler: GrammarCompiler) -> None:
    bad = Tool("apply_patch", "", INPUT, strict=True,
               grammar=ToolGrammar("lark", "start: (", "tools[2].format.definition"))
    spec = grammar_for_request(GenRequest(model="m", messages=[Message("user", "hi")],
                                          tools=[SHELL, bad]), HERMES)
    assert spec is not None
    with pytest.raises(InvalidRequest) as err:
        compiler.new_constraints(spec)
    assert err.value.param == "tools[2].format.definition"


def test_no_json_markup_means_no_grammar() -> None:
    """qwen3_coder and Mistral write calls that are not JSON: no grammar (rule 5)."""
    for markup in (MarkupInfo(tool_format="qwen3_coder"), MarkupInfo(tool_format="mistral")):
        req = GenRequest(model="m", messages=[Message("user", "hi")], tools=[PATCH])
        assert grammar_for_request(req, markup) is None


def test_a_forced_call_in_llama3_json_holds_the_grammar(tok: Any, compiler: GrammarCompiler) -> None:
    spec = grammar_for_request(GenRequest(model="m", messages=[Message("user", "hi")],
                                          tools=[SHELL, PATCH], tool_choice="apply_patch"),
                               MarkupInfo(tool_format="llama3_json"))
    assert spec is not None
    (row,) = compiler.new_constraints(spec)
    feed(tok, row, '{"name": "apply_patch", "parameters": {"input": "')
    assert allowed_texts(tok, row) <= {"*", ""}
    feed(tok, row, json.dumps(GOOD_PATCH)[1:-1] + '"}}')
    assert row.is_done() or row.allowed_mask()[tok.eos_token_id]
