"""Custom tools' grammars enforced over HTTP (Responses), on the real engine.

Codex's own apply_patch grammar (tests/data/codex_apply_patch.lark) and a
regex tool, with tiny models: `tiny` (random weights; the injected Hermes
tool format, so calls are JSON and the input a JSON string) and `bigram`
(grammar_support.py: a steered tiny model that finishes a patch). Every
custom_tool_call's input is judged against the client's raw grammar by
llguidance's matcher, apart from the JSON-quoting rewrite under test.
"""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from grammar_support import CODEX_GRAMMAR, is_prefix, make_bigram_llama, matches

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files with a patch",
              "format": {"type": "grammar", "syntax": "lark", "definition": CODEX_GRAMMAR}}
FORCE_PATCH = {"type": "custom", "name": "apply_patch"}
CODE_REGEX = r'(yes|no) "[a-c]{1,3}"\t[0-9]{2}\n?'
CODE_TOOL = {"type": "custom", "name": "code", "description": "A code",
             "format": {"type": "grammar", "syntax": "regex", "definition": CODE_REGEX}}
BIGRAM_FINISHED = "*** Begin Patch\n*** Delete File: E\n*** End Patch"
# Qwen3-Coder's layout: calls are XML with raw values, no JSON string to hold the grammar in
XML_CALLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n<tools>{% for tool in tools %}{{ tool | tojson }}"
    "{% endfor %}</tools>\nCall a tool as <tool_call>\n<function=NAME>\n<parameter=KEY>\n"
    "value\n</parameter>\n</function>\n</tool_call><|im_end|>\n{%- endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WEATHER = {"type": "function", "name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import make_tiny_llama
    from daemon_support import generation_factory, start_server

    root = tmp_path_factory.mktemp("custom_grammar")
    tiny = make_tiny_llama(root / "tiny")
    xml = make_tiny_llama(root / "xml", chat_template=XML_CALLS_TEMPLATE)
    # after "\": "n" (a newline); after "E": "\"; after a space: "E" ("End"), else "D"
    bigram = make_bigram_llama(root / "bigram", {"\\": ["n"], "E": ["\\"], " ": ["E", "D"]},
                               default=["E", '"', "\\", "n"])
    (root / "models.toml").write_text(
        f'default = "tiny"\n\n[models.tiny]\nsource = "{tiny}"\n\n'
        f'[models.bigram]\nsource = "{bigram}"\n\n[models.xml]\nsource = "{xml}"\n')
    settings = Settings.load(models_path=str(root / "models.toml"), min_generation_s=0.0,
                             access_log=False, cache_dir=str(root / "cache"), fallback=False)
    live = start_server(create_app(settings, registry=load_registry(settings),
                                   factory=generation_factory()))
    yield live
    live.stop()


def _post(server: Any, **body: Any) -> httpx.Response:
    return httpx.post(server.url + "/v1/responses", json={"temperature": 0, **body}, timeout=300)


def _stream(server: Any, **body: Any) -> list[dict[str, Any]]:
    with httpx.stream("POST", server.url + "/v1/responses", timeout=300,
                      json={"temperature": 0, "stream": True, **body}) as r:
        assert r.status_code == 200, r.read()
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]


def _custom_calls(output: list[dict[str, Any]]) -> list[dict[str, Any]]:
    calls = [item for item in output if item["type"] == "custom_tool_call"]
    assert calls and len(calls) == len(output), output
    return calls


def test_a_forced_apply_patch_call_holds_codex_grammar_plain_and_streamed(server: Any) -> None:
    body = {"model": "bigram", "input": "please patch", "tools": [PATCH_TOOL],
            "tool_choice": FORCE_PATCH, "max_output_tokens": 200}
    r = _post(server, **body)
    assert r.status_code == 200, r.text
    assert r.json()["status"] == "completed"
    (call,) = _custom_calls(r.json()["output"])
    assert call["name"] == "apply_patch" and call["input"] == BIGRAM_FINISHED
    assert matches(CODEX_GRAMMAR, call["input"])

    events = _stream(server, **body)
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == BIGRAM_FINISHED
    (final,) = _custom_calls(events[-1]["response"]["output"])
    assert final["input"] == BIGRAM_FINISHED and events[-1]["type"] == "response.completed"


def test_the_same_model_unconstrained_writes_no_patch(server: Any) -> None:
    """The bigram model alone never writes a patch: the grammar made the one above."""
    r = _post(server, model="bigram", input="please patch", max_output_tokens=20)
    assert "Begin Patch" not in json.dumps(r.json()["output"])


def test_required_with_only_custom_tools_forces_a_grammar_bound_call(server: Any) -> None:
    r = _post(server, model="bigram", input="please patch", tools=[PATCH_TOOL],
              tool_choice="required", max_output_tokens=200)
    (call,) = _custom_calls(r.json()["output"])
    assert call["input"] == BIGRAM_FINISHED


@pytest.mark.parametrize("stream", [False, True])
def test_a_random_model_stays_inside_the_grammar_until_cut(server: Any, stream: bool) -> None:
    """Random weights never finish a file name, so the call is cut by max_output_tokens:
    what it wrote is still a prefix of a patch (the raw grammar can continue it)."""
    body = {"model": "tiny", "input": "fix the bug", "tools": [PATCH_TOOL, WEATHER],
            "tool_choice": FORCE_PATCH, "max_output_tokens": 120}
    output = _stream(server, **body)[-1]["response"] if stream else _post(server, **body).json()
    (call,) = _custom_calls(output["output"])
    assert output["status"] == "incomplete"
    assert call["input"].startswith("*** Begin Patch\n*** ")
    assert len(call["input"]) > len("*** Begin Patch\n*** Delete File: ")
    assert is_prefix(CODEX_GRAMMAR, call["input"]) and not matches(CODEX_GRAMMAR, call["input"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_regex_custom_tool_holds_its_regex(server: Any, stream: bool) -> None:
    body = {"model": "tiny", "input": "a code please", "tools": [CODE_TOOL, PATCH_TOOL],
            "tool_choice": {"type": "custom", "name": "code"}, "max_output_tokens": 120}
    output = _stream(server, **body)[-1]["response"] if stream else _post(server, **body).json()
    (call,) = _custom_calls(output["output"])
    assert output["status"] == "completed" and call["name"] == "code"
    assert re.fullmatch(CODE_REGEX, call["input"]), call["input"]
    assert matches(CODE_REGEX, call["input"], syntax="regex")
    assert '"' in call["input"] and "\t" in call["input"]   # both written escaped in the JSON


def test_a_constrained_row_leaves_its_batch_neighbour_unchanged(server: Any) -> None:
    plain = {"model": "tiny", "input": "The weather in Paris", "max_output_tokens": 24}
    solo = _post(server, **plain).json()["output"]
    shaped = {"model": "tiny", "input": "fix the bug", "tools": [PATCH_TOOL],
              "tool_choice": FORCE_PATCH, "max_output_tokens": 120}
    with ThreadPoolExecutor(4) as pool:
        patches = [pool.submit(_post, server, **shaped) for _ in range(2)]
        plains = [pool.submit(_post, server, **plain) for _ in range(2)]
        for future in patches:
            (call,) = _custom_calls(future.result().json()["output"])
            assert is_prefix(CODEX_GRAMMAR, call["input"]), call["input"]
        for future in plains:
            assert [item["content"] for item in future.result().json()["output"]] == \
                [item["content"] for item in solo]


@pytest.mark.parametrize(("tool", "param", "needle"), [
    ({**PATCH_TOOL, "format": {**PATCH_TOOL["format"], "definition": "start: (\"a\""}},
     "tools[0].format.definition", "Lark grammar"),
    ({**PATCH_TOOL, "format": {**PATCH_TOOL["format"], "definition": 'start: "a" <|im_end|>'}},
     "tools[0].format.definition", "special tokens"),
    ({**PATCH_TOOL, "format": {**PATCH_TOOL["format"], "definition": "x" * (64 * 1024 + 1)}},
     "tools[0].format.definition", "limit"),
    ({**CODE_TOOL, "format": {**CODE_TOOL["format"], "definition": "(ab"}},
     "tools[0].format.definition", "regular expression"),
    ({**PATCH_TOOL, "format": {**PATCH_TOOL["format"], "syntax": "ebnf"}},
     "tools[0].format.syntax", "ebnf"),
    ({**PATCH_TOOL, "format": {"type": "json"}}, "tools[0].format.type", "json"),
])
def test_an_unusable_grammar_is_a_400_naming_it(server: Any, tool: dict[str, Any], param: str,
                                                needle: str) -> None:
    name = tool["name"]
    for choice in ({"type": "custom", "name": name}, "auto"):
        r = _post(server, model="tiny", input="hi", tools=[tool], tool_choice=choice,
                  max_output_tokens=4)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["param"] == param and needle in error["message"], error


def test_a_bad_grammar_in_a_stream_is_a_400_before_any_event(server: Any) -> None:
    tool = {**PATCH_TOOL, "format": {**PATCH_TOOL["format"], "definition": "start: /[/"}}
    with httpx.stream("POST", server.url + "/v1/responses", timeout=60, json={
            "model": "tiny", "input": "hi", "tools": [tool], "stream": True}) as r:
        assert r.status_code == 400
        assert json.loads(r.read())["error"]["param"] == "tools[0].format.definition"


def test_a_grammar_the_markup_cannot_carry_is_reported_not_refused(server: Any) -> None:
    """XML tool calls write the input raw, outside any JSON string: no grammar is built
    (structured.py rule 5), and tools[i].format says so in the ignored-fields header."""
    for choice in (FORCE_PATCH, "auto"):
        r = _post(server, model="xml", input="please patch", tools=[WEATHER, PATCH_TOOL],
                  tool_choice=choice, max_output_tokens=4)
        assert r.status_code == 200, r.text
        assert r.headers["x-frink-ignored-fields"] == "tools[1].format"
    r = _post(server, model="tiny", input="please patch", tools=[WEATHER, PATCH_TOOL],
              max_output_tokens=4)
    assert "x-frink-ignored-fields" not in r.headers
