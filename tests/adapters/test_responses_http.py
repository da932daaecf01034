"""OpenAI Responses through real HTTP with the official `openai` SDK."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather for a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}


@pytest.fixture(scope="module")
def client(live: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_create_stream_and_retrieve(client: openai.OpenAI) -> None:
    response = client.responses.create(model="tiny", input="What is the capital of France?",
                                       max_output_tokens=10, temperature=0)
    assert response.object == "response" and response.model == "tiny"
    assert response.status in ("completed", "incomplete")
    if response.status == "incomplete":
        assert response.incomplete_details is not None
        assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage is not None and 1 <= response.usage.output_tokens <= 10
    text = response.output_text

    with client.responses.stream(model="tiny", input="What is the capital of France?",
                                 max_output_tokens=10, temperature=0) as stream:
        events = list(stream)
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] == ("response.completed" if response.status == "completed"
                         else "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == text == events[-1].response.output_text
    # the SDK's get_final_response() wants response.completed: use a reply that ends
    with client.responses.stream(model="scripted", input="hi") as stream:
        assert stream.get_final_response().output_text == "Hello from the script."

    stored = client.responses.retrieve(response.id)
    assert stored.id == response.id and stored.output_text == text


def test_function_call_round_trip_with_previous_response_id(
        client: openai.OpenAI, adapter_engines: dict) -> None:
    first = client.responses.create(model="scripted", input="Weather in Paris?",
                                    tools=[WEATHER_TOOL], reasoning={"effort": "low"})
    assert [item.type for item in first.output] == ["reasoning", "function_call"]
    assert first.output[0].content is not None
    assert first.output[0].content[0].text == "The user wants the weather."
    call = first.output[1]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}

    second = client.responses.create(
        model="scripted", previous_response_id=first.id, tools=[WEATHER_TOOL],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "18C sunny"}])
    assert second.output_text == "The weather in Paris is 18C."
    assert second.previous_response_id == first.id
    _, prompt = adapter_engines["scripted"].seen[-1]
    assert "Weather in Paris?" in prompt
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in prompt
    assert "<tool_response>18C sunny</tool_response>" in prompt


def test_function_call_round_trip_without_store(client: openai.OpenAI) -> None:
    first = client.responses.create(model="scripted", input="Weather?", tools=[WEATHER_TOOL],
                                    store=False)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(first.id)
    call = next(item for item in first.output if item.type == "function_call")
    history: list[Any] = [{"role": "user", "content": "Weather?"}]
    history += [item.model_dump(exclude_none=True, by_alias=True) for item in first.output]
    history.append({"type": "function_call_output", "call_id": call.call_id, "output": "18C"})
    second = client.responses.create(model="scripted", input=history, tools=[WEATHER_TOOL])
    assert second.output_text == "The weather in Paris is 18C."


def test_streamed_function_call(client: openai.OpenAI) -> None:
    with client.responses.stream(model="scripted", input="Weather?", tools=[WEATHER_TOOL]) as stream:
        events = list(stream)
        final = stream.get_final_response()
    kinds = [e.type for e in events]
    assert "response.reasoning_text.delta" in kinds
    assert "response.function_call_arguments.delta" in kinds
    assert "response.function_call_arguments.done" in kinds
    assert kinds[-1] == "response.completed"
    calls = [item for item in final.output if item.type == "function_call"]
    assert len(calls) == 1 and json.loads(calls[0].arguments) == {"city": "Paris"}


def test_errors(client: openai.OpenAI, live: Any) -> None:
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.create(model="tiny", input="hi", previous_response_id="resp_missing")
    assert "resp_missing" in str(err.value)
    with pytest.raises(openai.BadRequestError) as err:
        client.responses.create(model="tiny", input="hi", tools=[{"type": "frobnicator"}])
    assert "tools[0].type" in str(err.value)
    bad = httpx.post(live.url + "/v1/responses", content=b"[", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "invalid_request_error"


def test_reasoning_items_and_effort_switch(client: openai.OpenAI, adapter_engines: dict) -> None:
    on = client.responses.create(model="thinker", input="Why?")
    assert [item.type for item in on.output] == ["reasoning", "message"]
    assert on.output[0].content[0].text == "Reasoning here." and on.output_text == "Answer."
    off = client.responses.create(model="thinker", input="Why?", reasoning={"effort": "none"})
    assert [item.type for item in off.output] == ["message"] and off.output_text == "Answer."
    _, prompt = adapter_engines["thinker"].seen[-1]
    assert prompt.endswith("<think>\n\n</think>\n\n")


def test_delete_stored_response(client: openai.OpenAI) -> None:
    response = client.responses.create(model="scripted", input="hi")
    assert client.responses.retrieve(response.id).output_text == "Hello from the script."
    client.responses.delete(response.id)
    with pytest.raises(openai.NotFoundError) as err:
        client.responses.retrieve(response.id)
    assert response.id in str(err.value)


NAMESPACE_TOOL = {"type": "namespace", "name": "geo", "description": "Geography tools",
                  "tools": [{**WEATHER_TOOL, "name": "weather"}]}
PATCH_TOOL = {"type": "custom", "name": "apply_patch", "description": "Edit files",
              "format": {"type": "grammar", "syntax": "lark", "definition": "start: /.+/"}}


def test_codex_tools_namespace_hosted_and_tool_search(live: Any, adapter_engines: dict) -> None:
    body = {"model": "structured", "input": "Weather?", "client_metadata": {"x": "y"},
            "tools": [NAMESPACE_TOOL, {"type": "web_search", "search_context_size": "low"},
                      {"type": "tool_search", "execution": "client", "description": "Find"}]}
    r = httpx.post(live.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.headers["x-frink-ignored-fields"] == "tools[1]"
    (call,) = [item for item in r.json()["output"] if item["type"] == "function_call"]
    assert call["name"] == "weather" and call["namespace"] == "geo"
    assert json.loads(call["arguments"]) == {"city": "Paris"}
    _, prompt = adapter_engines["structured"].seen[-1]
    assert '"name": "geo__weather"' in prompt and '"name": "tool_search"' in prompt
    assert "web_search" not in prompt
    # the call echoed back in history renders under the flat name again
    body = {"model": "scripted", "tools": [NAMESPACE_TOOL], "input": [
        {"role": "user", "content": "Weather?"}, call,
        {"type": "function_call_output", "call_id": call["call_id"], "output": "18C"}]}
    r = httpx.post(live.url + "/v1/responses", json=body, timeout=60)
    assert r.status_code == 200, r.text
    _, prompt = adapter_engines["scripted"].seen[-1]
    assert '<tool_call>{"name": "geo__weather", "arguments": {"city": "Paris"}}' in prompt


def test_custom_tool_call(client: openai.OpenAI, live: Any) -> None:
    response = client.responses.create(model="scripted", input="please patch", tools=[PATCH_TOOL])
    (call,) = response.output
    assert call.type == "custom_tool_call" and call.name == "apply_patch"
    assert call.input == "*** Begin Patch" and call.call_id
    body = {"model": "scripted", "input": "please patch", "tools": [PATCH_TOOL], "stream": True}
    with httpx.stream("POST", live.url + "/v1/responses", json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    kinds = [e["type"] for e in events]
    assert "response.function_call_arguments.delta" not in kinds
    deltas = [e["delta"] for e in events if e["type"] == "response.custom_tool_call_input.delta"]
    assert "".join(deltas) == "*** Begin Patch"
    done = next(e for e in events if e["type"] == "response.custom_tool_call_input.done")
    assert done["input"] == "*** Begin Patch"
    added = next(e for e in events if e["type"] == "response.output_item.added")
    assert added["item"]["type"] == "custom_tool_call"
    final = events[-1]["response"]["output"]
    assert [(i["type"], i["input"], i["status"]) for i in final] == [
        ("custom_tool_call", "*** Begin Patch", "completed")]


def test_custom_tool_call_history(client: openai.OpenAI, adapter_engines: dict) -> None:
    first = client.responses.create(model="scripted", input="please patch", tools=[PATCH_TOOL])
    history: list[Any] = [{"role": "user", "content": "please patch"}]
    history += [item.model_dump(exclude_none=True, by_alias=True) for item in first.output]
    history.append({"type": "custom_tool_call_output", "call_id": first.output[0].call_id,
                    "output": "Done!"})
    second = client.responses.create(model="scripted", input=history, tools=[PATCH_TOOL])
    assert second.output_text == "The weather in Paris is 18C."
    _, prompt = adapter_engines["scripted"].seen[-1]
    assert '{"name": "apply_patch", "arguments": {"input": "*** Begin Patch"}}' in prompt
    assert "<tool_response>Done!</tool_response>" in prompt
    # the stored response's custom call carries on through previous_response_id
    third = client.responses.create(model="scripted", previous_response_id=first.id, input=[
        {"type": "custom_tool_call_output", "call_id": first.output[0].call_id, "output": "ok"}])
    assert third.output_text == "The weather in Paris is 18C."


def test_an_image_in_the_history_keeps_the_session_answering(live: Any) -> None:
    """responses rule 8: `codex exec -i img.png`, then `codex exec resume`, which resends it."""
    image = {"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}
    history: list[dict[str, Any]] = [{"role": "user", "content": [
        {"type": "input_text", "text": "What is this?"}, image]}]
    for turn in range(2):
        r = httpx.post(live.url + "/v1/responses", timeout=60, json={
            "model": "tiny", "input": history, "max_output_tokens": 3, "store": False})
        assert r.status_code == 200, r.text
        assert r.headers["x-frink-images-omitted"] == "1"
        history += [{"role": "assistant", "content": [{"type": "output_text", "text": "ok"}]},
                    {"role": "user", "content": f"And turn {turn + 2}?"}]
