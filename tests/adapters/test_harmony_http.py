"""gpt-oss's Harmony channels through every protocol: real HTTP, official SDK clients.

`gptoss` (conftest.py) carries gpt-oss's markers and layout, so the daemon picks
the Harmony parser from its template; its ScriptedEngine writes what gpt-oss
writes: an analysis message, then a call in commentary or the answer in final.
"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import httpx
import openai
import pytest

TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}
ANTHROPIC_TOOL = {"name": "get_weather", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string"}}}}
ASK = [{"role": "user", "content": "Weather in Paris?"}]


@pytest.fixture(scope="module")
def oai(live: Any) -> openai.OpenAI:
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def claude(live: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=60)


def test_chat_analysis_is_reasoning_final_is_content(oai: openai.OpenAI) -> None:
    out = oai.chat.completions.create(model="gptoss", messages=[{"role": "user", "content": "Capital?"}])
    message = out.choices[0].message
    assert message.content == "Paris." and out.choices[0].finish_reason == "stop"
    assert (message.model_extra or {}).get("reasoning_content") == "Simple question."


def test_chat_stream_tool_call_and_round_trip(oai: openai.OpenAI, adapter_engines: dict) -> None:
    chunks = list(oai.chat.completions.create(model="gptoss", messages=ASK, tools=[TOOL],
                                              stream=True))
    deltas = [ch.delta for c in chunks for ch in c.choices]
    reasoning = "".join((d.model_extra or {}).get("reasoning_content") or "" for d in deltas)
    calls = [tc for d in deltas for tc in (d.tool_calls or [])]
    assert reasoning == "The user wants the weather."
    assert [tc.function.name for tc in calls if tc.function and tc.function.name] == ["get_weather"]
    args = "".join(tc.function.arguments or "" for tc in calls if tc.function)
    assert json.loads(args) == {"city": "Paris"}
    assert not "".join(d.content or "" for d in deltas)   # no markup leaks as text
    assert [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason] == ["tool_calls"]

    first = oai.chat.completions.create(model="gptoss", messages=ASK, tools=[TOOL])
    call = (first.choices[0].message.tool_calls or [])[0]
    follow = oai.chat.completions.create(model="gptoss", tools=[TOOL], messages=[
        *ASK, first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "name": "get_weather", "content": "18C"}])
    assert follow.choices[0].message.content == "The weather in Paris is 18C."
    _, prompt = adapter_engines["gptoss"].seen[-1]
    assert ('<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
            '{"city": "Paris"}<|call|>') in prompt


def test_anthropic_thinking_and_tool_use(claude: anthropic.Anthropic) -> None:
    first = claude.messages.create(model="gptoss", max_tokens=200, tools=[ANTHROPIC_TOOL],
                                   messages=ASK)
    assert first.stop_reason == "tool_use"
    assert [b.type for b in first.content] == ["thinking", "tool_use"]
    thinking, use = first.content
    assert thinking.thinking == "The user wants the weather."
    assert use.name == "get_weather" and use.input == {"city": "Paris"}

    with claude.messages.stream(model="gptoss", max_tokens=200, tools=[ANTHROPIC_TOOL],
                                messages=ASK) as stream:
        final = stream.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "tool_use"]
    assert final.content[1].input == {"city": "Paris"} and final.stop_reason == "tool_use"

    answer = claude.messages.create(model="gptoss", max_tokens=200, messages=[
        {"role": "user", "content": "Capital?"}])
    assert [(b.type, getattr(b, "text", None)) for b in answer.content] == [
        ("thinking", None), ("text", "Paris.")]


def test_responses_and_ollama(oai: openai.OpenAI, live: Any) -> None:
    response = oai.responses.create(model="gptoss", input="Weather in Paris?",
                                    tools=[{"type": "function", **TOOL["function"]}])
    assert [item.type for item in response.output] == ["reasoning", "function_call"]
    assert json.loads(response.output[1].arguments) == {"city": "Paris"}

    reply = httpx.post(live.url + "/api/chat", timeout=60, json={
        "model": "gptoss", "messages": ASK, "tools": [TOOL], "stream": False}).json()
    message = reply["message"]
    assert message["thinking"] == "The user wants the weather."
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]] == [
        ("get_weather", {"city": "Paris"})]
    assert not message.get("content")


def test_chat_template_kwargs_the_template_reads(oai: openai.OpenAI, adapter_engines: dict) -> None:
    oai.chat.completions.create(model="gptoss", messages=ASK,
                                extra_body={"chat_template_kwargs": {"reasoning_effort": "high"}})
    assert "Reasoning: high" in adapter_engines["gptoss"].seen[-1][1]
    oai.chat.completions.create(model="gptoss", messages=ASK, reasoning_effort="low")
    assert "Reasoning: low" in adapter_engines["gptoss"].seen[-1][1]
    with pytest.raises(openai.BadRequestError) as err:
        oai.chat.completions.create(model="gptoss", messages=ASK,
                                    extra_body={"chat_template_kwargs": {"preserve_thinking": True}})
    body = err.value.body
    assert isinstance(body, dict) and body.get("param") == "chat_template_kwargs.preserve_thinking"
    with pytest.raises(openai.BadRequestError):   # streaming: refused before the first byte
        oai.chat.completions.create(model="gptoss", messages=ASK, stream=True,
                                    extra_body={"chat_template_kwargs": {"messages": []}})
