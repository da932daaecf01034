"""Anthropic adapter on golden JSON, no model: wire -> GenRequest, events -> frames/message."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from anthropic.lib.streaming._messages import accumulate_event

from frink_mlx.adapters.anthropic import wire
from frink_mlx.adapters.anthropic.frames import MessageBuilder, thinking_signature
from frink_mlx.adapters.anthropic.translate import to_gen_request
from frink_mlx.core.events import (
    Done,
    ErrorEvent,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolCallEnd,
    ToolCallStart,
    Usage,
)
from frink_mlx.core.images import IMAGE_PLACEHOLDER
from frink_mlx.core.request import Message, ToolCall
from frink_mlx.errors import InvalidRequest, UnsupportedField
from frink_mlx.http.body import decode_struct

TOOL_ROUND_TRIP = {
    "model": "default", "max_tokens": 64, "temperature": 0.5, "top_p": 0.9, "top_k": 20,
    "stop_sequences": ["END"], "metadata": {"user_id": "u1"},
    "system": [{"type": "text", "text": "Be brief.", "cache_control": {"type": "ephemeral"}}],
    "thinking": {"type": "enabled", "budget_tokens": 2048},
    "tools": [{"name": "get_weather", "description": "Weather for a city",
               "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "auto"},
    "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": [
            {"type": "thinking", "thinking": "Use the tool.", "signature": "sig"},
            {"type": "text", "text": "Checking."},
            {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "toolu_1",
             "content": [{"type": "text", "text": "18C, sunny"}]},
            {"type": "text", "text": "Thanks!"}]},
    ],
}


def decode(body: dict[str, Any], kind: type = wire.MessagesRequest) -> Any:
    return decode_struct(json.dumps(body).encode(), kind)


def test_tool_round_trip_request_translates() -> None:
    gen = to_gen_request(decode(TOOL_ROUND_TRIP))
    assert gen.messages == [
        Message("system", "Be brief."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "Checking.", tool_calls=[
            ToolCall("toolu_1", "get_weather", '{"city": "Paris"}')], reasoning="Use the tool."),
        Message("tool", "18C, sunny", tool_call_id="toolu_1", name="get_weather"),
        Message("user", "Thanks!"),
    ]
    assert [t.name for t in gen.tools] == ["get_weather"]
    assert gen.tools[0].parameters["properties"]["city"] == {"type": "string"}
    assert (gen.max_tokens, gen.stop, gen.user) == (64, ["END"], "u1")
    assert (gen.sampling.temperature, gen.sampling.top_p, gen.sampling.top_k) == (0.5, 0.9, 20)
    assert (gen.thinking, gen.thinking_budget_tokens, gen.tool_choice) == (True, 2048, "auto")
    assert gen.sampling_sent == {"temperature", "top_p", "top_k"}


@pytest.mark.parametrize("choice,expected", [
    ({"type": "any"}, "required"), ({"type": "none"}, "none"),
    ({"type": "tool", "name": "get_weather"}, "get_weather")])
def test_tool_choice_mapping(choice: dict, expected: str) -> None:
    assert to_gen_request(decode({**TOOL_ROUND_TRIP, "tool_choice": choice})).tool_choice == expected


def test_disable_parallel_tool_use_maps() -> None:
    gen = to_gen_request(decode({**TOOL_ROUND_TRIP, "tool_choice": {
        "type": "any", "disable_parallel_tool_use": True}}))
    assert gen.parallel_tool_calls is False and gen.tool_choice == "required"
    assert to_gen_request(decode(TOOL_ROUND_TRIP)).parallel_tool_calls is True


def test_thinking_disabled_and_absent() -> None:
    base = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
    assert to_gen_request(decode({**base, "thinking": {"type": "disabled"}})).thinking is False
    gen = to_gen_request(decode(base))
    assert gen.thinking is None and gen.stream is False and gen.sampling.temperature == 1.0
    assert gen.sampling_sent == frozenset()
    adaptive = to_gen_request(decode({**base, "thinking": {"type": "adaptive"}}))
    assert adaptive.thinking is True and adaptive.thinking_budget_tokens is None
    fmt = to_gen_request(decode({**base, "output_config": {"format": {
        "type": "json_schema", "schema": {"type": "object"}}}})).response_format
    assert fmt is not None and fmt.kind == "json_schema" and fmt.param == "output_config.format"


def test_count_tokens_request() -> None:
    req = decode({"model": "m", "messages": [{"role": "user", "content": "hi"}], "system": "s"},
                 wire.CountTokensRequest)
    assert [m.role for m in to_gen_request(req).messages or []] == ["system", "user"]


@pytest.mark.parametrize("patch,param", [
    ({"messages": [{"role": "user", "content": [
        {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": ""}}]}]},
     "messages[0].content[0]"),
    ({"tools": [{"name": "web_search", "type": "web_search_20250305"}]}, "tools[0].type"),
    ({"thinking": {"type": "between_tools"}}, "thinking.type"),
    ({"context_management": {"edits": [{"type": "clear_tool_uses_20250919",
                                        "trigger": {"type": "input_tokens", "value": 30000}}]}},
     "context_management.edits[0].type"),
    ({"mcp_servers": [{"type": "url", "url": "https://x", "name": "x"}]}, "mcp_servers"),
])
def test_unsupported_fields_refused_by_name(patch: dict, param: str) -> None:
    with pytest.raises(UnsupportedField) as err:
        to_gen_request(decode({**TOOL_ROUND_TRIP, **patch}))
    assert err.value.param == param and param in err.value.message


def test_strict_tools_are_carried_to_the_grammar() -> None:
    """Issue 23: strict tools are honoured (core/structured.py rule 6), not refused."""
    gen = to_gen_request(decode({**TOOL_ROUND_TRIP, "tools": [
        {"name": "t", "input_schema": {"type": "object"}, "strict": True}]}))
    assert [t.strict for t in gen.tools] == [True]


def test_unknown_and_bad_fields_name_the_field() -> None:
    with pytest.raises(InvalidRequest) as err:
        decode({**TOOL_ROUND_TRIP, "container": "c1"})
    assert "container" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        decode({k: v for k, v in TOOL_ROUND_TRIP.items() if k != "max_tokens"})
    assert "max_tokens" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        to_gen_request(decode({**TOOL_ROUND_TRIP, "temperature": 1.5}))
    assert err.value.param == "temperature"


EVENTS = [
    ReasoningDelta("Think"), ReasoningDelta("ing."),
    TextDelta("Hello"), TextDelta(" world"),
    ToolCallStart(0, "call_abc", "get_weather"), ToolCallDelta(0, '{"city": '),
    ToolCallDelta(0, '"Paris"}'), ToolCallEnd(0, '{"city": "Paris"}'),
    Done("tool_calls", Usage(prompt_tokens=30, completion_tokens=12, cached_tokens=16),
         stop_kind="tool_calls"),
]


def frames_for(events: list) -> tuple[MessageBuilder, list]:
    builder = MessageBuilder(id="msg_1", model="tiny", prompt_tokens=30)
    frames = builder.start()
    for event in events:
        frames += builder.feed(event)
    return builder, frames


def test_frames_golden_order() -> None:
    _, frames = frames_for(EVENTS)
    sig = thinking_signature("Thinking.")
    assert [(n, p.get("index"), (p.get("delta") or p.get("content_block") or {}).get("type"))
            for n, p in frames] == [
        ("message_start", None, None), ("ping", None, None),
        ("content_block_start", 0, "thinking"),
        ("content_block_delta", 0, "thinking_delta"), ("content_block_delta", 0, "thinking_delta"),
        ("content_block_delta", 0, "signature_delta"), ("content_block_stop", 0, None),
        ("content_block_start", 1, "text"),
        ("content_block_delta", 1, "text_delta"), ("content_block_delta", 1, "text_delta"),
        ("content_block_stop", 1, None),
        ("content_block_start", 2, "tool_use"),
        ("content_block_delta", 2, "input_json_delta"), ("content_block_delta", 2, "input_json_delta"),
        ("content_block_stop", 2, None),
        ("message_delta", None, None), ("message_stop", None, None)]
    assert frames[5][1]["delta"] == {"type": "signature_delta", "signature": sig}
    assert frames[-2][1] == {"type": "message_delta",
                             "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                             "usage": {"input_tokens": 14, "output_tokens": 12,
                                       "cache_read_input_tokens": 16,
                                       "cache_creation_input_tokens": 0}}


def test_sdk_accumulator_rebuilds_the_same_message() -> None:
    builder, frames = frames_for(EVENTS)
    snapshot = None
    json_bufs: dict[int, bytes] = {}
    for name, payload in frames:
        if name == "ping":
            continue
        snapshot = accumulate_event(event=payload, current_snapshot=snapshot, json_bufs=json_bufs)
    final = builder.result()
    assert snapshot is not None
    assert snapshot.to_dict(exclude_none=True) == {
        k: v for k, v in final.items() if v is not None} | {"content": final["content"]}
    assert final["content"] == [
        {"type": "thinking", "thinking": "Thinking.", "signature": thinking_signature("Thinking.")},
        {"type": "text", "text": "Hello world"},
        {"type": "tool_use", "id": "call_abc", "name": "get_weather", "input": {"city": "Paris"}}]
    assert final["stop_reason"] == "tool_use"


@pytest.mark.parametrize("done,reason,seq", [
    (Done("stop", Usage(), stop_kind="eos"), "end_turn", None),
    (Done("stop", Usage(), stop_kind="stop_sequence", stop_sequence="END"), "stop_sequence", "END"),
    (Done("length", Usage(), stop_kind="length"), "max_tokens", None)])
def test_stop_reasons(done: Done, reason: str, seq: str | None) -> None:
    builder, frames = frames_for([TextDelta("x"), done])
    assert builder.result()["stop_reason"] == reason
    assert builder.result()["stop_sequence"] == seq


def test_error_event_frame() -> None:
    _, frames = frames_for([TextDelta("x"), ErrorEvent("boom", status=500)])
    assert frames[-1] == ("error", {"type": "error",
                                    "error": {"type": "api_error", "message": "boom"}})


def test_wire_structs_round_trip_through_msgspec() -> None:
    req = decode(TOOL_ROUND_TRIP)
    again = msgspec.json.decode(msgspec.json.encode(req), type=wire.MessagesRequest)
    assert again == req


def test_system_messages_inside_messages_stand_where_they_are() -> None:
    """Issue 28: Claude Code 2.1 puts `role: "system"` entries in `messages` (rule 1)."""
    gen = to_gen_request(decode({"model": "m", "max_tokens": 8, "system": "first", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "system", "content": [{"type": "text", "text": "reminder"}]},
        {"role": "user", "content": "again"}]}))
    assert [(m.role, m.content) for m in gen.messages or []] == [
        ("system", "first"), ("user", "hi"), ("system", "reminder"), ("user", "again")]


def test_a_system_message_with_an_image_is_refused_naming_it() -> None:
    with pytest.raises(UnsupportedField) as err:
        to_gen_request(decode({"model": "m", "max_tokens": 8, "messages": [
            {"role": "system", "content": [{"type": "image", "source": {}}]},
            {"role": "user", "content": "hi"}]}))
    assert err.value.param == "messages[0].content[0]"


def test_claude_codes_billing_header_block_never_reaches_the_prompt() -> None:
    """Rule 1: the per-session hash line would defeat the prefix cache."""
    def system_of(cch: str) -> str:
        gen = to_gen_request(decode({"model": "m", "max_tokens": 8, "system": [
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.{cch}; "
                                     f"cc_entrypoint=sdk-cli; cch={cch};"},
            {"type": "text", "text": "You are Claude Code."}],
            "messages": [{"role": "user", "content": "hi"}]}))
        assert gen.messages and gen.messages[0].role == "system"
        return gen.messages[0].content or ""
    assert system_of("a1b2c") == system_of("f9e8d") == "You are Claude Code."


@pytest.mark.parametrize("display", ["summarized", "updates"])
def test_thinking_display_that_shows_the_thinking_is_a_no_op(display: str) -> None:
    gen = to_gen_request(decode({**TOOL_ROUND_TRIP, "thinking": {
        "type": "adaptive", "display": display}}))
    assert gen.thinking is True and gen.thinking_budget_tokens is None


@pytest.mark.parametrize("thinking,effort,budget", [
    ({"type": "adaptive"}, "low", 1024),
    ({"type": "adaptive"}, "medium", 4096),
    ({"type": "adaptive"}, "high", None),
    (None, "max", None),
    ({"type": "enabled", "budget_tokens": 300}, "low", 300),   # an explicit budget wins
    ({"type": "disabled"}, "low", None),                        # nothing to bound
])
def test_output_config_effort_bounds_the_thinking(thinking: dict | None, effort: str,
                                                  budget: int | None) -> None:
    """Rule 5: Claude Code 2.1 sends `output_config.effort`; it maps to a thinking budget."""
    body = {**TOOL_ROUND_TRIP, "output_config": {"effort": effort}}
    body.pop("thinking", None)
    if thinking:
        body["thinking"] = thinking
    assert to_gen_request(decode(body)).thinking_budget_tokens == budget


def test_an_unknown_effort_is_a_400_naming_it() -> None:
    with pytest.raises(InvalidRequest) as err:
        decode({**TOOL_ROUND_TRIP, "output_config": {"effort": "extreme"}})
    assert err.value.param == "output_config.effort"


def test_image_blocks_become_placeholders_where_they_stood() -> None:
    """core/images.py rule 1: a user turn's image and one inside a tool_result."""
    png = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": ""}}
    gen = to_gen_request(decode({"model": "m", "max_tokens": 8, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look:"}, png]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                           "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [png]}]}]}))
    assert [r.path for r in gen.images] == ["messages[0].content[1]",
                                           "messages[2].content[0].content[0]"]
    messages = gen.messages or []
    assert [r.path for r in messages[0].images] == ["messages[0].content[1]"]
    assert [r.path for r in messages[2].images] == ["messages[2].content[0].content[0]"]
    assert messages[0].images[0].media_type == "image/png"
    assert messages[0].content == "look:\n" + IMAGE_PLACEHOLDER
    assert messages[2].role == "tool" and messages[2].content == IMAGE_PLACEHOLDER


def test_thinking_display_omitted_leaves_the_text_out() -> None:
    """Rule 5 / frames rule 2: Claude Code 2.1's first request asks for "omitted"; the
    thinking block comes as Anthropic sends it then: empty text, a signature."""
    gen = to_gen_request(decode({**TOOL_ROUND_TRIP, "thinking": {
        "type": "adaptive", "display": "omitted"}}))
    assert gen.thinking is True
    builder = MessageBuilder(id="msg_1", model="tiny", prompt_tokens=30, show_thinking=False)
    frames = builder.start()
    for event in EVENTS:
        frames += builder.feed(event)
    kinds = [(p.get("delta") or p.get("content_block") or {}).get("type") for _, p in frames]
    assert "thinking_delta" not in kinds and kinds.count("signature_delta") == 1
    assert frames[2][1]["content_block"] == {"type": "thinking", "thinking": "",
                                             "signature": ""}
    assert builder.result()["content"][0] == {
        "type": "thinking", "thinking": "", "signature": thinking_signature("Thinking.")}
    assert [b["type"] for b in builder.result()["content"]] == ["thinking", "text", "tool_use"]


def _turns_with_thinking(n: int) -> list[dict]:
    out: list[dict] = []
    for k in range(n):
        out += [{"role": "user", "content": f"q{k}"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": f"t{k}", "signature": "s"},
                    {"type": "text", "text": f"a{k}"}]}]
    return out + [{"role": "user", "content": "last"}]


@pytest.mark.parametrize("keep,kept", [
    ("all", ["t0", "t1", "t2"]), (None, ["t2"]),
    ({"type": "thinking_turns", "value": 2}, ["t1", "t2"]),
    ({"type": "thinking_turns", "value": 0}, [])])
def test_context_management_clear_thinking(keep: Any, kept: list[str]) -> None:
    """Rule 8: Claude Code 2.1 sends clear_thinking keep "all" (a no-op); a number of turns
    keeps only the reasoning of the last ones."""
    edit: dict[str, Any] = {"type": "clear_thinking_20251015"}
    if keep is not None:
        edit["keep"] = keep
    gen = to_gen_request(decode({"model": "m", "max_tokens": 8, "messages": _turns_with_thinking(3),
                                 "context_management": {"edits": [edit]}}))
    assert [m.reasoning for m in gen.messages or [] if m.reasoning] == kept


def test_deferred_tools_wait_for_a_tool_reference() -> None:
    """Rule 7: a `defer_loading` tool is out of the prompt until a tool search's
    `tool_reference` names it; the reference reads as a line."""
    tools = [{"name": "ToolSearch", "input_schema": {"type": "object"}},
             {"name": "WebFetch", "input_schema": {"type": "object"}, "defer_loading": True},
             {"name": "Cron", "input_schema": {"type": "object"}, "defer_loading": True}]
    first = [{"role": "user", "content": "fetch it"}]
    gen = to_gen_request(decode({"model": "m", "max_tokens": 8, "tools": tools, "messages": first}))
    assert [t.name for t in gen.tools] == ["ToolSearch"]
    later = first + [
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ToolSearch",
                                           "input": {"query": "select:WebFetch"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": [
            {"type": "tool_reference", "tool_name": "WebFetch"}]}]}]
    gen = to_gen_request(decode({"model": "m", "max_tokens": 8, "tools": tools, "messages": later}))
    assert [t.name for t in gen.tools] == ["ToolSearch", "WebFetch"]
    assert (gen.messages or [])[-1].content == "Tool loaded: WebFetch"
