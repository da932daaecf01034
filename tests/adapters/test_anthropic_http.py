"""Anthropic Messages through real HTTP with the official `anthropic` SDK."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx
import pytest

WEATHER_TOOL = {"name": "get_weather", "description": "Current weather for a city",
                "input_schema": {"type": "object", "properties": {"city": {"type": "string"}},
                                 "required": ["city"]}}
HELLO = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def client(live: Any) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0, timeout=60)


def test_create_and_stream_agree_on_the_real_model(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="tiny", max_tokens=12, messages=HELLO,
                                     extra_body={"temperature": 0})
    assert message.type == "message" and message.role == "assistant" and message.model == "tiny"
    assert message.id.startswith("msg_")
    assert message.stop_reason in ("end_turn", "max_tokens")
    assert 1 <= message.usage.output_tokens <= 12
    text = "".join(b.text for b in message.content if b.type == "text")

    with client.messages.stream(model="tiny", max_tokens=12, extra_body={"temperature": 0},
                                messages=HELLO) as stream:
        streamed = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert streamed == text
    assert final.content[0].type == "text" and final.content[0].text == text
    assert final.stop_reason == message.stop_reason
    assert final.usage.output_tokens == message.usage.output_tokens


def test_count_tokens_matches_usage(client: anthropic.Anthropic) -> None:
    counted = client.messages.count_tokens(model="tiny", messages=HELLO, system="Be brief.")
    message = client.messages.create(model="tiny", max_tokens=2, messages=HELLO,
                                     system="Be brief.")
    usage = message.usage
    assert counted.input_tokens == usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert counted.input_tokens > 5


def test_tool_use_round_trip(client: anthropic.Anthropic, adapter_engines: dict) -> None:
    first = client.messages.create(
        model="scripted", max_tokens=200, tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather in Paris?"}])
    assert first.stop_reason == "tool_use"
    kinds = [b.type for b in first.content]
    assert kinds == ["thinking", "tool_use"]
    thinking, call = first.content
    assert thinking.thinking == "The user wants the weather."
    assert call.name == "get_weather" and call.input == {"city": "Paris"}

    second = client.messages.create(
        model="scripted", max_tokens=200, tools=[WEATHER_TOOL],
        messages=[{"role": "user", "content": "Weather in Paris?"},
                  {"role": "assistant", "content": [b.model_dump() for b in first.content]},
                  {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id,
                                                "content": "18C sunny"}]}])
    assert second.stop_reason == "end_turn"
    assert second.content[0].type == "text"
    assert second.content[0].text == "The weather in Paris is 18C."
    _, prompt = adapter_engines["scripted"].seen[-1]
    assert "<tool_response>18C sunny</tool_response>" in prompt
    assert '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>' in prompt
    assert "<think>The user wants the weather.</think>" in prompt


def test_streamed_tool_use_and_thinking(client: anthropic.Anthropic) -> None:
    with client.messages.stream(model="scripted", max_tokens=200, tools=[WEATHER_TOOL],
                                thinking={"type": "enabled", "budget_tokens": 1024},
                                messages=[{"role": "user", "content": "Weather?"}]) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "input_json" in kinds and "thinking" in kinds and "signature" in kinds
    assert final.stop_reason == "tool_use"
    assert final.content[1].type == "tool_use" and final.content[1].input == {"city": "Paris"}
    assert final.content[0].type == "thinking" and final.content[0].signature


def test_tool_not_offered_is_dropped(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="scripted", max_tokens=200, tools=[WEATHER_TOOL],
                                     messages=[{"role": "user", "content": "forbidden"}])
    assert [b.type for b in message.content] == ["text"]
    assert message.content[0].text == "Sure."
    assert message.stop_reason == "end_turn"


def test_stop_sequence(client: anthropic.Anthropic) -> None:
    message = client.messages.create(model="scripted", max_tokens=50, stop_sequences=["script"],
                                     messages=[{"role": "user", "content": "hi"}])
    assert message.content[0].text == "Hello from the "
    assert (message.stop_reason, message.stop_sequence) == ("stop_sequence", "script")


def test_errors_in_anthropic_envelope(client: anthropic.Anthropic, live: Any) -> None:
    with pytest.raises(anthropic.NotFoundError) as err:
        client.messages.create(model="no-such-model", max_tokens=5, messages=HELLO)
    assert err.value.body["type"] == "error"
    assert err.value.body["error"]["type"] == "not_found_error"
    assert "no-such-model" in err.value.body["error"]["message"]

    bad = httpx.post(live.url + "/v1/messages", content=b"{not json",
                     headers={"content-type": "application/json"})
    assert bad.status_code == 400
    assert bad.json()["type"] == "error"
    assert bad.json()["error"]["type"] == "invalid_request_error"

    missing = httpx.post(live.url + "/v1/messages", json={"model": "tiny", "messages": HELLO})
    assert missing.status_code == 400 and "max_tokens" in missing.json()["error"]["message"]

    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(model="tiny", max_tokens=5, messages=[{"role": "user", "content": [
            {"type": "document", "source": {"type": "text", "media_type": "text/plain",
                                            "data": "x"}}]}])
    assert "messages[0].content[0]" in err.value.body["error"]["message"]


PNG = {"type": "image", "source": {"type": "base64", "media_type": "image/png",
                                   "data": "iVBORw0KGgo="}}


def test_a_claude_code_session_with_a_screenshot_goes_on_answering(live: Any) -> None:
    """Issue 28 / core/images.py: Claude Code's Read of a PNG comes back as an image
    inside a tool_result; on a text-only model every later turn must still answer."""
    read = {"name": "Read", "description": "Read a file",
            "input_schema": {"type": "object", "properties": {"file_path": {"type": "string"}}}}
    messages: list[dict[str, Any]] = [
        {"role": "user", "content": "What does shot.png show?"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "Read",
                                           "input": {"file_path": "shot.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1",
                                      "content": [PNG]}]}]
    for turn in range(4):
        r = httpx.post(live.url + "/v1/messages", timeout=60, json={
            "model": "tiny", "max_tokens": 3, "tools": [read], "messages": messages,
            "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.headers["x-frink-images-omitted"] == "1"
        text = "".join(b.get("text", "") for b in r.json()["content"])
        messages += [{"role": "assistant", "content": text or "ok"},
                     {"role": "user", "content": f"And turn {turn + 2}?"}]
    counted = httpx.post(live.url + "/v1/messages/count_tokens", timeout=60, json={
        "model": "tiny", "messages": [{"role": "user", "content": [PNG]}]})
    assert counted.status_code == 200 and counted.json()["input_tokens"] > 5


def test_thinking_opened_by_the_prompt(client: anthropic.Anthropic,
                                       adapter_engines: dict) -> None:
    ask = [{"role": "user", "content": "Why?"}]
    on = client.messages.create(model="thinker", max_tokens=50, messages=ask,
                                thinking={"type": "enabled", "budget_tokens": 1024})
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None))
            for b in on.content] == [("thinking", "Reasoning here."), ("text", "Answer.")]
    off = client.messages.create(model="thinker", max_tokens=50, messages=ask,
                                 thinking={"type": "disabled"})
    assert [b.type for b in off.content] == ["text"] and off.content[0].text == "Answer."
    _, prompt = adapter_engines["thinker"].seen[-1]
    assert prompt.endswith("<think>\n\n</think>\n\n")
    with client.messages.stream(model="thinker", max_tokens=50, messages=ask) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == "Answer." and final.content[0].type == "thinking"


def test_assistant_prefill_is_continued(client: anthropic.Anthropic, adapter_engines: dict) -> None:
    message = client.messages.create(model="scripted", max_tokens=20, messages=[
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "Well,"}])
    assert message.content[0].text == "Hello from the script."
    _, prompt = adapter_engines["scripted"].seen[-1]
    assert prompt.endswith("<|im_start|>assistantWell,")  # open: no <|im_end|> after it


def test_claude_code_sessions_share_their_system_prompt_in_the_prefix_cache(
        client: anthropic.Anthropic) -> None:
    """Issue 28: the billing-header line differs per session; the rest of the system
    prompt is the same and must be read from the prefix cache by the next session."""
    policy = "You are an interactive CLI tool that helps users with software tasks. " * 12

    def session(cch: str, prompt: str) -> Any:
        return client.messages.create(model="tiny", max_tokens=1, messages=[
            {"role": "user", "content": prompt}], system=[
            {"type": "text", "text": f"x-anthropic-billing-header: cc_version=2.1.332.{cch[:3]}; "
                                     f"cc_entrypoint=sdk-cli; cch={cch};"},
            {"type": "text", "text": policy}], extra_body={"temperature": 0})
    session("0a1b2", "List the files.")
    usage = session("f3e4d", "Explain this repository in one line.").usage
    total = usage.input_tokens + (usage.cache_read_input_tokens or 0)
    assert (usage.cache_read_input_tokens or 0) >= 0.5 * total
