"""The OpenAI surface through real HTTP (uvicorn on a free port) with the official SDK.

Two tiny random-weight checkpoints (different seeds) are registered in a temp
models.toml, so greedy outputs differ between them and a swap is observable.
"""

from __future__ import annotations

import json
import re

import httpx
import openai
import pytest
from daemon_support import generation_factory, start_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

PROMPT = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("ckpts")
    return make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)


@pytest.fixture(scope="module")
def settings(checkpoints, tmp_path_factory):
    encoder = '\n[models.enc]\nsource = "/nonexistent/encoder"\nkind = "encoder"\n'
    path = write_registry(tmp_path_factory.mktemp("reg"), *checkpoints, extra=encoder)
    # one resident model at a time (residency rule 5): these tests pin swap-era answers;
    # tests/serving/test_residency_http.py covers several resident models
    return Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                         max_body_bytes=64 * 1024, fallback=False,
                         cache_dir=str(tmp_path_factory.mktemp("c")), max_resident_models=1)


@pytest.fixture(scope="module")
def live(settings):
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    server = start_server(app)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def client(live):
    return openai.OpenAI(base_url=live.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def reference(checkpoints):
    """Greedy ids from mlx_lm itself, per checkpoint, for PROMPT."""
    from mlx_lm import load, stream_generate

    out = {}
    for name, path in zip(("tiny-a", "tiny-b"), checkpoints):
        model, tok = load(str(path))
        ids = tok.apply_chat_template(PROMPT, add_generation_prompt=True)
        gen = [r.token for r in stream_generate(model, tok, ids, max_tokens=24)]
        gen = [t for t in gen if t not in tok.eos_token_ids]
        out[name] = tok.decode(gen, skip_special_tokens=False, clean_up_tokenization_spaces=False)
    return out


def chat(client, **kw):
    kw.setdefault("model", "tiny-a")
    kw.setdefault("messages", PROMPT)
    kw.setdefault("max_tokens", 24)
    kw.setdefault("temperature", 0)
    return client.chat.completions.create(**kw)


def stream_text(client, **kw):
    parts, finish, usage = [], None, None
    for chunk in chat(client, stream=True, **kw):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            parts.append(c.delta.content or "")
            finish = c.finish_reason or finish
    return "".join(parts), finish, usage


# --- correctness -----------------------------------------------------------------

def test_greedy_equals_mlx_lm_token_for_token(client, reference):
    for name in ("tiny-a", "tiny-b"):
        got = chat(client, model=name).choices[0].message.content
        assert got == reference[name], name
    assert reference["tiny-a"] != reference["tiny-b"]


def test_stream_equals_non_stream_under_greedy(client):
    whole = chat(client)
    text, finish, usage = stream_text(client, stream_options={"include_usage": True})
    assert text == whole.choices[0].message.content
    assert finish == whole.choices[0].finish_reason
    assert usage.completion_tokens == whole.usage.completion_tokens
    assert usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.prompt_tokens_details.cached_tokens is not None


def test_text_part_content_equals_string_content(client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "What is the capital "},
                                          {"type": "text", "text": "of France?"}]}]
    assert chat(client, messages=parts).choices[0].message.content == \
        chat(client).choices[0].message.content


def test_max_tokens_and_max_completion_tokens(client):
    r = chat(client, max_tokens=5, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    r = client.chat.completions.create(model="tiny-a", messages=PROMPT, max_completion_tokens=3,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3


def test_seed_makes_sampling_reproducible(client):
    kw = dict(temperature=1.0, top_p=0.9, seed=1234, max_tokens=16)
    a = chat(client, **kw).choices[0].message.content
    b = chat(client, **kw).choices[0].message.content
    assert a == b


def test_truncation_knobs_are_honoured(client):
    """top_k=1, a tiny top_p, or min_p=1 leave only the argmax: sampling equals greedy."""
    greedy = chat(client, max_tokens=16).choices[0].message.content
    for kw in ({"extra_body": {"top_k": 1}}, {"top_p": 1e-6}, {"extra_body": {"min_p": 1.0}}):
        got = chat(client, temperature=1.0, seed=5, max_tokens=16, **kw)
        assert got.choices[0].message.content == greedy, kw


def test_penalties_change_a_repetitive_greedy_answer(client):
    kw = dict(max_tokens=48, logprobs=True, extra_body={"ignore_eos": True})
    plain = chat(client, **kw).choices[0]
    tokens = [c.token for c in plain.logprobs.content]
    assert len(set(tokens)) < len(tokens)  # a random tiny model repeats itself
    for extra in ({"frequency_penalty": 2.0}, {"presence_penalty": 2.0},
                  {"extra_body": {"ignore_eos": True, "repetition_penalty": 3.0}}):
        got = chat(client, **{**kw, **extra}).choices[0].message.content
        assert got != plain.message.content, extra


def test_sampling_extensions_accepted(client):
    r = chat(client, temperature=0.7, seed=3, presence_penalty=0.5, frequency_penalty=0.5,
             extra_body={"top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1})
    assert r.choices[0].finish_reason in ("stop", "length")


def test_stop_string_across_token_boundaries_never_leaks(client):
    full = chat(client).choices[0].message.content
    assert len(full) > 6
    stop = full[3:6]
    cut = full[: full.index(stop)]
    r = chat(client, stop=[stop, "never-there"])
    assert r.choices[0].message.content == cut
    assert r.choices[0].finish_reason == "stop"
    text, finish, _ = stream_text(client, stop=stop)
    assert text == cut and finish == "stop"


def test_logit_bias_forces_a_token(client, live):
    tok = live.state.hub.current.loaded.tokenizer
    target = tok.encode("Paris", add_special_tokens=False)[0]
    r = chat(client, logit_bias={str(target): 100}, max_tokens=4, extra_body={"ignore_eos": True})
    assert r.choices[0].message.content == tok.decode([target] * 4)


def test_logprobs_and_top_logprobs(client):
    r = chat(client, logprobs=True, top_logprobs=2, max_tokens=6)
    content = r.choices[0].logprobs.content
    assert len(content) >= 1
    raw = b"".join(bytes(c.bytes) for c in content)
    assert raw.decode("utf-8", errors="replace") == r.choices[0].message.content
    for c in content:
        assert c.logprob <= 0 and len(c.top_logprobs) <= 2


def test_n_choices_prefill_once(client):
    r = chat(client, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = {c.message.content for c in r.choices}
    assert len(texts) == 1  # greedy: all equal
    single = chat(client)
    assert r.usage.prompt_tokens == single.usage.prompt_tokens
    assert r.usage.completion_tokens == 3 * single.usage.completion_tokens


def test_streaming_deltas_never_split_characters(live):
    """Sampled output of a random model includes multi-byte pieces; the joined
    deltas must equal the decode of all generated bytes at once."""
    body = {"model": "tiny-a", "messages": PROMPT, "max_tokens": 60, "stream": True,
            "temperature": 1.0, "seed": 7, "logprobs": True}
    texts, raw = [], b""
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=60) as r:
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            for choice in json.loads(line[6:])["choices"]:
                texts.append(choice["delta"].get("content") or "")
                for lp in (choice["logprobs"] or {}).get("content") or []:
                    raw += bytes(lp["bytes"])
    assert len(raw) > 0
    assert "".join(texts) == raw.decode("utf-8", errors="replace")


# --- completions -----------------------------------------------------------------

def test_completions_prompt_forms_echo_logprobs(client, live):
    tok = live.state.hub.current.loaded.tokenizer
    r = client.completions.create(model="tiny-a", prompt="Hello world", max_tokens=5,
                                  temperature=0)
    text = r.choices[0].text
    ids = tok.encode("Hello world")
    r2 = client.completions.create(model="tiny-a", prompt=ids, max_tokens=5, temperature=0)
    assert r2.choices[0].text == text
    batch = client.completions.create(model="tiny-a", prompt=["Hello world", "Numbers: 1"],
                                      max_tokens=5, temperature=0)
    assert [c.index for c in batch.choices] == [0, 1] and batch.choices[0].text == text
    echo = client.completions.create(model="tiny-a", prompt="Hello world", max_tokens=5,
                                     temperature=0, echo=True)
    assert echo.choices[0].text == "Hello world" + text
    lp = client.completions.create(model="tiny-a", prompt="Hello world", max_tokens=5,
                                   temperature=0, logprobs=2)
    assert len(lp.choices[0].logprobs.tokens) == lp.usage.completion_tokens or \
        lp.choices[0].finish_reason == "stop"
    assert len(lp.choices[0].logprobs.top_logprobs[0]) <= 2
    streamed = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny-a", prompt="Hello world", max_tokens=5, temperature=0, stream=True)
        if c.choices)
    assert streamed == text


# --- errors ----------------------------------------------------------------------

def post(live, path, **kw):
    return httpx.post(live.url + path, timeout=60, **kw)


def test_error_statuses_in_openai_envelope(live):
    r = post(live, "/v1/chat/completions", content=b"{not json")
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    r = post(live, "/v1/chat/completions", json={"model": "tiny-a", "messages": PROMPT,
                                                 "max_tokens": "many"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
    r = post(live, "/v1/chat/completions", json={"model": "nope", "messages": PROMPT})
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    r = post(live, "/v1/chat/completions", content=b"x" * (65 * 1024),
             headers={"content-type": "application/json"})
    assert r.status_code == 413
    r = post(live, "/v1/chat/completions", json={"model": "tiny-a", "messages": PROMPT,
                                                 "functions": [{"name": "f"}]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "functions"
    r = post(live, "/v1/completions", json={"model": "tiny-a", "prompt": "x", "suffix": "y"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
    body = r.json()["error"]
    assert set(body) == {"message", "type", "param", "code"}


def test_template_error_is_400_before_stream_starts(live):
    r = post(live, "/v1/chat/completions", json={"model": "tiny-a", "messages": [],
                                                 "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages"
    long = [{"role": "user", "content": "The quick brown fox. " * 800}]
    for path, extra in (("/v1/chat/completions", {"messages": long}),
                        ("/v1/completions", {"prompt": "The quick brown fox. " * 800})):
        r = post(live, path, json={"model": "tiny-a", "stream": True, **extra})
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "context_length_exceeded"
        assert "2048" in err["message"] and err["type"] == "invalid_request_error"
        assert err["n_ctx"] == 2048 and err["n_prompt_tokens"] > 2048
    # llama-server's un-prefixed alias answers its overflow as llama-server does, code kept
    r = post(live, "/chat/completions", json={"model": "tiny-a", "messages": long,
                                              "stream": True})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "exceed_context_size_error"
    assert err["code"] == "context_length_exceeded" and err["n_ctx"] == 2048
    # Anthropic's own words, which Claude Code reads to compact its context (issue 28)
    r = post(live, "/v1/messages", json={"model": "tiny-a", "max_tokens": 8, "messages": long,
                                         "stream": True})
    err = r.json()["error"]
    assert r.status_code == 400 and err["type"] == "invalid_request_error"
    assert re.fullmatch(r"prompt is too long: \d+ tokens > 2048 maximum", err["message"])


def test_max_tokens_beyond_the_ceiling_is_clamped(live):
    r = post(live, "/v1/completions", json={"model": "tiny-a", "prompt": [5] * 2040,
                                            "max_tokens": 10**6, "ignore_eos": True})
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 2048 - 2040
    assert r.json()["choices"][0]["finish_reason"] == "length"


def test_internal_failure_is_500_envelope(live, monkeypatch):
    async def boom(req):
        raise RuntimeError("kaput")

    monkeypatch.setattr(live.state, "generate", boom)
    r = post(live, "/v1/chat/completions", json={"model": "tiny-a", "messages": PROMPT})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"


def test_sdk_raises_typed_errors(client):
    with pytest.raises(openai.NotFoundError):
        chat(client, model="nope")
    with pytest.raises(openai.BadRequestError):
        chat(client, temperature=9)


def test_models_endpoints(client, live):
    data = {m.id: m for m in client.models.list().data}
    assert set(data) == {"tiny-a", "tiny-b", "enc"}
    assert data["enc"].model_extra["kind"] == "encoder"
    loaded = [m for m in data.values() if m.model_extra["loaded"]]
    assert len(loaded) == 1 and loaded[0].model_extra["context_length"] > 0
    assert client.models.retrieve("alpha").id == "tiny-a"
    r = httpx.get(live.url + "/health", timeout=10).json()
    assert r["state"] == "ready" and r["generation"] >= 1 and r["uptime_s"] >= 0
    assert json.loads(json.dumps(r))["context_ceiling"] > 0


def test_encoder_model_is_refused_for_generation_without_a_swap(live):
    before = live.state.hub.current
    for path, extra in (("/v1/chat/completions", {"messages": PROMPT}),
                        ("/v1/completions", {"prompt": "hi"})):
        r = post(live, path, json={"model": "enc", **extra})
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "model"
        assert "enc" in err["message"] and "encoder" in err["message"]
        assert "/v1/embeddings" in err["message"]
    assert live.state.hub.current is before


def test_response_format_constrains_the_output(client):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = chat(client, max_tokens=40, response_format={
        "type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}})
    text = r.choices[0].message.content
    assert text.lstrip().startswith("{")
    if r.choices[0].finish_reason == "stop":
        assert json.loads(text)["ok"] in (True, False)
    r = chat(client, max_tokens=20, response_format={"type": "json_object"})
    assert r.choices[0].message.content.lstrip().startswith("{")


def test_repeated_prefix_reports_cached_tokens(client):
    system = {"role": "system", "content": "The quick brown fox jumps over the lazy dog. " * 12}
    messages = [system, {"role": "user", "content": "Hello there"}]
    first = chat(client, messages=messages, max_tokens=4)
    again = chat(client, messages=messages, max_tokens=4)
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert first.usage.prompt_tokens > 64
    assert 16 <= cached < again.usage.prompt_tokens
    assert again.choices[0].message.content == first.choices[0].message.content


def test_prefix_divergence_explains_a_re_rendered_answer(live):
    """Turn 2 sends turn 1's answer back with different text than was generated:
    usage says where the re-rendered prompt left the generated ids."""
    system = {"role": "system", "content": "Numbers: 0 1 2 3 4 5 6 7 8 9 10 42 100 2026. " * 3}
    turn1 = [system, {"role": "user", "content": "Hello there"}]
    first = post(live, "/v1/chat/completions", json={
        "model": "tiny-a", "messages": turn1, "max_tokens": 12, "temperature": 0,
        "ignore_eos": True}).json()
    answer = first["choices"][0]["message"]["content"]
    assert "prefix_divergence" not in first["usage"]["prompt_tokens_details"]
    edited = turn1 + [{"role": "assistant", "content": "Paris" + answer},
                      {"role": "user", "content": "More"}]
    r = post(live, "/v1/chat/completions", json={
        "model": "tiny-a", "messages": edited, "max_tokens": 2, "temperature": 0}).json()
    details = r["usage"]["prompt_tokens_details"]
    prompt_1 = first["usage"]["prompt_tokens"]
    assert details["prefix_divergence"] >= prompt_1  # the answer's first token differs
    assert details["prefix_divergence"] < r["usage"]["prompt_tokens"]
