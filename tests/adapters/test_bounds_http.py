"""Hostile request sizes are 400s in each protocol's envelope, naming its field, and stall nobody.

Issue 32, sent on main: an Anthropic request with 1,000,000 stop_sequences held
/health past 30 s; a 500,000-entry logit_bias halved a neighbour's decode;
logit_bias keys "²" and a 4,400-digit number, tools[0].function.parameters
nested 100,000 deep and Ollama keep_alive 1e308 (then GET /api/ps) were 500s
with tracebacks. Bounds: core/checks.py rules 4-5, http/depth.py, the Ollama
adapter's keep_alive; through the real server here (tests/adapters/conftest.py).
Requests just at each bound are accepted, and neither they, the refused ones, nor
strangers flooding the gates of a daemon with a key and a connection cap (`gated`, as
`frink-mlx serve` serves it) stall a neighbour (tests/stall_support.py).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

import httpx
import pytest
from daemon_support import flood_at_the_cap, start_guarded_server
from stall_support import assert_nobody_stalled, encoded

from adapters.scripted import write_models_toml
from frink_mlx.app import create_app
from frink_mlx.core.checks import MAX_LOGIT_BIAS, MAX_STOP_CHARS, MAX_STOP_SEQUENCES, MAX_TOOLS
from frink_mlx.http.depth import MAX_JSON_DEPTH
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

MSGS = [{"role": "user", "content": "hi"}]


def _nested(depth: int) -> Any:
    """A JSON value `depth` arrays deep, as text spliced into a body (json.dumps recurses)."""
    return "[" * depth + "]" * depth


def _raw(body: str) -> dict[str, Any]:
    return {"content": body.encode(), "headers": {"content-type": "application/json"}}


def _openai(resp: httpx.Response, field: str) -> None:
    assert resp.json()["error"]["param"] == field, resp.text


def _anthropic(resp: httpx.Response, field: str) -> None:
    body = resp.json()
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert f"'{field}" in body["error"]["message"], resp.text


def _llamacpp(resp: httpx.Response, field: str) -> None:
    error = resp.json()["error"]
    assert error["code"] == 400 and error["type"] == "invalid_request_error"
    assert f"'{field}" in error["message"], resp.text


def _ollama(resp: httpx.Response, field: str) -> None:
    assert f"'{field}" in resp.json()["error"], resp.text


Check = Callable[[httpx.Response, str], None]
MANY = [f"s{i}" for i in range(65)]
LONG = ["x" * 257]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
DEEP_PARAMS = ('{"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "tools": '
               '[{"type": "function", "function": {"name": "f", "parameters": {"a": %s}}}]}')
DEEP_AT = '{"max_tokens": 8, ' + DEEP_PARAMS[1:]   # "a" is at level 5: %s may nest 123 more

CASES: list[tuple[str, dict[str, Any], Check, str]] = [
    # stop strings: one limit, every protocol's own field
    ("/v1/chat/completions", {"json": {"messages": MSGS, "stop": MANY}}, _openai, "stop"),
    ("/v1/chat/completions", {"json": {"messages": MSGS, "stop": LONG}}, _openai, "stop"),
    ("/v1/completions", {"json": {"prompt": "hi", "stop": MANY}}, _openai, "stop"),
    ("/v1/messages", {"json": {"max_tokens": 4, "messages": MSGS, "stop_sequences": MANY}},
     _anthropic, "stop_sequences"),
    ("/v1/messages", {"json": {"max_tokens": 4, "messages": MSGS,
                               "stop_sequences": ["s"] * 100_000}}, _anthropic, "stop_sequences"),
    ("/api/chat", {"json": {"messages": MSGS, "stream": False, "options": {"stop": MANY}}},
     _ollama, "options.stop"),
    ("/api/generate", {"json": {"prompt": "hi", "stream": False, "options": {"stop": LONG}}},
     _ollama, "options.stop"),
    ("/completion", {"json": {"prompt": "hi", "stop": MANY}}, _llamacpp, "stop"),
    # logit_bias: keys that spell token ids of the model, a bounded count
    ("/v1/chat/completions", {"json": {"messages": MSGS, "logit_bias": {"\u00b2": 1}}},
     _openai, "logit_bias"),
    ("/v1/chat/completions", {"json": {"messages": MSGS, "logit_bias": {"9" * 4400: 1}}},
     _openai, "logit_bias"),
    ("/v1/chat/completions", {"json": {"messages": MSGS, "logit_bias": {"99999999": 1}}},
     _openai, "logit_bias"),
    ("/v1/completions", {"json": {"prompt": "hi", "logit_bias": {str(i): 1 for i in range(1025)}}},
     _openai, "logit_bias"),
    ("/completion", {"json": {"prompt": "hi", "logit_bias": [[f"w{i}", -1] for i in range(50_000)]}},
     _llamacpp, "logit_bias"),
    ("/completion", {"json": {"prompt": "hi", "logit_bias": {"99999999": 1}}}, _llamacpp,
     "logit_bias"),
    # a batch of prompts is at most max_batch choices
    ("/v1/completions", {"json": {"prompt": ["a"] * 17}}, _openai, "prompt"),
    ("/v1/completions", {"json": {"prompt": ["a"] * 5, "n": 4}}, _openai, "prompt"),
    ("/completion", {"json": {"prompt": ["a"] * 17}}, _llamacpp, "prompt"),
    # tools: a bounded count
    ("/v1/chat/completions", {"json": {"messages": MSGS, "tools": [TOOL] * 513}}, _openai, "tools"),
    ("/v1/messages", {"json": {"max_tokens": 4, "messages": MSGS,
                               "tools": [{"name": "f", "input_schema": {}}] * 513}},
     _anthropic, "tools"),
    ("/v1/responses", {"json": {"input": "hi", "tools": [{"type": "function", "name": "f",
                                                           "parameters": {}}] * 513}},
     _openai, "tools"),
    # nesting, under fields typed Any: decodable and past msgspec's own recursion limit
    ("/v1/chat/completions", _raw(DEEP_PARAMS % _nested(200)), _openai,
     "tools[].function.parameters"),
    ("/v1/chat/completions", _raw(DEEP_PARAMS % _nested(MAX_JSON_DEPTH - 4)), _openai,
     "tools[].function.parameters"),   # one level past what AT_THE_BOUNDS sends
    ("/v1/chat/completions", _raw(DEEP_PARAMS % _nested(100_000)), _openai,
     "tools[].function.parameters"),
    ("/v1/messages", _raw('{"model": "tiny", "max_tokens": 4, "messages": [{"role": "user", '
                          '"content": "hi"}], "tools": [{"name": "f", "input_schema": '
                          '{"a": %s}}]}' % _nested(100_000)), _anthropic, "tools[].input_schema"),
    ("/api/chat", _raw('{"model": "tiny", "stream": false, "messages": [{"role": "user", '
                       '"content": "hi"}], "format": {"a": %s}}' % _nested(300)), _ollama, "format"),
    ("/completion", _raw('{"prompt": "hi", "json_schema": {"a": %s}}' % _nested(100_000)),
     _llamacpp, "json_schema"),
    # numbers that must be finite
    ("/api/generate", {"json": {"prompt": "hi", "stream": False, "keep_alive": "nan"}},
     _ollama, "keep_alive"),
]


@pytest.fixture(scope="module")
def http(live: Any) -> httpx.Client:
    with httpx.Client(base_url=live.url, timeout=60) as client:
        yield client


def _send(http: httpx.Client, path: str, request: dict[str, Any]) -> httpx.Response:
    if "json" in request:
        request = {"json": {"model": "tiny", **request["json"]}}
    return http.post(path, **request)


@pytest.mark.parametrize("path,request_,check,field", CASES,
                         ids=[f"{c[0]}-{c[3]}-{i}" for i, c in enumerate(CASES)])
def test_refused_in_the_protocols_envelope_naming_its_field(
        http: httpx.Client, path: str, request_: dict[str, Any], check: Check, field: str,
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        resp = _send(http, path, request_)
    assert resp.status_code == 400, resp.text
    check(resp, field)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_what_the_bounds_allow_still_runs(http: httpx.Client) -> None:
    """At the limits (64 stops, a text logit_bias key, a batch of max_batch) nothing is refused."""
    resp = http.post("/v1/messages", json={"model": "tiny", "max_tokens": 3, "messages": MSGS,
                                           "stop_sequences": [f"zz{i}" for i in range(64)]})
    assert resp.status_code == 200, resp.text
    resp = http.post("/completion", json={"model": "tiny", "prompt": "hi", "n_predict": 2,
                                          "logit_bias": [["\u00b2", -1]], "stop": ["q" * 256]})
    assert resp.status_code == 200, resp.text   # a text key: its tokens are biased
    resp = http.post("/v1/completions", json={"model": "tiny", "prompt": ["a", "b"], "n": 8,
                                              "max_tokens": 2, "logit_bias": {"5": 3}})
    assert resp.status_code == 200 and len(resp.json()["choices"]) == 16, resp.text


def test_a_huge_keep_alive_is_clamped_and_api_ps_answers(http: httpx.Client) -> None:
    resp = http.post("/api/generate", json={"model": "tiny", "keep_alive": 1e308})
    assert resp.status_code == 200, resp.text
    ps = http.get("/api/ps")
    assert ps.status_code == 200, ps.text
    tiny = next(m for m in ps.json()["models"] if m["name"].startswith("tiny"))
    assert tiny["expires_at"] is not None and int(tiny["expires_at"][:4]) >= 2100


def test_a_websocket_upgrade_is_refused(live: Any) -> None:
    """uvicorn hands the app a websocket scope (it has a WebSocket library); none reaches a route."""
    import socket
    from urllib.parse import urlparse

    pytest.importorskip("websockets")
    url = urlparse(live.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(b"GET /v1/chat/completions HTTP/1.1\r\nHost: localhost\r\n"
                     b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
                     b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n")
        head = sock.recv(4096).split(b"\r\n", 1)[0]
    assert head.startswith(b"HTTP/1.1 403"), head


def _encoded(path: str, request: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Encoded up front (tests/stall_support.py: the test's own json.dumps holds the GIL)."""
    if "json" in request:
        return path, encoded({"model": "tiny", **request["json"]})
    return path, request


HOSTILE = [_encoded(path, request) for path, request in [
    ("/v1/messages", {"json": {"max_tokens": 64, "messages": MSGS,
                               "stop_sequences": ["s"] * 20_000}}),
    ("/v1/chat/completions", _raw(DEEP_PARAMS % _nested(100_000))),
    ("/completion", {"json": {"prompt": "hi", "logit_bias": [[f"w{i}", -1] for i in range(2000)]}}),
    ("/v1/completions", {"json": {"prompt": ["a"] * 2000}}),
    ("/v1/chat/completions", {"json": {"messages": MSGS, "tools": [TOOL] * 1000}}),
    ("/api/chat", {"json": {"messages": MSGS, "stream": False,
                            "options": {"stop": ["s"] * 20_000}}}),
]]


def _no_errors(caplog: pytest.LogCaptureFixture) -> None:
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def _all_answer(http: httpx.Client, requests: list[tuple[str, dict[str, Any]]], status: int,
                times: int = 1) -> Callable[[], None]:
    def send() -> None:
        for path, request in requests * times:
            resp = http.post(path, **request)
            assert resp.status_code == status, (path, resp.text[:300])
    return send


def test_hostile_requests_stall_nobody(http: httpx.Client, live: Any,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """While they are refused, a neighbour streams with its TTFT alone and /health answers
    within 100 ms (tests/stall_support.py: the baseline, the bounds, GC and noise)."""
    with caplog.at_level(logging.WARNING):
        _all_answer(http, HOSTILE, 400)()   # first use of each wire struct builds its type info
        assert_nobody_stalled(live.url, _all_answer(http, HOSTILE, 400, times=3))
    _no_errors(caplog)


STOPS = [f"{i:02d}" + "q" * (MAX_STOP_CHARS - 2) for i in range(MAX_STOP_SEQUENCES)]
TEXT_KEYS = [[f"w{i}", -1] for i in range(MAX_LOGIT_BIAS)]   # deduplicated ids: within the bound
MIXED = [piece for i in range(300) for piece in (f"w{i}", 5)]   # 600 pieces, about 1,200 tokens

AT_THE_BOUNDS = [_encoded(path, request) for path, request in [
    ("/v1/completions", {"json": {"prompt": "hi", "max_tokens": 8, "stop": STOPS}}),
    ("/v1/messages", {"json": {"max_tokens": 8, "messages": MSGS, "stop_sequences": STOPS}}),
    ("/api/chat", {"json": {"messages": MSGS, "stream": False,
                            "options": {"stop": STOPS, "num_predict": 8}}}),
    ("/completion", {"json": {"prompt": "hi", "n_predict": 8, "stop": STOPS}}),
    ("/completion", {"json": {"prompt": "hi", "n_predict": 8, "logit_bias": TEXT_KEYS}}),
    ("/completion", {"json": {"prompt": "hi", "n_predict": 8,
                              "logit_bias": [[i % 300, 0.5] for i in range(MAX_LOGIT_BIAS)]}}),
    ("/completion", {"json": {"prompt": MIXED, "n_predict": 8}}),
    ("/v1/completions", {"json": {"prompt": "hi", "max_tokens": 8,
                                  "logit_bias": {str(i): 0.5 for i in range(300)}}}),
    ("/v1/completions", {"json": {"prompt": ["a"] * 16, "max_tokens": 8}}),
    # 512 tools render to 12,000 tokens, past the tiny model's 2048: counted, not generated
    ("/v1/messages/count_tokens", {"json": {"messages": MSGS, "tools": [
        {"name": f"f{i}", "input_schema": {"type": "object"}} for i in range(MAX_TOOLS)]}}),
    ("/v1/chat/completions", _raw(DEEP_AT % _nested(MAX_JSON_DEPTH - 5))),
]]


def test_requests_at_the_bounds_slow_no_neighbour(http: httpx.Client, live: Any,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    """Just AT each bound (64 stop strings of 256 characters on every protocol, 1024
    logit_bias entries as ids and as texts, a mixed llama.cpp prompt of 600 pieces, 16
    prompts, 512 tools (counted), nesting one level short of the cap) every request is accepted and
    run, and a neighbour beside them keeps its TTFT and /health its bound. The text keys
    and the mixed prompt were tokenized one piece at a time, one lease and hop each: 2.5 s
    in which the neighbour got nothing (benchmarks/results/hostile-2026-12-04.txt)."""
    with caplog.at_level(logging.WARNING):
        _all_answer(http, AT_THE_BOUNDS, 200)()
        assert_nobody_stalled(live.url, _all_answer(http, AT_THE_BOUNDS, 200))
    _no_errors(caplog)


KEY = "sk-hostile-test"
CAP = 8


@pytest.fixture(scope="module")
def gated(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A daemon as `frink-mlx serve` serves it (tests/daemon_support.py
    `start_guarded_server`) with an API key and a connection cap of CAP."""
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("gated")
    path = write_models_toml(root, {"tiny": make_tiny_llama(root / "tiny")}, default="tiny")
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(root / "cache"), fallback=False, api_key=KEY,
                             max_connections=CAP)
    server = start_guarded_server(create_app(settings, registry=load_registry(settings)), settings)
    yield server
    server.stop()


LONG_PATH = "/v1/models/" + "x" * 16_000
STRANGERS: list[tuple[str, str, dict[str, str], int]] = [
    ("GET", LONG_PATH, {"host": "evil.example"}, 421),   # DNS rebinding's Host
    ("POST", "/v1/completions", {"host": "evil.example", "x-api-key": KEY}, 421),
    ("POST", "/v1/completions", {}, 401),                 # no key
    ("POST", "/v1/chat/completions", {"authorization": "Bearer wrong"}, 401),
    ("GET", LONG_PATH, {}, 401),
    ("BREW", LONG_PATH, {}, 401),                         # methods no route knows
    ("PROPFIND", "/admin/status", {"x-api-key": "wrong"}, 401),
    ("BREW", "/v1/models", {"x-api-key": KEY}, 405),
]


def test_strangers_flooding_the_gates_stall_nobody(gated: Any,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    """Pre-auth refusals -- a foreign Host, no key or a wrong one, methods no route knows,
    16 KiB paths -- and connections past the cap, hundreds of them, while the key's holder
    streams with the TTFT it has alone and /health answers within 100 ms. The flood fills
    the cap with idle connections (besides the neighbour's, the poller's and its own) until
    a new one is refused; from then on every new one is."""
    heads: list[bytes] = []

    def strangers(client: httpx.Client, _: int) -> None:
        for method, path, headers, status in STRANGERS:
            resp = client.request(method, path, headers=headers)
            assert resp.status_code == status, (method, path[:30], resp.text[:200])

    def flood() -> None:
        heads.extend(flood_at_the_cap(gated.url, CAP, 25, strangers, timeout=30))

    with caplog.at_level(logging.WARNING):
        assert_nobody_stalled(gated.url, flood, headers={"x-api-key": KEY})
    assert heads and set(heads) == {b"HTTP/1.1 503 Service Unavailable"}, heads
    _no_errors(caplog)
