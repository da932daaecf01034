"""The parsers behind OpenAI chat: reasoning_content and tool_calls from model markup."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture(scope="module")
def client(live: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_reasoning_content(client: openai.OpenAI) -> None:
    out = client.chat.completions.create(model="thinker", messages=[
        {"role": "user", "content": "Why?"}])
    message = out.choices[0].message
    assert message.content == "Answer."
    assert (message.model_extra or {}).get("reasoning_content") == "Reasoning here."


def test_tool_calls_stream_and_round_trip(client: openai.OpenAI, adapter_engines: dict) -> None:
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    out = client.chat.completions.create(model="scripted", messages=ask, tools=[TOOL])
    choice = out.choices[0]
    assert choice.finish_reason == "tool_calls"
    call = (choice.message.tool_calls or [])[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    assert "<tool_call>" not in (choice.message.content or "")

    chunks = list(client.chat.completions.create(model="scripted", messages=ask, tools=[TOOL],
                                                 stream=True))
    args = "".join(tc.function.arguments or "" for c in chunks for ch in c.choices
                   for tc in (ch.delta.tool_calls or []) if tc.function)
    assert json.loads(args) == {"city": "Paris"}
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == [
        "tool_calls"]

    follow = client.chat.completions.create(model="scripted", tools=[TOOL], messages=[
        *ask, choice.message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": "18C sunny"}])
    assert follow.choices[0].message.content == "The weather in Paris is 18C."
    _, prompt = adapter_engines["scripted"].seen[-1]
    assert "<tool_response>18C sunny</tool_response>" in prompt
