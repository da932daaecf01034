"""Out-of-range sampling values and huge `n` are 400s naming each protocol's field.

Found by tests/test_fuzz.py: llama.cpp `min_p: 2.0` reached the engine and failed
the whole batched step; `n: 2**31` built per-choice state before any check. Every
generating route now refuses through core/checks.py before leasing a model.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import httpx
import pytest

MSGS = [{"role": "user", "content": "hi"}]

CASES = [
    ("/completion", {"prompt": "hi", "n_predict": 3, "min_p": 2.0}, "min_p"),
    ("/completion", {"prompt": "hi", "n_predict": 3, "repeat_penalty": 1e308}, "repeat_penalty"),
    ("/completion", {"prompt": "hi", "n_predict": 3, "repeat_last_n": -2}, "repeat_last_n"),
    ("/completion", {"prompt": "hi", "n_predict": 3, "top_p": 0.0}, "top_p"),
    ("/completion", {"prompt": "hi", "n_predict": 3, "logit_bias": [[5, 1e300]]}, "logit_bias"),
    ("/infill", {"model": "coder", "input_prefix": "a", "n_predict": 3, "temperature": -1},
     "temperature"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "n": 2**31}, "n"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 3, "n": 2**31}, "n"),
    ("/v1/chat/completions", {"messages": MSGS, "max_tokens": 3, "repetition_penalty": 1e308},
     "repetition_penalty"),
    ("/v1/completions", {"prompt": "hi", "max_tokens": 3, "top_p": 0.0}, "top_p"),
    ("/v1/messages", {"messages": MSGS, "max_tokens": 3, "top_p": 0.0}, "top_p"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": 3, "top_p": 0.0}, "top_p"),
]


@pytest.fixture(scope="module")
def http(live: Any) -> httpx.Client:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def _param(body: dict[str, Any]) -> Any:
    error = body["error"]
    return error.get("param", error.get("message"))


@pytest.mark.parametrize("path,body,param", CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_refused_by_the_protocols_field_name(http: httpx.Client, path: str,
                                             body: dict[str, Any], param: str) -> None:
    started = time.monotonic()
    resp = http.post(path, json={"model": "tiny", **body})  # a body may name its model
    assert resp.status_code == 400, resp.text
    assert time.monotonic() - started < 5.0
    text = resp.text
    assert param in text, text
    if path.startswith("/v1/") and path != "/v1/messages":
        assert _param(resp.json()) == param


def test_llamacpp_disabling_values_still_accepted(http: httpx.Client) -> None:
    """llama.cpp: top_k -1 and repeat_last_n -1 (whole context) are valid."""
    resp = http.post("/completion", json={"model": "tiny", "prompt": "hi", "n_predict": 3,
                                          "top_k": -1, "repeat_last_n": -1,
                                          "repeat_penalty": 1.1, "temperature": 0})
    assert resp.status_code == 200, resp.text
    assert resp.json()["tokens_predicted"] >= 1


def test_bad_request_does_not_disturb_a_running_one(http: httpx.Client, live: Any) -> None:
    result: dict[str, Any] = {}

    def good() -> None:
        with httpx.Client(base_url=live.url, timeout=60) as other:
            result["resp"] = other.post("/v1/completions", json={
                "model": "tiny", "prompt": "Once upon a time", "max_tokens": 24,
                "temperature": 0.7, "min_p": 0.05, "seed": 3, "ignore_eos": True})

    thread = threading.Thread(target=good)
    thread.start()
    for _ in range(3):
        bad = http.post("/completion", json={"model": "tiny", "prompt": "hi", "n_predict": 8,
                                             "min_p": 2.0})
        assert bad.status_code == 400
    thread.join(60)
    resp = result["resp"]
    assert resp.status_code == 200, resp.text
    assert resp.json()["usage"]["completion_tokens"] == 24
