"""The Ollama API through the official `ollama` Python client, over real HTTP.

The shared adapter daemon (conftest.py): `tiny` decodes on the real engine,
`scripted` answers by script with tool calls and `<think>` blocks, `thinker`
opens its think block in the prompt, `coder` has FIM tokens. Encoders get
their own daemon (all-MiniLM-L6-v2 as `chat`'s side-car, as in test_embeddings.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import ollama
import pytest

from adapters.test_embeddings import LiveServer, registry, settings
from frink_mlx import __version__
from frink_mlx.app import create_app

WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def client(live: Any) -> ollama.Client:
    return ollama.Client(host=live.url)


def test_list_show_ps_version(client: ollama.Client) -> None:
    names = [m.model for m in client.list().models]
    assert {"tiny:latest", "scripted:latest", "coder:latest"} <= set(names)
    tiny = next(m for m in client.list().models if m.model == "tiny:latest")
    assert tiny.size and tiny.size > 0 and tiny.digest and tiny.details.format == "mlx"
    client.chat(model="tiny", messages=HI, options={"num_predict": 1})   # make it the loaded one
    shown = client.show("tiny:latest")
    assert "completion" in shown.capabilities and "tools" in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.modelinfo["llama.context_length"] > 0
    running = client.ps().models
    assert running[0].model == "tiny:latest"
    assert running[0].context_length and running[0].size and running[0].size > 0
    version = client._client.get("/api/version")
    # Codex --oss gates on >= 0.13.4 (issue 28); frink-mlx's own version rides beside it
    major, minor, patch = (int(x) for x in version.json()["version"].split("."))
    assert (major, minor, patch) >= (0, 13, 4)
    assert version.json()["frink_version"] == version.headers["x-frink-version"] == __version__
    with pytest.raises(ollama.ResponseError) as err:
        client.show("nope")
    assert err.value.status_code == 404 and "nope" in err.value.error


def test_chat_collected_and_streamed(client: ollama.Client) -> None:
    answer = client.chat(model="scripted", messages=HI, stream=False)
    assert answer.message.role == "assistant"
    assert answer.message.content == "Hello from the script."
    assert answer.done and answer.done_reason == "stop"
    assert answer.eval_count and answer.prompt_eval_count and answer.prompt_eval_count > 0
    assert answer.total_duration >= answer.eval_duration >= 0 and answer.load_duration >= 0
    parts = list(client.chat(model="scripted", messages=HI, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content or "" for p in parts) == "Hello from the script."
    last = parts[-1]
    assert last.done_reason == "stop" and last.eval_count == answer.eval_count
    assert last.total_duration and last.total_duration > 0


def test_stream_is_the_default_and_ndjson(live: Any) -> None:
    with httpx.stream("POST", live.url + "/api/chat", timeout=60,
                      json={"model": "scripted", "messages": HI}) as r:
        assert r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert len(lines) > 2 and lines[-1]["done"] is True
    for name in ("total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration",
                 "eval_count", "eval_duration"):
        assert isinstance(lines[-1][name], int), name


def test_generate_templated_raw_and_options(client: ollama.Client) -> None:
    answer = client.generate(model="scripted", prompt="hi")
    assert answer.response == "Hello from the script." and answer.done_reason == "stop"
    opts = {"temperature": 0, "num_predict": 6, "seed": 3, "top_k": 40, "num_thread": 2}
    one = client.generate(model="tiny", prompt="Once upon a time", raw=True, options=opts)
    two = client.generate(model="tiny", prompt="Once upon a time", raw=True, options=opts)
    assert one.response == two.response and 1 <= one.eval_count <= 6
    if one.eval_count == 6:
        assert one.done_reason == "length"
    streamed = list(client.generate(model="tiny", prompt="Once upon a time", raw=True,
                                    options=opts, stream=True))
    assert "".join(p.response for p in streamed) == one.response


def test_generate_with_suffix_fills_the_middle(client: ollama.Client, adapter_engines: Any
                                               ) -> None:
    answer = client.generate(model="coder", prompt="def f(", suffix="):\n    pass")
    assert answer.response == "a, b"
    _, prompt = adapter_engines["coder"].seen[-1]
    assert prompt.endswith("<|fim_prefix|>def f(<|fim_suffix|>):\n    pass<|fim_middle|>")
    with pytest.raises(ollama.ResponseError) as err:
        client.generate(model="tiny", prompt="def f(", suffix=")")
    assert err.value.status_code == 400 and "suffix" in err.value.error


def test_empty_requests_load_the_model(client: ollama.Client) -> None:
    assert client.generate(model="tiny").done_reason == "load"
    assert client.chat(model="tiny", messages=[]).done_reason == "load"


def test_tools_round_trip(client: ollama.Client, adapter_engines: Any) -> None:
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    answer = client.chat(model="scripted", messages=ask, tools=[WEATHER_TOOL])
    calls = answer.message.tool_calls
    assert calls and calls[0].function.name == "get_weather"
    assert calls[0].function.arguments == {"city": "Paris"}
    assert answer.message.thinking == "The user wants the weather."
    assert "<tool_call>" not in (answer.message.content or "")
    streamed = list(client.chat(model="scripted", messages=ask, tools=[WEATHER_TOOL], stream=True))
    assert [c.function.name for p in streamed for c in (p.message.tool_calls or [])] == \
        ["get_weather"]
    follow = ask + [answer.message.model_dump(exclude_none=True),
                    {"role": "tool", "content": "18C", "tool_name": "get_weather"}]
    final = client.chat(model="scripted", messages=follow, tools=[WEATHER_TOOL])
    assert final.message.content == "The weather in Paris is 18C."
    _, prompt = adapter_engines["scripted"].seen[-1]
    assert "<tool_response>18C</tool_response>" in prompt and '"city": "Paris"' in prompt


def test_think_and_thinking(client: ollama.Client, adapter_engines: Any) -> None:
    answer = client.chat(model="thinker", messages=HI, think=True)
    assert answer.message.thinking == "Reasoning here."
    assert answer.message.content == "Answer."
    client.chat(model="thinker", messages=HI, think=False)
    _, prompt = adapter_engines["thinker"].seen[-1]
    assert prompt.endswith("<think>\n\n</think>\n\n")   # thinking off reached the template
    gen = client.generate(model="thinker", prompt="hi", think="high")
    assert gen.thinking == "Reasoning here." and gen.response == "Answer."


def test_structured_format(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    answer = client.chat(model="tiny", messages=HI, format=schema,
                         options={"temperature": 0, "num_predict": 64})
    jsonschema.validate(json.loads(answer.message.content), schema)
    as_json = client.generate(model="tiny", prompt="hi", format="json",
                              options={"temperature": 0, "num_predict": 48})
    if as_json.done_reason == "stop":
        assert isinstance(json.loads(as_json.response), dict)
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="tiny", messages=HI, format={"type": "object", "properties": 3})
    assert err.value.status_code == 400 and "format" in err.value.error


@pytest.mark.parametrize("call,field", [
    (lambda c: c.generate(model="tiny", prompt="x", raw=True, images=["aGk="]), "images"),
    (lambda c: c.generate(model="tiny", prompt="x", template="{{ .Prompt }}"), "template"),
    (lambda c: c.generate(model="tiny", prompt="x", context=[1, 2]), "context"),
    (lambda c: c.chat(model="tiny", messages=HI, options={"mirostat": 2}), "options.mirostat"),
    (lambda c: c.chat(model="tiny", messages=HI, options={"bogus": 1}), "options.bogus"),
    (lambda c: c.chat(model="tiny", messages=HI, options={"temperature": "hot"}),
     "options.temperature"),
    (lambda c: c.chat(model="tiny", messages=HI, options={"num_ctx": 3}), "options.num_ctx"),
    (lambda c: c.chat(model="tiny", messages=HI, logprobs=True), "logprobs"),
])
def test_refusals_name_the_field(client: ollama.Client, call: Any, field: str) -> None:
    with pytest.raises(ollama.ResponseError) as err:
        call(client)
    assert err.value.status_code == 400 and field in err.value.error


def test_noop_fields_are_accepted(client: ollama.Client) -> None:
    answer = client.chat(model="scripted:latest", messages=HI,
                         options={"num_ctx": 8192, "num_thread": 2, "num_gpu": 1,
                                  "use_mmap": True, "tfs_z": 1.0, "mirostat": 0})
    assert answer.message.content == "Hello from the script."


def _resident(live: Any, name: str) -> Any:
    """The residency record of `name` (serving/residency.py), None when not resident."""
    return next((r for r in live.state.hub.residency.residents.values()
                 if r.gen.spec.name == name), None)


def test_keep_alive_sets_how_long_the_model_stays_and_zero_unloads(
        client: ollama.Client, live: Any) -> None:
    answer = client.chat(model="scripted:latest", messages=HI, keep_alive="5m")
    assert answer.message.content == "Hello from the script."
    assert _resident(live, "scripted").keep_alive_s == 300.0
    client.generate(model="scripted", prompt="hi", keep_alive=-1)  # pinned
    assert _resident(live, "scripted").keep_alive_s == -1.0
    client.chat(model="scripted", messages=[], keep_alive="1h30m")  # load only
    assert _resident(live, "scripted").keep_alive_s == 5400.0
    assert any(m.model == "scripted:latest" for m in client.ps().models)
    gone = client.generate(model="scripted", keep_alive=0)  # Ollama's unload idiom
    assert gone.done and gone.done_reason == "unload"
    assert _resident(live, "scripted") is None
    assert not any(m.model == "scripted:latest" for m in client.ps().models)
    with pytest.raises(ollama.ResponseError) as err:
        client.chat(model="scripted", messages=HI, keep_alive="soon")
    assert err.value.status_code == 400 and "keep_alive" in err.value.error


def test_errors_use_ollamas_envelope(live: Any) -> None:
    r = httpx.post(live.url + "/api/chat", content=b"{not json", timeout=30)
    assert r.status_code == 400 and isinstance(r.json()["error"], str)
    r = httpx.post(live.url + "/api/generate", json={"model": "missing", "prompt": "x"},
                   timeout=30)
    assert r.status_code == 404 and "missing" in r.json()["error"]


def test_pull_maps_to_the_registry(client: ollama.Client) -> None:
    assert client.pull("tiny").status == "success"
    assert [p.status for p in client.pull("tiny:latest", stream=True)] == ["success"]
    with pytest.raises(ollama.ResponseError) as err:
        client.pull("llama3.2")
    assert err.value.status_code == 404 and "llama3.2" in err.value.error


@pytest.fixture(scope="module")
def embed_server(tiny_llama_dir: Path) -> Iterator[LiveServer]:
    reg = registry("chat", {"embeddings": "minilm"}, tiny_llama_dir)
    with LiveServer(create_app(settings(auto_swap=False), registry=reg)) as server:
        yield server


def test_embed_and_legacy_embeddings(embed_server: LiveServer) -> None:
    client = ollama.Client(host=embed_server.url)
    result = client.embed(model="chat", input=["hello world", "goodbye"])
    assert result.model == "minilm" and len(result.embeddings) == 2
    assert len(result.embeddings[0]) == 384 and result.prompt_eval_count > 0
    one = client.embed(model="all-MiniLM-L6-v2", input="hello world")
    assert one.embeddings[0] == pytest.approx(result.embeddings[0], abs=1e-5)
    legacy = client.embeddings(model="chat", prompt="hello world")
    assert legacy.embedding == pytest.approx(result.embeddings[0], abs=1e-5)
    assert client.embeddings(model="chat", prompt="").embedding == []
    long = client.embed(model="chat", input="word " * 600)           # truncated by default
    assert len(long.embeddings[0]) == 384
    with pytest.raises(ollama.ResponseError) as err:
        client.embed(model="chat", input="word " * 600, truncate=False)
    assert err.value.status_code == 400


def test_images_on_a_text_only_model_become_placeholders(live: Any) -> None:
    """core/images.py: Open WebUI and other Ollama clients send pasted screenshots."""
    r = httpx.post(live.url + "/api/chat", timeout=60, json={
        "model": "tiny", "stream": False, "options": {"num_predict": 2},
        "messages": [{"role": "user", "content": "What is this?", "images": ["iVBORw0KGgo="]}]})
    assert r.status_code == 200 and r.headers["x-frink-images-omitted"] == "1"
    r = httpx.post(live.url + "/api/generate", timeout=60, json={
        "model": "tiny", "stream": False, "prompt": "Describe", "options": {"num_predict": 2},
        "images": ["iVBORw0KGgo=", "iVBORw0KGgo="]})
    assert r.status_code == 200 and r.headers["x-frink-images-omitted"] == "2"
    r = httpx.post(live.url + "/api/generate", timeout=60, json={
        "model": "tiny", "stream": False, "prompt": "x", "raw": True, "images": ["AA=="]})
    assert r.status_code == 400 and "images" in r.json()["error"]
