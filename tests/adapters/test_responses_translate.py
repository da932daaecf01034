"""OpenAI Responses adapter on golden JSON, no model: wire -> GenRequest, events -> stream events."""

from __future__ import annotations

import json
from typing import Any

import pytest
from openai._models import construct_type_unchecked
from openai._types import omit
from openai.lib.streaming.responses._responses import ResponseStreamState
from openai.types.responses import ResponseStreamEvent

from frink_mlx.adapters.openai import responses_wire as w
from frink_mlx.adapters.openai.responses import output_message, response_base, to_gen_request
from frink_mlx.adapters.openai.responses_events import ResponseBuilder
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
from frink_mlx.errors import InvalidRequest, NotFound, UnsupportedField
from frink_mlx.http.body import decode_struct
from frink_mlx.serving.responses_store import ResponseStore, StoredResponse

ROUND_TRIP = {
    "model": "tiny", "instructions": "Be brief.", "max_output_tokens": 50, "temperature": 0.2,
    "top_p": 0.8, "reasoning": {"effort": "low", "summary": "auto"}, "store": True,
    "tools": [{"type": "function", "name": "get_weather", "description": "Weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "function", "name": "get_weather"},
    "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [],
         "content": [{"type": "reasoning_text", "text": "Use the tool."}]},
        {"type": "function_call", "id": "fc_1", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\": \"Paris\"}", "status": "completed"},
        {"type": "function_call_output", "call_id": "call_1", "output": "18C"},
        {"type": "message", "role": "developer", "content": "Answer in French."},
    ],
}


def decode(body: dict[str, Any]) -> w.ResponsesRequest:
    return decode_struct(json.dumps(body).encode(), w.ResponsesRequest)


def test_items_translate_and_merge_assistant_turns() -> None:
    gen, conversation = to_gen_request(decode(ROUND_TRIP), [])
    assert gen.messages == [
        Message("system", "Be brief."),
        Message("user", "Weather in Paris?"),
        Message("assistant", "", tool_calls=[ToolCall("call_1", "get_weather", '{"city": "Paris"}')],
                reasoning="Use the tool."),
        Message("tool", "18C", tool_call_id="call_1", name="get_weather"),
        Message("system", "Answer in French."),
    ]
    assert conversation == (gen.messages or [])[1:]
    assert (gen.max_tokens, gen.tool_choice, gen.thinking) == (50, "get_weather", True)
    assert (gen.sampling.temperature, gen.sampling.top_p) == (0.2, 0.8)
    assert gen.sampling_sent == {"temperature", "top_p"}
    assert gen.tools[0].parameters["properties"]["city"] == {"type": "string"}


def test_string_input_history_and_formats() -> None:
    history = [Message("user", "a"), Message("assistant", "b")]
    body = {"input": "c", "reasoning": {"effort": "minimal"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"},
                                "strict": True}}}
    gen, conversation = to_gen_request(decode(body), history)
    assert [m.content for m in gen.messages or []] == ["a", "b", "c"]
    assert gen.model == "default" and gen.thinking is False
    assert gen.response_format is not None and gen.response_format.kind == "json_schema"
    assert gen.response_format.param == "text.format" and gen.response_format.strict


@pytest.mark.parametrize("patch,param", [
    ({"input": [{"type": "item_reference", "id": "x"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
     "input[0].content[0]"),
    ({"tools": [{"type": "frobnicator"}]}, "tools[0].type"),
    ({"reasoning": {"summary": "detailed"}}, "reasoning.summary"),
    ({"tool_choice": {"type": "file_search"}}, "tool_choice.type"),
])
def test_unsupported_refused_by_name(patch: dict, param: str) -> None:
    with pytest.raises(UnsupportedField) as err:
        to_gen_request(decode({**ROUND_TRIP, **patch}), [])
    assert err.value.param == param


def test_an_input_image_becomes_the_placeholder_where_it_stood() -> None:
    """core/images.py rule 1: the part's path is recorded, its text is the placeholder."""
    shot = {"type": "input_image", "image_url": "data:image/png;base64,AAAA"}
    body = {"input": [{"role": "user", "content": [{"type": "input_text", "text": "See: "}, shot]},
                      {"type": "function_call", "call_id": "c1", "name": "view_image",
                       "arguments": "{}"},
                      {"type": "function_call_output", "call_id": "c1", "output": [shot]}]}
    gen, _ = to_gen_request(decode(body), [])
    assert [r.path for r in gen.images] == ["input[0].content[1]", "input[2].output[0]"]
    assert gen.images[0].data == "AAAA" and gen.images[0].media_type == "image/png"
    assert gen.messages is not None
    assert gen.messages[0].content == "See: " + IMAGE_PLACEHOLDER
    assert gen.messages[-1].content == IMAGE_PLACEHOLDER


def test_input_images_become_placeholders_where_they_stood() -> None:
    """Rule 8: `codex exec -i` sends an input_image in the user message; Codex's view_image
    answers with one in a function_call_output."""
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    gen, _ = to_gen_request(decode({"input": [
        {"role": "user", "content": [{"type": "input_text", "text": "look: "}, image]},
        {"type": "function_call", "call_id": "c1", "name": "view_image", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": [image]}]}), [])
    assert [r.path for r in gen.images] == ["input[0].content[1]", "input[2].output[0]"]
    messages = gen.messages or []
    assert messages[0].content == "look: " + IMAGE_PLACEHOLDER
    assert messages[2].role == "tool" and messages[2].content == IMAGE_PLACEHOLDER


def test_bad_fields_name_the_field() -> None:
    with pytest.raises(InvalidRequest) as err:
        decode({**ROUND_TRIP, "background": True})
    assert "background" in err.value.message
    with pytest.raises(InvalidRequest) as err:
        to_gen_request(decode({"input": [{"type": "function_call", "name": "f"}]}), [])
    assert err.value.param is not None and err.value.param.startswith("input[0]")
    with pytest.raises(InvalidRequest) as err:
        to_gen_request(decode({"input": "x", "temperature": 3}), [])
    assert err.value.param == "temperature"


EVENTS = [
    ReasoningDelta("Hmm"), ReasoningDelta("."), TextDelta("Hi"), TextDelta("!"),
    ToolCallStart(0, "call_9", "get_weather"), ToolCallDelta(0, '{"city"'),
    ToolCallDelta(0, ': "Oslo"}'), ToolCallEnd(0, '{"city": "Oslo"}'),
    Done("tool_calls", Usage(prompt_tokens=20, completion_tokens=9, cached_tokens=8),
         stop_kind="tool_calls"),
]


def run_builder(events: list) -> tuple[ResponseBuilder, list[dict[str, Any]]]:
    builder = ResponseBuilder(base=response_base(decode(ROUND_TRIP), "tiny"))
    out = builder.start()
    for event in events:
        out += builder.feed(event)
    return builder, out


def test_stream_events_golden() -> None:
    builder, events = run_builder(EVENTS)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert [e["type"] for e in events] == [
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added",
        "response.reasoning_text.delta", "response.reasoning_text.delta",
        "response.reasoning_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added",
        "response.output_text.delta", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    assert final["status"] == "completed" and final["model"] == "tiny"
    assert [i["type"] for i in final["output"]] == ["reasoning", "message", "function_call"]
    assert final["output"][1]["content"][0]["text"] == "Hi!"
    assert final["output"][2]["arguments"] == '{"city": "Oslo"}'
    assert final["output"][2]["call_id"] == "call_9"
    assert final["usage"] == {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 8},
                              "output_tokens": 9, "output_tokens_details": {"reasoning_tokens": 0},
                              "total_tokens": 29}
    assert output_message(final["output"]) == Message(
        "assistant", "Hi!", tool_calls=[ToolCall("call_9", "get_weather", '{"city": "Oslo"}')],
        reasoning="Hmm.")


def test_sdk_stream_state_accepts_our_events() -> None:
    _, events = run_builder(EVENTS)
    state: ResponseStreamState[Any] = ResponseStreamState(input_tools=omit, text_format=omit)
    for raw in events:
        state.handle_event(construct_type_unchecked(type_=ResponseStreamEvent, value=raw))
    final = state._completed_response
    assert final is not None and final.output_text == "Hi!"
    assert final.output[2].type == "function_call" and final.output[2].name == "get_weather"


def test_length_and_error_terminals() -> None:
    builder, events = run_builder([TextDelta("x"), Done("length", Usage(), stop_kind="length")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}
    builder, events = run_builder([TextDelta("x"), ErrorEvent("boom")])
    assert events[-1]["type"] == "response.failed"
    assert events[-1]["response"]["error"] == {"code": "server_error", "message": "boom"}
    assert events[-2]["type"] == "response.output_item.done"


def test_store_is_bounded_lru_and_names_missing_ids() -> None:
    store = ResponseStore(max_entries=2)
    for rid in ("a", "b"):
        store.put(StoredResponse({"id": rid}))
    store.get("a")
    store.put(StoredResponse({"id": "c"}))
    assert "a" in store and "c" in store and "b" not in store
    with pytest.raises(NotFound) as err:
        store.get("b", param="previous_response_id")
    assert "'b'" in err.value.message and err.value.param == "previous_response_id"


def test_echoed_output_items_are_accepted() -> None:
    body = {"input": [
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "phase": "final_answer",
         "content": [{"type": "output_text", "text": "Hi", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}",
         "caller": {"type": "direct"}, "namespace": None, "async": False},
        {"type": "function_call_output", "call_id": "c1", "output": "ok", "name": "f"}]}
    gen, _ = to_gen_request(decode(body), [])
    assert [(m.role, m.content) for m in gen.messages or []] == [("assistant", "Hi"), ("tool", "ok")]
    assert (gen.messages or [])[0].tool_calls == [ToolCall("c1", "f", "{}")]
