"""Speculative decoding over real HTTP: the per-request opt-out, usage and /metrics.

Every protocol takes `speculative: false` and reports drafted / accepted tokens where
the request speculated (OpenAI and Anthropic usage `draft_tokens` / `draft_accepted`,
llama.cpp `timings.draft_n` / `draft_n_accepted`); greedy answers are the same either
way; a malformed value is a 400 naming the field.
"""

from __future__ import annotations

import httpx
import pytest
from daemon_support import generation_factory, start_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

# A prompt that repeats itself, so prompt lookup has something to find.
TEXT = "alpha beta gamma delta epsilon zeta eta theta " * 6


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("ckpts")
    path = write_registry(tmp_path_factory.mktemp("reg"), make_tiny_llama(root / "a", seed=0),
                          make_tiny_llama(root / "b", seed=1))
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(tmp_path_factory.mktemp("c")))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    server = start_server(app)
    yield server
    server.stop()


def _post(live, path: str, body: dict) -> httpx.Response:
    return httpx.post(live.url + path, json=body, timeout=120)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_openai_usage_reports_drafts_unless_opted_out(live, route):
    base = {"model": "tiny-a", "max_tokens": 24, "temperature": 0}
    base |= ({"messages": [{"role": "user", "content": TEXT}]} if "chat" in route
             else {"prompt": TEXT})
    on = _post(live, route, base).json()
    off = _post(live, route, {**base, "speculative": False}).json()
    assert isinstance(on["usage"]["draft_tokens"], int)
    assert 0 <= on["usage"]["draft_accepted"] <= on["usage"]["draft_tokens"]
    assert "draft_tokens" not in off["usage"] and "draft_accepted" not in off["usage"]
    text = "message" if "chat" in route else "text"
    pick = (lambda r: r["choices"][0]["message"]["content"]) if text == "message" \
        else (lambda r: r["choices"][0]["text"])
    assert pick(on) == pick(off)


def test_anthropic_and_llamacpp_take_the_opt_out(live):
    msg = {"model": "tiny-a", "max_tokens": 16, "temperature": 0,
           "messages": [{"role": "user", "content": TEXT}]}
    on = _post(live, "/v1/messages", msg).json()
    off = _post(live, "/v1/messages", {**msg, "speculative": False}).json()
    assert isinstance(on["usage"]["draft_tokens"], int) and "draft_tokens" not in off["usage"]
    assert on["content"] == off["content"]
    cpp = {"model": "tiny-a", "prompt": TEXT, "n_predict": 16, "temperature": 0}
    on = _post(live, "/completion", cpp).json()
    off = _post(live, "/completion", {**cpp, "speculative": False}).json()
    assert "draft_n" not in off["timings"] and on["content"] == off["content"]


def test_llamacpp_timings_carry_drafts_only_when_drafted():
    from frink_mlx.adapters.llamacpp.translate import timings
    from frink_mlx.core.events import Done, Usage

    drafted = Done(index=0, finish_reason="length",
                   usage=Usage(prompt_tokens=9, completion_tokens=8, draft_tokens=6,
                               draft_accepted=4))
    assert timings(drafted)["draft_n"] == 6 and timings(drafted)["draft_n_accepted"] == 4
    none = Done(index=0, finish_reason="length",
                usage=Usage(prompt_tokens=9, completion_tokens=8, draft_tokens=0,
                            draft_accepted=0))
    assert "draft_n" not in timings(none) and "draft_n_accepted" not in timings(none)


@pytest.mark.parametrize("route,body", [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/messages", {"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}),
    ("/completion", {"prompt": "hi"}),
])
def test_a_malformed_opt_out_is_a_400_naming_it(live, route, body):
    response = _post(live, route, {"model": "tiny-a", **body, "speculative": "sometimes"})
    assert response.status_code == 400 and "speculative" in response.text


def test_metrics_count_drafts(live):
    _post(live, "/v1/completions", {"model": "tiny-a", "prompt": TEXT, "max_tokens": 8})
    text = httpx.get(live.url + "/metrics", timeout=30).text
    assert "frink_spec_draft_tokens_total" in text
    assert "frink_spec_draft_accepted_tokens_total" in text


def test_stop_strings_cut_the_same_text_with_drafts(live):
    base = {"model": "tiny-a", "prompt": TEXT, "max_tokens": 32, "temperature": 0}
    full = _post(live, "/v1/completions", {**base, "speculative": False}).json()
    text = full["choices"][0]["text"]
    stop = text[len(text) // 2:len(text) // 2 + 3]
    if not stop.strip():
        pytest.skip("the tiny model's text has no usable stop string here")
    on = _post(live, "/v1/completions", {**base, "stop": [stop]}).json()
    off = _post(live, "/v1/completions", {**base, "stop": [stop], "speculative": False}).json()
    assert on["choices"][0]["text"] == off["choices"][0]["text"] == text[:text.index(stop)]
    assert on["choices"][0]["finish_reason"] == off["choices"][0]["finish_reason"] == "stop"
    assert on["usage"]["completion_tokens"] == off["usage"]["completion_tokens"]
