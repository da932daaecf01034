"""Fuzz every route of the real app: no 500s, no hangs, and the daemon keeps serving.

One app (real create_app, the tiny random-weight llama loaded) lives for the
whole module behind a blocking portal; hypothesis sends each route three kinds
of body, each request under a deadline:
1. well-typed (generating routes): the route's example body plus a few
   optional fields with plausible-but-edgy values (sampling, stops, n, tools,
   response formats, grammars), so requests reach the engine;
2. near-valid: the example body with one field replaced by arbitrary JSON,
   deleted, or joined by an unknown field;
3. arbitrary JSON (objects keyed mostly by real field names);
4. raw bytes and non-JSON text.
GET/DELETE routes get fuzzed path parameters. The field that bounds
generation length is never deleted and only set to small numbers (or
non-numbers), so examples stay fast. Admin routes run last.
Examples are derandomized and bounded, so the run is reproducible and short.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import resource
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import quote

import anyio
import httpx
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.routing import Route

from frink_mlx.app import create_app, route_list
from frink_mlx.registry import ModelSpec, Registry
from frink_mlx.settings import Settings

BASE = "http://127.0.0.1:8177"
REQUEST_DEADLINE_S = 30.0
# Longer, non-reproducible hunts: FRINK_FUZZ_EXAMPLES=500 FRINK_FUZZ_RANDOM=1 pytest tests/test_fuzz.py
MAX_EXAMPLES = int(os.environ.get("FRINK_FUZZ_EXAMPLES", "25"))
DERANDOMIZE = os.environ.get("FRINK_FUZZ_RANDOM", "") != "1"
MEMORY_HEADROOM_BYTES = 2 * 1024**3

MSGS = [{"role": "user", "content": "hi"}]
# path -> (example body, the key bounding generation length or None)
EXAMPLES: dict[str, tuple[dict[str, Any], str | None]] = {
    "/v1/chat/completions": ({"model": "tiny", "messages": MSGS, "max_tokens": 3}, "max_tokens"),
    "/v1/completions": ({"model": "tiny", "prompt": "hi", "max_tokens": 3}, "max_tokens"),
    "/v1/responses": ({"model": "tiny", "input": "hi", "max_output_tokens": 3},
                      "max_output_tokens"),
    "/v1/messages": ({"model": "tiny", "messages": MSGS, "max_tokens": 3}, "max_tokens"),
    "/v1/messages/count_tokens": ({"model": "tiny", "messages": MSGS}, None),
    "/v1/embeddings": ({"model": "tiny", "input": "hi"}, None),
    "/completion": ({"prompt": "hi", "n_predict": 3}, "n_predict"),
    "/completions": ({"prompt": "hi", "n_predict": 3}, "n_predict"),
    "/infill": ({"input_prefix": "def f(", "input_suffix": "):", "n_predict": 3}, "n_predict"),
    "/tokenize": ({"content": "hi there"}, None),
    "/detokenize": ({"tokens": [1, 2, 3]}, None),
    "/admin/models/load": ({"model": "tiny", "wait": True}, None),
}
FIELD_NAMES = sorted({k for body, _ in EXAMPLES.values() for k in body} | {
    "stream", "temperature", "top_p", "top_k", "n", "stop", "seed", "tools", "tool_choice",
    "response_format", "logprobs", "top_logprobs", "system", "role", "content", "type",
    "stream_options", "json_schema", "grammar", "logit_bias", "n_probs", "with_pieces",
    "dimensions", "encoding_format", "reasoning", "thinking", "metadata", "user"})
ADMIN_LAST = ("/admin/models/load", "/admin/models/unload")

leaf = st.one_of(
    st.none(), st.booleans(), st.text(max_size=12),
    st.integers(-5, 40), st.sampled_from([0, -1, 2**31, 2**63 - 1, -(2**63), 10**20]),
    st.floats(allow_nan=True, allow_infinity=True, width=32))
json_value = st.recursive(
    leaf, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
        st.sampled_from(FIELD_NAMES) | st.text(max_size=6), inner, max_size=4),
    max_leaves=10)
small_length = st.integers(-3, 6) | st.sampled_from([None, "3", 2.5, [], {}])

# Well-typed optional fields per protocol family: these reach sampling, stops,
# structured output and tools instead of stopping at validation.
unit = st.floats(-2, 10, allow_nan=False) | st.sampled_from([0.0, 1.0, -0.0, 1e308])
schema = st.sampled_from([
    {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]},
    {"type": "string", "enum": ["x", "y"]}, {"type": "array", "items": {"type": "boolean"}},
    {}, {"type": "nonsense"}, {"$ref": "#/nowhere"}]) | json_value
tool = st.fixed_dictionaries({"type": st.just("function"), "function": st.fixed_dictionaries({
    "name": st.text(max_size=8), "parameters": schema})})
stops = st.lists(st.text(max_size=4), max_size=3) | st.text(max_size=4)
COMMON = {"temperature": unit, "top_p": unit, "seed": st.integers(-(2**63), 2**64),
          "stream": st.booleans()}
OPENAI = {**COMMON, "n": st.integers(-1, 3) | st.sampled_from([2**31, 10**6]), "stop": stops,
          "presence_penalty": unit, "frequency_penalty": unit,
          "logit_bias": st.dictionaries(st.sampled_from(["1", "2", "-1", "x"]), unit, max_size=2),
          "stream_options": st.sampled_from([{"include_usage": True}, {"x": 1}, None])}
TYPED: dict[str, dict[str, st.SearchStrategy[Any]]] = {
    "chat": {**OPENAI, "logprobs": st.booleans(), "top_logprobs": st.integers(-1, 30),
             "tools": st.lists(tool, max_size=2),
             "tool_choice": st.sampled_from(["auto", "none", "required"]) | tool,
             "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}])
             | st.builds(lambda sc: {"type": "json_schema",
                                     "json_schema": {"name": "x", "schema": sc}}, schema)},
    "completions": {**OPENAI, "logprobs": st.integers(-1, 6), "echo": st.booleans(),
                    "suffix": st.text(max_size=4), "best_of": st.integers(-1, 3)},
    "anthropic": {**COMMON, "top_k": st.integers(-1, 50), "stop_sequences": stops,
                  "system": st.text(max_size=8) | st.just([{"type": "text", "text": "be"}]),
                  "tools": st.lists(st.fixed_dictionaries(
                      {"name": st.text(max_size=8), "input_schema": schema}), max_size=2),
                  "tool_choice": st.sampled_from([{"type": "auto"}, {"type": "any"},
                                                  {"type": "none"}, {"type": "tool"}]),
                  "thinking": st.builds(lambda n: {"type": "enabled", "budget_tokens": n},
                                        st.integers(-1, 2048))},
    "llamacpp": {**COMMON, "top_k": st.integers(-1, 50), "min_p": unit, "stop": stops,
                 "repeat_penalty": unit, "n_probs": st.integers(-1, 30),
                 "json_schema": schema, "grammar": st.text(max_size=12),
                 "cache_prompt": st.booleans(), "ignore_eos": st.booleans(),
                 "logit_bias": st.lists(st.lists(st.integers(-1, 400) | unit, max_size=2),
                                        max_size=2)},
}
FAMILY = {"/v1/chat/completions": "chat", "/v1/completions": "completions",
          "/v1/responses": "chat", "/v1/messages": "anthropic", "/completion": "llamacpp",
          "/completions": "llamacpp", "/infill": "llamacpp"}


@st.composite
def well_typed(draw: st.DrawFn, path: str) -> dict[str, Any]:
    body, _ = EXAMPLES[path]
    body = json.loads(json.dumps(body))
    fields = TYPED[FAMILY[path]]
    for key in draw(st.lists(st.sampled_from(sorted(fields)), min_size=1, max_size=4,
                             unique=True)):
        body[key] = draw(fields[key])
    return body


@st.composite
def near_valid(draw: st.DrawFn, path: str) -> dict[str, Any]:
    body, length_key = EXAMPLES[path]
    body = json.loads(json.dumps(body))
    key = draw(st.sampled_from(sorted(body) + ["<unknown>"]))
    action = draw(st.sampled_from(["replace", "delete", "nested"]))
    if key == "<unknown>":
        body[draw(st.sampled_from(FIELD_NAMES) | st.text(max_size=6))] = draw(json_value)
    elif key == length_key:
        body[key] = draw(small_length)
    elif action == "delete":
        del body[key]
    elif action == "nested" and isinstance(body[key], list) and body[key]:
        item = body[key][0]
        if isinstance(item, dict):
            item[draw(st.sampled_from(sorted(item) + FIELD_NAMES))] = draw(json_value)
        else:
            body[key][0] = draw(json_value)
    else:
        body[key] = draw(json_value)
    if length_key and length_key in body and draw(st.booleans()):
        body["stream"] = draw(st.booleans() | json_value)
    return body


def encode(value: Any) -> bytes:
    return json.dumps(value, allow_nan=True).encode()


def body_strategy(path: str) -> st.SearchStrategy[bytes]:
    raw = st.binary(max_size=64) | st.sampled_from([b"", b"{", b"[]", b"null", b'{"a":1}x'])
    shapes = [st.builds(encode, json_value), raw]
    if path in EXAMPLES:
        shapes.insert(0, st.builds(encode, near_valid(path)))
    if path in FAMILY:
        shapes.insert(0, st.builds(encode, well_typed(path)))
        shapes.insert(0, st.builds(encode, well_typed(path)))  # weight the deep paths
    return st.one_of(*shapes)


def fuzz_routes() -> list[tuple[str, str]]:
    pairs = sorted({(r.path, m) for r in route_list() if isinstance(r, Route)
                    for m in (r.methods or ()) if m != "HEAD"},
                   key=lambda pm: (pm[0] in ADMIN_LAST, pm[0] == "/admin/models/unload", pm))
    return pairs


class Daemon:
    """The app and a client, driven from sync hypothesis tests through a portal."""

    def __init__(self, portal: BlockingPortal, client: httpx.AsyncClient) -> None:
        self.portal, self.client = portal, client
        self.errors = ErrorLog()

    def request(self, method: str, path: str, content: bytes | None = None,
                headers: dict[str, str] | None = None) -> tuple[int, bytes, httpx.Headers]:
        self.errors.take()

        async def go() -> tuple[int, bytes, httpx.Headers]:
            with anyio.fail_after(REQUEST_DEADLINE_S):
                r = await self.client.request(method, path, content=content, headers=headers)
                return r.status_code, r.content, r.headers
        return self.portal.call(go)

    def ensure_loaded(self) -> None:
        status, content, _ = self.request("POST", "/admin/models/load",
                                          encode({"model": "tiny", "wait": True}))
        assert status in (200, 409), content

    def check(self, response: tuple[int, bytes, httpx.Headers], what: str) -> None:
        check(*response, what=what, errors=self.errors.take())


@contextlib.contextmanager
def memory_cap(extra_bytes: int) -> Iterator[None]:
    """Cap this process's address space while fuzzing: a runaway allocation in the daemon
    becomes a MemoryError (a failing example) instead of swapping out a shared machine."""
    statm = Path("/proc/self/statm")
    if not statm.exists():  # macOS does not enforce RLIMIT_AS anyway
        yield
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    current = int(statm.read_text().split()[0]) * resource.getpagesize()
    cap = current + extra_bytes
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path) -> Iterator[Daemon]:
    cfg = tmp_path_factory.mktemp("fuzz-cfg")
    registry = Registry(entries={"tiny": ModelSpec(name="tiny", source=str(tiny_llama_dir))},
                        default="tiny", path="<fuzz>")
    app = create_app(Settings(config_dir=str(cfg), max_body_bytes=64 * 1024), registry=registry)
    with start_blocking_portal() as portal, memory_cap(MEMORY_HEADROOM_BYTES):
        with portal.wrap_async_context_manager(app.router.lifespan_context(app)):
            client = httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=BASE)
            daemon = Daemon(portal, client)
            logger = logging.getLogger("frink_mlx")
            logger.addHandler(daemon.errors)
            try:
                yield daemon
            finally:
                logger.removeHandler(daemon.errors)
                portal.call(client.aclose)


SERVER_FAULTS = (b"server_error", b"internal_error", b"engine_error", b"api_error")


class ErrorLog(logging.Handler):
    """Collects ERROR records from the daemon's loggers (unhandled errors, failed steps)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def take(self) -> list[str]:
        found = [r.getMessage() + (f" ({r.exc_info[1]!r})" if r.exc_info else "")
                 for r in self.records]
        self.records.clear()
        return found


def check(status: int, content: bytes, headers: httpx.Headers, what: str,
          errors: list[str]) -> None:
    """No 5xx but 501/503, no server fault inside a 200 stream, nothing logged at ERROR."""
    assert status < 500 or status in (501, 503), f"{status} for {what}: {content[:300]!r}"
    assert "request-id" in headers
    if status == 200 and headers.get("content-type", "").startswith("text/event-stream"):
        assert not any(f in content for f in SERVER_FAULTS), f"fault in stream for {what}: {content[:300]!r}"
    if status >= 400 and headers.get("content-type", "").startswith("application/json"):
        assert "error" in json.loads(content), f"{status} without an error envelope for {what}"
    assert not errors, f"daemon logged errors for {what}: {errors}"


@pytest.mark.parametrize("path,method", fuzz_routes())
def test_route_survives_fuzzed_requests(daemon: Daemon, path: str, method: str) -> None:
    if "{" in path:
        template = path

        @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=DERANDOMIZE,
                  suppress_health_check=[HealthCheck.function_scoped_fixture])
        @given(param=st.text(max_size=40))
        def run_path(param: str) -> None:
            url = template.split("{")[0] + quote(param, safe="")
            daemon.check(daemon.request(method, url), what=f"{method} {url}")
        run_path()
        return

    @settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=DERANDOMIZE,
              suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(body=body_strategy(path) if method == "POST" else st.just(b""))
    def run_body(body: bytes) -> None:
        headers = {"content-type": "application/json"}
        daemon.check(daemon.request(method, path, body or None, headers),
                     what=f"{method} {path} {body[:300]!r}")
    run_body()


# Found by this fuzz on 2026-11-29; each must be refused with a 4xx, never a 500 or a hang.
REPRODUCERS = [
    ("/completion", {"prompt": "hi", "n_predict": 3, "grammar": "0"}),
    ("/completion", {"prompt": "hi", "n_predict": 3, "min_p": 2.0}),
    ("/v1/completions", {"model": "tiny", "prompt": "hi", "max_tokens": 3, "n": 2**31}),
    ("/v1/chat/completions", {"model": "tiny", "messages": MSGS, "max_tokens": 3, "n": 2**31}),
    ("/v1/embeddings", {"model": "tiny", "input": [0, []]}),
]


@pytest.mark.parametrize("path,body", REPRODUCERS, ids=lambda v: v if isinstance(v, str) else "")
def test_found_reproducers(daemon: Daemon, path: str, body: dict[str, Any]) -> None:
    daemon.ensure_loaded()
    response = daemon.request("POST", path, encode(body), {"content-type": "application/json"})
    daemon.check(response, what=f"POST {path} {body}")
    assert 400 <= response[0] < 500


def test_daemon_still_serves_after_fuzzing(daemon: Daemon) -> None:
    daemon.ensure_loaded()
    status, content, _ = daemon.request("GET", "/health")
    assert status == 200, content
    status, content, _ = daemon.request(
        "POST", "/v1/chat/completions", encode(EXAMPLES["/v1/chat/completions"][0]),
        {"content-type": "application/json"})
    assert status == 200, content
