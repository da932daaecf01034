"""llama-server's extras on the OpenAI routes and its error shapes (issue 23), over HTTP
on the tiny real engine: grammars and schemas are enforced, not ignored."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

HI = [{"role": "user", "content": "hi"}]


def chat(live: Any, **body: Any) -> httpx.Response:
    return httpx.post(live.url + "/v1/chat/completions", timeout=120,
                      json={"model": "tiny", "messages": HI, "max_tokens": 12, **body})


def content(r: httpx.Response) -> str:
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def test_grammar_is_enforced_and_an_invalid_one_is_400(live: Any) -> None:
    for seed in range(3):
        assert content(chat(live, grammar='root ::= "yes" | "no"', seed=seed)) in ("yes", "no")
    r = chat(live, grammar="root ::= (((")
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar"


@pytest.mark.parametrize("field", ["json_schema", "response_format"])
def test_llama_server_schemas_are_enforced(live: Any, field: str) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    extra = ({"json_schema": schema} if field == "json_schema"
             else {"response_format": {"type": "json_object", "schema": schema}})
    assert json.loads(content(chat(live, max_tokens=20, **extra))) in ({"ok": True},
                                                                       {"ok": False})


def test_draft07_tuple_items_are_enforced(live: Any) -> None:
    """llama.cpp's tests (and zod-to-json-schema) send `items` as a list: a tuple, not a 400."""
    digit = {"type": "integer", "minimum": 0, "maximum": 9}
    fmt = {"type": "json_object", "schema": {"type": "array", "items": [digit],
                                             "additionalItems": False, "minItems": 1}}
    out = json.loads(content(chat(live, max_tokens=20, response_format=fmt)))
    assert isinstance(out, list) and len(out) == 1 and isinstance(out[0], int)


def test_chat_answers_carry_llama_server_timings(live: Any) -> None:
    r = chat(live, max_tokens=3, ignore_eos=True)
    assert r.status_code == 200, r.text
    timings = r.json()["timings"]
    assert timings["predicted_n"] == 3 and timings["prompt_n"] + timings["cache_n"] > 0
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": HI, "max_tokens": 3, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}) as s:
        chunks = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: {")]
    assert chunks[-1]["choices"] == [] and chunks[-1]["timings"]["predicted_n"] == 3
    assert "timings" not in chunks[0]


def test_time_budget_on_the_openai_routes(live: Any) -> None:
    """llama-server's t_max_predict_ms on chat (core/output.py rule 8): after the first
    newline a spent budget ends the answer, as finish_reason "length"."""
    grammar = 'root ::= "ab\\n" [a-z] [a-z] [a-z] [a-z] [a-z] [a-z] [a-z] [a-z]'
    free = content(chat(live, max_tokens=40, grammar=grammar))
    assert free.startswith("ab\n") and len(free) == 11
    cut = chat(live, max_tokens=40, grammar=grammar, t_max_predict_ms=1)
    assert content(cut).startswith("ab\n") and len(content(cut)) < len(free)
    assert cut.json()["choices"][0]["finish_reason"] == "length"


def test_length_fields(live: Any) -> None:
    r = chat(live, max_tokens=-1, n_predict=None, stop=["\n"], seed=1, ignore_eos=False)
    assert r.status_code == 200
    r = httpx.post(live.url + "/v1/completions", timeout=120,
                   json={"model": "tiny", "prompt": "Hello", "n_predict": 5, "ignore_eos": True})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5
    r = chat(live, max_tokens=0)
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"


def test_generation_prompt_and_continue_together_is_400(live: Any) -> None:
    r = chat(live, messages=[*HI, {"role": "assistant", "content": "Hel"}],
             add_generation_prompt=True, continue_final_message=True)
    assert r.status_code == 400 and r.json()["error"]["param"] == "continue_final_message"
    r = chat(live, messages=[*HI, {"role": "assistant", "content": "Hel"}],
             continue_final_message=True)
    assert r.status_code == 200


def test_unprefixed_routes(live: Any) -> None:
    r = httpx.post(live.url + "/chat/completions", timeout=120,
                   json={"model": "tiny", "messages": HI, "max_tokens": 2})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion"
    assert httpx.get(live.url + "/models", timeout=10).json()["object"] == "list"


def test_context_overflow_in_llama_cpp_shape(live: Any) -> None:
    r = httpx.post(live.url + "/completion", timeout=120,
                   json={"model": "tiny", "prompt": "word " * 5000, "n_predict": 2})
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["type"] == "exceed_context_size_error"
    assert error["n_prompt_tokens"] > error["n_ctx"] > 0


def test_n_probs_and_tokens_on_completion(live: Any) -> None:
    r = httpx.post(live.url + "/completion", timeout=120, json={
        "model": "tiny", "prompt": "Hello", "n_predict": 3, "n_probs": 2, "ignore_eos": True,
        "return_tokens": True, "temperature": 0})
    out = r.json()
    assert r.status_code == 200 and len(out["tokens"]) == 3
    probs = out["completion_probabilities"]
    assert [p["id"] for p in probs] == out["tokens"]
    assert all(len(p["top_logprobs"]) == 2 and p["logprob"] <= 0 for p in probs)
    assert out["generation_settings"]["n_probs"] == 2 and out["timings"]["predicted_n"] == 3


def test_stream_frames_count_tokens(live: Any) -> None:
    frames = []
    with httpx.stream("POST", live.url + "/completion", timeout=120, json={
            "model": "tiny", "prompt": "Hello", "n_predict": 4, "ignore_eos": True,
            "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                frames.append(json.loads(line[len("data: "):]))
    partial = [f for f in frames if not f["stop"]]
    assert partial and all(f["tokens_evaluated"] > 0 for f in partial)
    counts = [f["tokens_predicted"] for f in partial]
    assert counts == sorted(counts) and counts[-1] <= 4
    assert frames[-1]["stop"] and frames[-1]["tokens_predicted"] == 4


def test_chat_role_rides_on_the_first_delta(live: Any) -> None:
    chunks = []
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny", "messages": HI, "max_tokens": 3, "stream": True,
            "ignore_eos": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append(json.loads(line[len("data: "):]))
    first = chunks[0]["choices"][0]["delta"]
    assert first == {"role": "assistant", "content": None}   # llama-server's first chunk
    assert chunks[1]["choices"][0]["delta"].get("content")   # ... then the first token at once
    assert sum("role" in c["choices"][0]["delta"] for c in chunks if c["choices"]) == 1


def test_unknown_routes_answer_in_the_protocol_envelope(live: Any) -> None:
    r = httpx.post(live.url + "/embedding", json={}, timeout=10)     # llama.cpp's path
    assert r.status_code == 404 and r.json()["error"] == {
        "code": 404, "message": "No route for POST /embedding.", "type": "not_found_error"}
    r = httpx.get(live.url + "/v1/nope", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    r = httpx.get(live.url + "/v1/chat/completions", timeout=10)
    assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed"
    assert "POST" in r.headers["allow"]
    r = httpx.post(live.url + "/responses", json={"model": "scripted", "input": "hi"}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "response"   # llama-server's alias
