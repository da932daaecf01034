"""engine/constraints.py: llguidance matchers behind the RowConstraint protocol.

Uses the tiny checkpoint's real byte-level BPE tokenizer (fast) and, for the
JSON paths that matter, the default model's tokenizer (SmolLM2, 49152 tokens).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import pytest

from frink_mlx.core.parsers import MarkupInfo
from frink_mlx.core.request import GenRequest, Message, ResponseFormat, Tool
from frink_mlx.core.structured import GrammarSpec, grammar_for_format, grammar_for_tools
from frink_mlx.engine.constraints import (
    GrammarCompiler,
    GrammarConstraint,
    apply_constraints,
    build_constraints,
    unpack_bitmask,
)
from frink_mlx.engine.types import RowConstraint
from frink_mlx.errors import InvalidRequest, UnsupportedField


def _load_tokenizer(path: Path) -> Any:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    return load_tokenizer(path)


@pytest.fixture(scope="module")
def tiny_tok(tiny_llama_dir: Path) -> Any:
    return _load_tokenizer(tiny_llama_dir)


@pytest.fixture(scope="module")
def tiny_compiler(tiny_tok: Any) -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(tiny_tok, vocab_size=len(tiny_tok._tokenizer))


@pytest.fixture(scope="module")
def smol_tok(smollm2_dir: Path) -> Any:
    return _load_tokenizer(smollm2_dir)


@pytest.fixture(scope="module")
def smol_compiler(smol_tok: Any) -> GrammarCompiler:
    return GrammarCompiler.for_tokenizer(smol_tok, vocab_size=49152)


def schema_spec(schema: Any) -> GrammarSpec:
    return grammar_for_format(ResponseFormat("json_schema", schema=schema))


def feed_text(tok: Any, row: GrammarConstraint, text: str) -> None:
    """Advance `row` by the tokenizer's own tokens for `text`; each must be allowed first."""
    for token_id in tok.encode(text, add_special_tokens=False):
        assert row.allowed_mask()[token_id], f"token {token_id} ({tok.decode([token_id])!r}) masked"
        assert row.accept(token_id), row.error


def test_a_grammar_constraint_is_a_row_constraint(tiny_compiler: GrammarCompiler) -> None:
    row: RowConstraint = tiny_compiler.new_constraints(schema_spec({"type": "integer"}))[0]
    assert row.error is None and not row.is_done()


def test_regex_row_walks_to_done(tiny_tok: Any, tiny_compiler: GrammarCompiler) -> None:
    row = tiny_compiler.new_constraints(GrammarSpec("regex", "(yes|no)"))[0]
    mask = row.allowed_mask()
    assert mask.dtype == bool and mask.shape == (len(tiny_tok._tokenizer),)
    allowed = {tiny_tok.decode([int(i)]) for i in np.flatnonzero(mask)}
    assert allowed and all("yes".startswith(t) or "no".startswith(t) for t in allowed)
    feed_text(tiny_tok, row, "yes")
    assert row.is_done() and row.error is None
    eos = tiny_tok.eos_token_id
    assert row.allowed_mask()[eos]  # only end-of-sequence may follow
    assert row.allowed_mask().sum() == 1


def test_json_schema_row_accepts_only_valid_json(smol_tok: Any, smol_compiler: GrammarCompiler) -> None:
    schema = {"type": "object", "properties": {"name": {"type": "string"},
                                               "age": {"type": "integer", "minimum": 0}},
              "required": ["name", "age"], "additionalProperties": False}
    row = smol_compiler.new_constraints(schema_spec(schema))[0]
    feed_text(smol_tok, row, '{"name": "Ada", "age": 36')
    assert not row.is_done()
    bad = smol_tok.encode(', "x', add_special_tokens=False)[0]
    assert not row.allowed_mask()[bad] or smol_tok.decode([bad]) == ","
    feed_text(smol_tok, row, "}")
    assert row.is_done()


@pytest.mark.parametrize("text, fits", [("[1, \"a\"]", True), ("[1]", True),
                                        ("[\"a\"]", False), ("[1, \"a\", 2]", False)])
def test_draft07_tuple_items_bind_each_position(tiny_tok: Any, tiny_compiler: GrammarCompiler,
                                                text: str, fits: bool) -> None:
    """core/structured.py rule 8: `items` as a list is a tuple, `additionalItems` what follows."""
    schema = {"type": "array", "items": [{"type": "integer"}, {"type": "string"}],
              "additionalItems": False}
    row = tiny_compiler.new_constraints(schema_spec(schema))[0]
    ids = tiny_tok.encode(text, add_special_tokens=False)
    walked = all(row.allowed_mask()[t] and row.accept(t) for t in ids)
    assert (walked and row.is_done()) is fits


def test_rows_from_one_spec_are_independent_copies(tiny_tok: Any, tiny_compiler: GrammarCompiler) -> None:
    a, b = tiny_compiler.new_constraints(GrammarSpec("regex", "(yes|no)"), 2)
    before = b.allowed_mask().copy()
    feed_text(tiny_tok, a, "no")
    assert a.is_done() and not b.is_done()
    assert np.array_equal(b.allowed_mask(), before)


def test_a_disallowed_token_is_a_dead_end_for_that_row_only(tiny_tok: Any,
                                                             tiny_compiler: GrammarCompiler) -> None:
    a, b = tiny_compiler.new_constraints(GrammarSpec("regex", "[0-9]+"), 2)
    letter = tiny_tok.encode("x", add_special_tokens=False)[0]
    assert not a.allowed_mask()[letter]
    assert a.accept(letter) is False
    assert a.error is not None and "Structured output failed" in a.error
    assert not a.allowed_mask().any() and not a.is_done()
    assert a.accept(tiny_tok.encode("1", add_special_tokens=False)[0]) is False  # stays dead
    feed_text(tiny_tok, b, "12")
    assert b.error is None


def test_out_of_vocab_token_fails_cleanly(tiny_compiler: GrammarCompiler) -> None:
    row = tiny_compiler.new_constraints(GrammarSpec("regex", "a"))[0]
    assert row.accept(10**6) is False and "outside" in (row.error or "")


@pytest.mark.parametrize("spec, needle", [
    (schema_spec({"type": "array", "uniqueItems": True}), "uniqueItems"),
    (schema_spec({"not": {"type": "integer"}}), "not"),
    (schema_spec({"$ref": "#/$defs/missing"}), "missing"),
    (schema_spec({"type": "string", "format": "no-such-format"}), "no-such-format"),
    (GrammarSpec("regex", "[a-z", "json_schema"), "unclosed character class"),
    (GrammarSpec("gbnf", "root ::= item\n", "grammar"), "item"),
    (GrammarSpec("gbnf", 'root ::= "a', "grammar"), "GBNF"),
    (GrammarSpec("lark", "start: missing_rule", "tools"), "missing_rule"),
])
def test_bad_grammars_are_400_naming_the_problem(tiny_compiler: GrammarCompiler, spec: GrammarSpec,
                                                 needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        tiny_compiler.compile(spec)
    assert needle in info.value.message
    assert info.value.param == spec.param and info.value.status == 400


def test_gbnf_grammar_constrains(tiny_tok: Any, tiny_compiler: GrammarCompiler) -> None:
    spec = grammar_for_format(ResponseFormat("grammar", grammar='root ::= "yes" | "no"'))
    row = tiny_compiler.new_constraints(spec)[0]
    feed_text(tiny_tok, row, "no")
    assert row.is_done()


def test_compiled_grammars_are_cached_in_a_bounded_lru(tiny_tok: Any) -> None:
    compiler = GrammarCompiler.for_tokenizer(tiny_tok, vocab_size=len(tiny_tok._tokenizer),
                                             max_cached=2)
    specs = [GrammarSpec("regex", p) for p in ("a", "b", "c")]
    compiler.new_constraints(specs[0], 3)
    compiler.new_constraints(specs[0])
    assert compiler.num_compiled == 1 and compiler.num_cached == 1
    compiler.compile(specs[1])
    compiler.compile(specs[0])          # a is now the most recent
    compiler.compile(specs[2])          # evicts b
    assert compiler.num_cached == 2 and compiler.num_compiled == 3
    compiler.compile(specs[0])
    assert compiler.num_compiled == 3
    compiler.compile(specs[1])
    assert compiler.num_compiled == 4


def test_mask_is_padded_or_trimmed_to_the_logits_width(tiny_tok: Any) -> None:
    tokenizer_vocab = len(tiny_tok._tokenizer)
    for width in (tokenizer_vocab + 70, tokenizer_vocab - 5):
        compiler = GrammarCompiler.for_tokenizer(tiny_tok, vocab_size=width)
        mask = compiler.new_constraints(GrammarSpec("regex", "(.|\n)*"))[0].allowed_mask()
        assert mask.shape == (width,)
        if width > tokenizer_vocab:
            assert not mask[tokenizer_vocab:].any()
        assert mask[:min(width, tokenizer_vocab)].sum() > 100


def test_unpack_bitmask_matches_a_bit_loop() -> None:
    rng = np.random.default_rng(0)
    words = rng.integers(-2**31, 2**31, size=5, dtype=np.int64).astype(np.int32)
    expected = [bool((int(words[i // 32]) >> (i % 32)) & 1) for i in range(150)]
    assert unpack_bitmask(words, 150, 150).tolist() == expected
    assert unpack_bitmask(words, 150, 160).tolist() == expected + [False] * 10
    assert unpack_bitmask(words, 150, 100).tolist() == expected[:100]


def test_apply_constraints_masks_rows_and_leaves_others(tiny_tok: Any,
                                                        tiny_compiler: GrammarCompiler) -> None:
    import mlx.core as mx

    vocab = len(tiny_tok._tokenizer)
    row = tiny_compiler.new_constraints(GrammarSpec("regex", "[0-9]"))[0]
    allowed = row.allowed_mask()
    logits = mx.random.normal((2, vocab))
    out = np.array(apply_constraints(logits, [row, None]))
    assert np.array_equal(np.isfinite(out[0]), allowed)
    assert np.array_equal(out[1], np.array(logits[1]))
    assert apply_constraints(logits, [None, None]) is logits
    best = int(np.argmax(out[0]))
    assert tiny_tok.decode([best]).isdigit()


def test_hermes_tool_call_grammar(tiny_tok: Any, tiny_compiler: GrammarCompiler) -> None:
    tool = Tool("add", "", {"type": "object", "properties": {"a": {"type": "integer"}},
                            "required": ["a"], "additionalProperties": False})
    markup = MarkupInfo(tool_call_start="<tool_call>", tool_call_end="</tool_call>",
                        tool_format="json_tools")
    spec = grammar_for_tools([tool], "add", markup)
    assert spec is not None
    row = tiny_compiler.new_constraints(spec)[0]
    body = json.dumps({"name": "add", "arguments": {"a": 3}})
    feed_text(tiny_tok, row, f"<tool_call>\n{body}\n</tool_call>")
    assert row.is_done(), row.error


def test_llama3_json_required_call_grammar(tiny_tok: Any, tiny_compiler: GrammarCompiler) -> None:
    tools = [Tool("add", "", {"type": "object", "properties": {"a": {"type": "integer"}},
                              "required": ["a"], "additionalProperties": False}),
             Tool("now", "", {"type": "object", "properties": {}, "additionalProperties": False})]
    spec = grammar_for_tools(tools, "required", MarkupInfo(tool_format="llama3_json"))
    assert spec is not None
    row = tiny_compiler.new_constraints(spec)[0]
    feed_text(tiny_tok, row, '{"name": "now", "parameters": {}}; {"name": "add", "parameters": {"a": 1}}')
    assert row.error is None and not row.is_done()  # a third call may follow
    assert row.allowed_mask()[tiny_tok.eos_token_id]


def test_build_constraints_compiles_off_the_event_loop(tiny_compiler: GrammarCompiler) -> None:
    req = GenRequest(model="m", messages=[Message("user", "hi")], n=3,
                     response_format=ResponseFormat("regex", pattern="[a-z]{1,40}"))
    seen: list[str] = []
    original = tiny_compiler.new_constraints

    def spy(spec: GrammarSpec, n: int = 1, **kw: Any) -> list[GrammarConstraint]:
        seen.append(threading.current_thread().name)
        return original(spec, n, **kw)

    async def main() -> Any:
        loop_thread = threading.current_thread().name
        tiny_compiler.new_constraints = spy  # type: ignore[method-assign]
        try:
            rows = await build_constraints(req, MarkupInfo(), tiny_compiler)
        finally:
            del tiny_compiler.new_constraints
        assert seen and seen[0] != loop_thread
        return rows

    rows = anyio.run(main)
    assert len(rows) == 3 and all(isinstance(r, GrammarConstraint) for r in rows)
    plain = GenRequest(model="m", messages=[Message("user", "hi")])
    assert anyio.run(build_constraints, plain, MarkupInfo(), tiny_compiler) is None


def test_bad_schema_raises_from_build_constraints(tiny_compiler: GrammarCompiler) -> None:
    req = GenRequest(model="m", prompt="x", response_format=ResponseFormat(
        "json_schema", schema={"type": "object", "patternProperties": {"[": {}}},
        param="text.format"))
    with pytest.raises(InvalidRequest) as info:
        anyio.run(build_constraints, req, MarkupInfo(), tiny_compiler)
    assert info.value.param == "text.format"


def test_matchers_work_on_another_thread_than_the_compiler(tiny_tok: Any,
                                                           tiny_compiler: GrammarCompiler) -> None:
    rows = tiny_compiler.new_constraints(GrammarSpec("regex", "(yes|no)"), 1)
    errors: list[BaseException] = []

    def engine_thread() -> None:
        try:
            feed_text(tiny_tok, rows[0], "yes")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=engine_thread)
    t.start()
    t.join()
    assert not errors and rows[0].is_done()


def test_an_open_think_block_stays_free_until_it_closes(tiny_tok: Any,
                                                         tiny_compiler: GrammarCompiler) -> None:
    req = GenRequest(model="m", prompt="x", response_format=ResponseFormat("regex", pattern="(yes|no)"))
    thinking = MarkupInfo(think_start="<think>", think_end="</think>", prompt_opens_thinking=True)
    row = anyio.run(build_constraints, req, thinking, tiny_compiler)[0]
    assert isinstance(row, GrammarConstraint) and row.in_free_prefix
    for token_id in tiny_tok.encode("The answer is 42.</think>", add_special_tokens=False):
        assert row.allowed_mask() is None and not row.is_done()
        assert row.accept(token_id)
    assert not row.in_free_prefix
    assert row.allowed_mask() is not None
    feed_text(tiny_tok, row, "no")
    assert row.is_done()
    closed = MarkupInfo(think_start="<think>", think_end="</think>", prompt_opens_thinking=False)
    row = anyio.run(build_constraints, req, closed, tiny_compiler)[0]
    assert not row.in_free_prefix and row.allowed_mask() is not None


def test_metal_bitmask_rows_match_the_bool_masks(tiny_tok: Any) -> None:
    """The words handed to llguidance's Metal kernel mean exactly the bool masks."""
    from frink_mlx.engine.constraints import _stack_bitmasks

    width = len(tiny_tok._tokenizer) + 40  # padded embeddings: wider logits than the tokenizer
    compiler = GrammarCompiler.for_tokenizer(tiny_tok, vocab_size=width)
    shaped = compiler.new_constraints(GrammarSpec("regex", "[0-9]+"))[0]
    free = compiler.new_constraints(GrammarSpec("regex", "a"), free_until="</think>")[0]
    words = _stack_bitmasks([shaped, None, free], width)
    assert np.array_equal(unpack_bitmask(words[0], width, width), shaped.allowed_mask())
    assert unpack_bitmask(words[1], width, width).all()
    assert unpack_bitmask(words[2], width, width).all() and free.allowed_mask() is None


@pytest.mark.metal
def test_metal_kernel_path_equals_the_portable_path(tiny_tok: Any,
                                                    tiny_compiler: GrammarCompiler) -> None:
    import mlx.core as mx

    if not mx.metal.is_available():
        pytest.skip("needs Apple's Metal backend")
    rows = tiny_compiler.new_constraints(GrammarSpec("regex", "[0-9]+"), 2)
    logits = mx.random.normal((3, len(tiny_tok._tokenizer)))
    # the kernel path, as the Metal backend asks for it (Backend.device_token_masks)
    out = np.array(apply_constraints(logits, [rows[0], None, rows[1]], device_masks=True))
    expected = rows[0].allowed_mask()
    assert np.array_equal(np.isfinite(out[0]), expected)
    assert np.array_equal(out[1], np.array(logits[1]))


def test_a_tokenizer_llguidance_cannot_read_is_refused_by_name() -> None:
    compiler = GrammarCompiler(object(), vocab_size=10)  # not a fast HF tokenizer
    with pytest.raises(UnsupportedField, match="this model's tokenizer") as info:
        compiler.new_constraints(GrammarSpec("regex", "a"))
    assert info.value.status == 400 and info.value.param == "response_format"


STRICT_TOOL = Tool("get_weather", "", {"type": "object", "properties": {"city": {"type": "string"}},
                                       "required": ["city"], "additionalProperties": False},
                   strict=True)
HERMES_MARKUP = MarkupInfo(tool_call_start="<tool_call>", tool_call_end="</tool_call>",
                           tool_format="json_tools")


def strict_row(compiler: GrammarCompiler, *, parallel: bool = True) -> GrammarConstraint:
    req = GenRequest(model="m", messages=[Message("user", "hi")], tools=[STRICT_TOOL],
                     parallel_tool_calls=parallel)
    from frink_mlx.core.structured import grammar_for_request

    spec = grammar_for_request(req, HERMES_MARKUP)
    assert spec is not None and spec.kind == "lark"
    return compiler.new_constraints(spec)[0]


def test_strict_tools_under_auto_allow_text(tiny_tok: Any, tiny_compiler: GrammarCompiler) -> None:
    row = strict_row(tiny_compiler)
    feed_text(tiny_tok, row, "It is sunny, <b>really</b>.\n")
    assert row.allowed_mask()[tiny_tok.eos_token_id]


def test_strict_tools_under_auto_bind_an_opened_call(tiny_tok: Any,
                                                     tiny_compiler: GrammarCompiler) -> None:
    """Issue 23: once the model opens <tool_call>, only schema-valid arguments follow."""
    row = strict_row(tiny_compiler)
    feed_text(tiny_tok, row, 'Let me check.<tool_call>\n{"name": "get_weather", "arguments": {"city": ')
    mask = row.allowed_mask()
    allowed = {tiny_tok.decode([int(i)]) for i in np.flatnonzero(mask)}
    assert allowed and all(t.startswith('"') or t == "" for t in allowed), allowed
    feed_text(tiny_tok, row, '"Paris"}}\n</tool_call>')
    assert row.error is None and row.allowed_mask()[tiny_tok.eos_token_id]


def test_strict_tools_refuse_a_broken_call(tiny_tok: Any, tiny_compiler: GrammarCompiler) -> None:
    row = strict_row(tiny_compiler)
    feed_text(tiny_tok, row, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris')
    more = tiny_tok.encode('",', add_special_tokens=False)
    assert len(more) == 1 and not row.allowed_mask()[more[0]]  # additionalProperties: false
    feed_text(tiny_tok, row, '"}}')  # ... the object can only close
    with pytest.raises(AssertionError):
        feed_text(tiny_tok, row, "22C")  # only the markup's "\n</tool_call>" may follow


def test_non_strict_tools_get_no_grammar_under_auto() -> None:
    from frink_mlx.core.structured import grammar_for_request

    loose = Tool("f", "", {"type": "object"})
    req = GenRequest(model="m", messages=[Message("user", "hi")], tools=[loose])
    assert grammar_for_request(req, HERMES_MARKUP) is None
    strict = GenRequest(model="m", messages=[Message("user", "hi")], tools=[STRICT_TOOL])
    assert grammar_for_request(strict, MarkupInfo(tool_format="llama3_json")) is None


def test_masks_along_a_draft_past_the_grammars_end_leave_the_matcher_where_it_was(
        tiny_compiler: GrammarCompiler, tiny_tok: Any) -> None:
    """Drafts may run past end-of-sequence (rule 6): the walk stops at the end, and the
    rollback undoes exactly what was consumed, so the row goes on as before."""
    (row,) = tiny_compiler.new_constraints(GrammarSpec("regex", "[a-m]{2}"))
    text = [t for t in tiny_tok.encode("ab") if t != 0]
    eos = 2
    draft = [*text, eos, eos, eos]
    masks = row.masks_along(draft)
    assert len(masks) == len(draft) + 1 and row.error is None
    for token in [*text, eos]:
        assert row.accept(token), row.error
    assert row.is_done()
