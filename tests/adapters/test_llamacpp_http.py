"""llama.cpp's /completion, /tokenize, /detokenize, /infill through real HTTP."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

LONG = ("The quick brown fox jumps over the lazy dog. What is the capital of France? "
        "The capital of France is Paris. def add(a, b): return a + b. ") * 3
FINAL_KEYS = {"content", "stop", "model", "stop_type", "stopping_word", "tokens_predicted",
              "tokens_evaluated", "tokens_cached", "timings", "truncated", "id_slot", "index"}
TIMING_KEYS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second",
               "predicted_n", "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}


@pytest.fixture(scope="module")
def http(live: Any) -> httpx.Client:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def complete(http: httpx.Client, **body: Any) -> dict[str, Any]:
    body = {"model": "tiny", "temperature": 0, "n_predict": 8, **body}
    resp = http.post("/completion", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def stream_frames(http: httpx.Client, path: str = "/completion", **body: Any) -> list[str]:
    body = {"model": "tiny", "temperature": 0, "n_predict": 8, "stream": True, **body}
    with http.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        return [line for line in resp.iter_lines() if line]


def test_completion_non_stream_golden_shape(http: httpx.Client) -> None:
    out = complete(http, prompt="Hello, world!")
    assert FINAL_KEYS <= set(out) and TIMING_KEYS == set(out["timings"])
    assert out["stop"] is True and out["model"] == "tiny"
    assert out["stop_type"] in ("eos", "limit")
    assert out["tokens_predicted"] == (8 if out["stop_type"] == "limit" else out["tokens_predicted"])
    assert out["tokens_evaluated"] > 0 and out["timings"]["predicted_n"] == out["tokens_predicted"]
    assert out["prompt"] == "Hello, world!"


def test_stream_frames_match_non_stream(http: httpx.Client) -> None:
    reference = complete(http, prompt="Numbers: 0 1 2")
    lines = stream_frames(http, prompt="Numbers: 0 1 2")
    assert all(line.startswith("data: ") for line in lines)
    assert "[DONE]" not in "".join(lines)
    frames = [json.loads(line[len("data: "):]) for line in lines]
    assert all(f["stop"] is False and set(f) >= {"content"} for f in frames[:-1])
    # each piece names its ids without `return_tokens`, as llama-server's frames do
    ids = [i for f in frames for i in f["tokens"]]
    assert all(f["tokens"] for f in frames[:-1]) and len(ids) == reference["tokens_predicted"]
    assert reference["tokens"] == []   # ... while the non-streaming answer needs it
    final = frames[-1]
    assert final["stop"] is True and final["content"] == "" and FINAL_KEYS <= set(final)
    assert "".join(f["content"] for f in frames) == reference["content"]
    assert final["tokens_predicted"] == reference["tokens_predicted"]
    assert final["stop_type"] == reference["stop_type"]


def test_stop_word_and_limit(http: httpx.Client) -> None:
    free = complete(http, prompt="Hello, world!", n_predict=12)
    if len(free["content"]) > 3:
        word = free["content"][2:4]
        out = complete(http, prompt="Hello, world!", n_predict=12, stop=[word])
        assert out["stop_type"] == "word" and out["stopping_word"] == word
        assert out["content"] == free["content"][: free["content"].index(word)]
    out = complete(http, prompt="Hello, world!", n_predict=1, ignore_eos=True)
    assert (out["stop_type"], out["tokens_predicted"]) == ("limit", 1)


def test_cache_prompt_false_bypasses_prefix_cache(http: httpx.Client) -> None:
    complete(http, prompt=LONG, n_predict=2)
    warm = complete(http, prompt=LONG, n_predict=2)
    assert warm["tokens_cached"] > 0, "the real engine should reuse the prefix"
    cold = complete(http, prompt=LONG, n_predict=2, cache_prompt=False)
    assert cold["tokens_cached"] == 0
    assert cold["timings"]["prompt_n"] == cold["tokens_evaluated"]
    assert cold["content"] == warm["content"]


def test_tokenize_detokenize_round_trip(http: httpx.Client) -> None:
    text = "The quick brown fox. 42!"
    ids = http.post("/tokenize", json={"content": text, "model": "tiny"}).json()["tokens"]
    assert ids and all(isinstance(i, int) for i in ids)
    assert http.post("/detokenize", json={"tokens": ids}).json() == {"content": text}
    pieces = http.post("/tokenize", json={"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == ids and "".join(p["piece"] for p in pieces) == text
    special = http.post("/tokenize", json={"content": text, "add_special": True}).json()["tokens"]
    assert len(special) >= len(ids)


def test_token_and_mixed_prompts(http: httpx.Client) -> None:
    ids = http.post("/tokenize", json={"content": "Hello, world!"}).json()["tokens"]
    by_text = complete(http, prompt="Hello, world!", n_predict=4)
    by_ids = complete(http, prompt=ids, n_predict=4)
    assert by_ids["content"] == by_text["content"]
    assert by_ids["tokens_evaluated"] == by_text["tokens_evaluated"]
    head = http.post("/tokenize", json={"content": "Hello,"}).json()["tokens"]
    mixed = complete(http, prompt=head + [" world!"], n_predict=4)
    assert mixed["tokens_evaluated"] >= len(head) + 1


@pytest.mark.parametrize("dict_form", [False, True])
def test_logit_bias_names_tokens_by_text(http: httpx.Client, dict_form: bool) -> None:
    """Rule 6: a text's tokens all get the bias, as llama-server applies it."""
    first = complete(http, prompt="Hello", n_predict=1, return_tokens=True)["tokens"][0]
    text = http.post("/detokenize", json={"tokens": [first]}).json()["content"]
    banned = http.post("/tokenize", json={"content": text}).json()["tokens"]
    bias: Any = {text: False} if dict_form else [[text, False]]
    out = complete(http, prompt="Hello", n_predict=1, return_tokens=True, logit_bias=bias)
    assert out["tokens"][0] not in banned


def test_ignore_eos_bans_the_end_tokens_and_says_so(http: httpx.Client) -> None:
    """Rule 7: llama-server's ignore_eos, an end-token ban reported in generation_settings."""
    out = complete(http, prompt="Hello", n_predict=12, ignore_eos=True, return_tokens=True,
                   temperature=1.0, seed=3)
    banned = [b["token"] for b in out["generation_settings"]["logit_bias"] if b["bias"] is None]
    assert banned and not set(banned) & set(out["tokens"]) and out["tokens_predicted"] == 12
    plain = complete(http, prompt="Hello", n_predict=2, logit_bias=[[5, 1.5]])
    assert plain["generation_settings"]["logit_bias"] == [{"bias": 1.5, "token": 5}]


def test_truncated_means_the_context_filled_up(http: httpx.Client) -> None:
    """frames.py rule 7: a run that ends because the context is full says `truncated`."""
    n_ctx = http.get("/props").json()["n_ctx"]
    ids = http.post("/tokenize", json={"content": " the", "model": "tiny"}).json()["tokens"]
    prompt = ids * (n_ctx - 3)
    full = complete(http, prompt=prompt, n_predict=-1, ignore_eos=True)
    assert (full["tokens_predicted"], full["stop_type"], full["truncated"]) == (3, "limit", True)
    short = complete(http, prompt=prompt, n_predict=2, ignore_eos=True)
    assert (short["stop_type"], short["truncated"]) == ("limit", False)


def test_several_prompts_get_one_result_each_in_order(http: httpx.Client) -> None:
    """translate.py rule 9: llama-server's multi-prompt forms answer an array."""
    ids = http.post("/tokenize", json={"content": "Hello, world!"}).json()["tokens"]
    one = complete(http, prompt="Hello, world!", n_predict=4)
    other = complete(http, prompt="Numbers: 0 1 2", n_predict=4)
    resp = http.post("/completion", json={"model": "tiny", "temperature": 0, "n_predict": 4,
                                          "prompt": [ids, "Numbers: 0 1 2", "Hello, world!"]})
    assert resp.status_code == 200, resp.text
    out = resp.json()
    assert [r["content"] for r in out] == [one["content"], other["content"], one["content"]]
    assert [r["index"] for r in out] == [0, 1, 2] and out[1]["prompt"] == "Numbers: 0 1 2"
    twice = http.post("/completion", json={"model": "tiny", "n_predict": 2, "n_cmpl": 2,
                                           "prompt": ["a", "b"]}).json()
    assert [r["index"] for r in twice] == [0, 1, 2, 3]   # frames.py rule 8, as llama-server
    as_object = complete(http, prompt={"prompt_string": "Numbers: 0 1 2"}, n_predict=4)
    assert as_object["content"] == other["content"]
    resp = http.post("/completion", json={"model": "tiny", "prompt": ["a", "b"], "stream": True})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


def test_n_indent_stops_where_the_block_does(http: httpx.Client) -> None:
    """translate.py rule 11 (llama.vim's n_indent): the first later line indented less than
    the cursor's ends the completion, cut after its indentation."""
    grammar = 'root ::= "x\\n    y\\n  z\\n" [a-z] [a-z] [a-z]'
    free = complete(http, prompt="def f():", n_predict=30, grammar=grammar)
    assert free["content"].startswith("x\n    y\n  z\n")
    cut = complete(http, prompt="def f():", n_predict=30, grammar=grammar, n_indent=4)
    assert cut["content"] == "x\n    y\n  " and cut["stop_type"] == "limit"


def test_infill_without_fim_tokens_is_501(http: httpx.Client) -> None:
    resp = http.post("/infill", json={"model": "tiny", "input_prefix": "def f(", "input_suffix": ")"})
    assert resp.status_code == 501
    error = resp.json()["error"]
    assert error["code"] == 501 and "fill-in-the-middle" in error["message"]
    assert "<|fim_prefix|>" in error["message"]


def test_errors_in_llamacpp_envelope(http: httpx.Client) -> None:
    resp = http.post("/completion", content=b"{nope", headers={"content-type": "application/json"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == 400
    resp = http.post("/completion", json={"prompt": "x", "mirostat": 2})
    assert resp.status_code == 400 and "mirostat" in resp.json()["error"]["message"]
    resp = http.post("/completion", json={"prompt": ["a", "b"], "stream": True})
    assert resp.status_code == 400 and "prompt" in resp.json()["error"]["message"]
    resp = http.post("/completion", json={"prompt": "x", "n_predict": -2})
    assert resp.status_code == 400 and "n_predict" in resp.json()["error"]["message"]
    resp = http.post("/detokenize", json={"tokens": [10 ** 9]})
    assert resp.status_code == 400 and resp.json()["error"]["type"] == "invalid_request_error"


def test_infill_with_fim_tokens(http: httpx.Client, adapter_engines: dict) -> None:
    body = {"model": "coder", "input_prefix": "def add(", "input_suffix": "):\n    return a + b",
            "input_extra": [{"filename": "util.py", "text": "X = 1\n"}]}
    out = http.post("/infill", json=body).json()
    assert out["content"] == "a, b" and out["stop"] is True and out["stop_type"] == "eos"
    _, prompt = adapter_engines["coder"].seen[-1]
    assert prompt.endswith("<|file_sep|>util.py\nX = 1\n<|file_sep|>filename\n<|fim_prefix|>def add("
                           "<|fim_suffix|>):\n    return a + b<|fim_middle|>")
    lines = stream_frames(http, "/infill", **{**body, "model": "coder"})
    frames = [json.loads(line[len("data: "):]) for line in lines]
    assert "".join(f["content"] for f in frames) == "a, b" and frames[-1]["stop"] is True
