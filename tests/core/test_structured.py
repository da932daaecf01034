"""core/structured.py: request constraints -> grammar specs, pure (no llguidance, no MLX)."""

from __future__ import annotations

import json

import pytest

from frink_mlx.core.parsers import MarkupInfo
from frink_mlx.core.request import GenRequest, Message, ResponseFormat, Tool
from frink_mlx.core.structured import (
    JSON_OPTIONS,
    MAX_SPEC_CHARS,
    GrammarSpec,
    check_schema,
    grammar_for_format,
    grammar_for_request,
    grammar_for_tools,
)
from frink_mlx.errors import InvalidRequest

HERMES = MarkupInfo(tool_call_start="<tool_call>", tool_call_end="</tool_call>",
                    tool_format="json_tools")
WEATHER = Tool("get_weather", "Weather for a city",
               {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TIME = Tool("get_time", "", {"type": "object", "properties": {}})


def test_json_object_is_any_object_with_canonical_layout() -> None:
    spec = grammar_for_format(ResponseFormat("json_object"))
    assert spec.kind == "json_schema"
    assert json.loads(spec.text) == {"type": "object", "x-guidance": JSON_OPTIONS}
    assert spec.param == "response_format"


def test_json_schema_keeps_property_order_and_records_param() -> None:
    schema = {"type": "object", "properties": {"z": {"type": "integer"}, "a": {"type": "string"}}}
    spec = grammar_for_format(ResponseFormat("json_schema", schema=schema, strict=True,
                                             param="text.format"))
    assert spec.param == "text.format"
    assert list(json.loads(spec.text)["properties"]) == ["z", "a"]


def test_equal_schemas_share_a_cache_key_and_different_ones_do_not() -> None:
    a = grammar_for_format(ResponseFormat("json_schema", schema={"type": "integer"}))
    b = grammar_for_format(ResponseFormat("json_schema", schema={"type": "integer"}))
    c = grammar_for_format(ResponseFormat("json_schema", schema={"type": "string"}))
    assert a.key == b.key != c.key


def test_client_x_guidance_overrides_layout() -> None:
    spec = grammar_for_format(ResponseFormat(
        "json_schema", schema={"type": "object", "x-guidance": {"whitespace_flexible": True}}))
    assert json.loads(spec.text)["x-guidance"]["whitespace_flexible"] is True


def test_grammar_and_regex_pass_through() -> None:
    assert grammar_for_format(ResponseFormat("grammar", grammar='root ::= "a"')) == \
        GrammarSpec("gbnf", 'root ::= "a"', "response_format")
    assert grammar_for_format(ResponseFormat("regex", pattern="[0-9]+", param="x")).kind == "regex"


@pytest.mark.parametrize("fmt, needle", [
    (ResponseFormat("json_schema"), "needs a JSON Schema"),
    (ResponseFormat("json_schema", schema=[1, 2]), "must be a JSON Schema object"),  # type: ignore[arg-type]
    (ResponseFormat("json_schema", schema={"type": "objectx"}), 'unknown type "objectx"'),
    (ResponseFormat("json_schema", schema={"type": "object", "properties": []}),
     "'properties' must be an object"),
    (ResponseFormat("json_schema", schema={"type": "object", "required": "a"}),
     "'required' must be a list"),
    (ResponseFormat("json_schema", schema={"properties": {"a": {"type": 3}}}),
     "#/properties/a/type"),
    (ResponseFormat("json_schema", schema={"anyOf": []}), "'anyOf' must be a non-empty list"),
    (ResponseFormat("json_schema", schema={"enum": "a"}), "'enum' must be a list"),
    (ResponseFormat("json_schema", schema={"type": "object", "x-guidance": 1}), "x-guidance"),
    (ResponseFormat("grammar", grammar="  "), "needs a GBNF grammar"),
    (ResponseFormat("regex"), "needs a regular expression"),
    (ResponseFormat("regex", pattern="a" * (MAX_SPEC_CHARS + 1)), "the limit is"),
])
def test_bad_formats_are_refused_by_name(fmt: ResponseFormat, needle: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        grammar_for_format(fmt)
    assert needle in info.value.message
    assert info.value.param == "response_format"
    assert info.value.status == 400


def test_schema_depth_is_bounded() -> None:
    schema: dict = {"type": "integer"}
    for _ in range(40):
        schema = {"type": "array", "items": schema}
    with pytest.raises(InvalidRequest, match="nest deeper"):
        check_schema(schema, "response_format")


def test_boolean_subschemas_and_true_root_are_fine() -> None:
    check_schema(True, "p")
    check_schema({"type": "object", "properties": {"a": True}, "additionalProperties": False}, "p")


def test_draft07_tuple_items_are_schemas_too() -> None:
    """Rule 7: `items` as a list (drafts 4-2019) is the tuple form, checked item by item."""
    spec = grammar_for_format(ResponseFormat(
        "json_schema", schema={"items": [{"type": "integer"}], "additionalItems": False}))
    assert json.loads(spec.text)["items"] == [{"type": "integer"}]
    with pytest.raises(InvalidRequest, match="#/items/1/type"):
        check_schema({"items": [{"type": "integer"}, {"type": "int"}]}, "p")
    with pytest.raises(InvalidRequest, match="#/additionalItems"):
        check_schema({"items": [{"type": "integer"}], "additionalItems": 3}, "p")


def test_tool_choice_auto_and_none_are_unconstrained() -> None:
    assert grammar_for_tools([WEATHER], "auto", HERMES) is None
    assert grammar_for_tools([WEATHER], "none", HERMES) is None


def test_named_tool_choice_builds_one_hermes_call() -> None:
    spec = grammar_for_tools([WEATHER, TIME], "get_weather", HERMES)
    assert spec is not None and spec.kind == "lark" and spec.param == "tools"
    assert 'start: call\n' in spec.text
    assert '"<tool_call>" "\\n" body "\\n" "</tool_call>"' in spec.text
    body = json.loads(spec.text.split("%json ", 1)[1])
    assert body["properties"]["name"] == {"const": "get_weather"}
    assert body["properties"]["arguments"] == {**WEATHER.parameters, "additionalProperties": False}
    assert "get_time" not in spec.text


def test_required_allows_any_offered_tool_one_or_more_times() -> None:
    spec = grammar_for_tools([WEATHER, TIME], "required", HERMES)
    assert spec is not None
    assert 'start: call ("\\n" call)*' in spec.text
    body = json.loads(spec.text.split("%json ", 1)[1])
    assert [v["properties"]["name"]["const"] for v in body["anyOf"]] == ["get_weather", "get_time"]


def test_unknown_tool_name_and_missing_tools_are_400() -> None:
    with pytest.raises(InvalidRequest, match="not among the offered tools") as info:
        grammar_for_tools([WEATHER], "send_mail", HERMES)
    assert info.value.param == "tool_choice"
    with pytest.raises(InvalidRequest, match="needs at least one tool"):
        grammar_for_tools([], "required", HERMES)


def test_tool_grammars_are_held_to_the_grammar_limit() -> None:
    """Forced and strict tool grammars were built past MAX_SPEC_CHARS unchecked."""
    enum = [f"value-{i:06d}" for i in range(MAX_SPEC_CHARS // 10)]
    big = Tool("pick", "", {"type": "object", "properties": {"v": {"enum": enum}}})
    with pytest.raises(InvalidRequest, match="the limit is") as info:
        grammar_for_tools([WEATHER, big], "required", HERMES)
    assert info.value.param == "tools"
    strict = Tool("pick", "", big.parameters, strict=True)
    req = GenRequest(model="m", messages=[Message("user", "hi")], tools=[strict])
    with pytest.raises(InvalidRequest, match="the limit is") as info:
        grammar_for_request(req, HERMES)
    assert info.value.param == "tools"


def test_a_named_tools_bad_schema_is_named_by_its_own_index() -> None:
    bad = Tool("broken", "", {"type": "objekt"})
    with pytest.raises(InvalidRequest, match=r"tools\[1\]\.parameters"):
        grammar_for_tools([WEATHER, bad], "broken", HERMES)


def test_llama3_json_calls_are_bare_objects_with_parameters() -> None:
    llama3 = MarkupInfo(tool_call_start="<|python_tag|>", tool_format="llama3_json")
    spec = grammar_for_tools([WEATHER, TIME], "required", llama3)
    assert spec is not None
    assert 'start: call ("; " call)*' in spec.text and "call: body\n" in spec.text
    assert "python_tag" not in spec.text
    body = json.loads(spec.text.split("%json ", 1)[1])
    assert body["anyOf"][0]["required"] == ["name", "parameters"]


def test_formats_without_a_grammar_fall_back_to_unconstrained() -> None:
    assert grammar_for_tools([WEATHER], "required", MarkupInfo()) is None
    assert grammar_for_tools([WEATHER], "required", MarkupInfo(tool_format="mistral")) is None


def test_forced_tool_call_wins_over_response_format() -> None:
    req = GenRequest(model="m", messages=[Message("user", "hi")], tools=[WEATHER],
                     tool_choice="required", response_format=ResponseFormat("json_object"))
    spec = grammar_for_request(req, HERMES)
    assert spec is not None and spec.kind == "lark"
    assert grammar_for_request(req, MarkupInfo()) is None  # the call is the output, not JSON text
    req.tool_choice = "auto"
    plain = grammar_for_request(req, MarkupInfo())
    assert plain is not None and plain.kind == "json_schema"
    assert grammar_for_request(GenRequest(model="m", prompt="x"), HERMES) is None


def test_forced_call_arguments_admit_only_declared_parameters() -> None:
    from frink_mlx.core.structured import closed_objects

    schema = {"type": "object", "properties": {
        "city": {"type": "string"},
        "where": {"type": "object", "properties": {"lat": {"type": "number"}}},
        "tags": {"type": "array", "items": {"type": "object", "properties": {"k": {}}}},
        "free": {"type": "object", "additionalProperties": True}}}
    closed = closed_objects(schema)
    assert closed["additionalProperties"] is False
    assert closed["properties"]["where"]["additionalProperties"] is False
    assert closed["properties"]["tags"]["items"]["additionalProperties"] is False
    assert closed["properties"]["free"]["additionalProperties"] is True  # the client's word stands
    assert "additionalProperties" not in schema  # the request's own schema is not mutated
