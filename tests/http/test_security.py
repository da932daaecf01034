"""Security gates on a small Starlette app carrying the daemon's real middleware.

End-to-end checks against the real create_app live in tests/test_fuzz.py and
at the bottom of this file (skipped until app.py exists).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.routing import Route

from frink_mlx import metrics as metrics_mod
from frink_mlx.core.offload import Offload
from frink_mlx.errors import ConfigError
from frink_mlx.http.access import note_generation
from frink_mlx.http.binding import check_bind, default_key_file, is_loopback_host, resolve_api_key
from frink_mlx.http.security import SecurityMiddleware, build_middleware
from frink_mlx.settings import Settings

pytestmark = pytest.mark.anyio

BASE = "http://127.0.0.1:8177"
KEY = "sk-test-0123456789"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def make_settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(config_dir=str(tmp_path / "cfg"), **kw)  # type: ignore[arg-type]


class Probe:
    """Endpoints for the test app; `hold` parks /slow requests until released."""

    def __init__(self) -> None:
        self.entered = 0
        self.release = asyncio.Event()

    async def ok(self, request: Request) -> JSONResponse:
        body = await request.body()
        await asyncio.sleep(0.02)  # a little "decode" time after the 10 ms TTFT
        note_generation(request, model="tiny", generation=3, prompt_tokens=5,
                        completion_tokens=4, ttft_s=0.01)
        return JSONResponse({"ok": True, "bytes": len(body)})

    async def slow(self, request: Request) -> PlainTextResponse:
        self.entered += 1
        await self.release.wait()
        return PlainTextResponse("done")

    async def stream(self, request: Request) -> StreamingResponse:
        async def gen():
            for i in range(3):
                yield f"data: {i}\n\n"
        return StreamingResponse(gen(), media_type="text/event-stream")

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})


def make_app(settings: Settings, probe: Probe) -> Starlette:
    routes = [
        Route("/health", probe.health),
        Route("/v1/chat/completions", probe.ok, methods=["POST"]),
        Route("/v1/messages", probe.ok, methods=["POST"]),
        Route("/completion", probe.ok, methods=["POST"]),
        Route("/admin/models", probe.ok, methods=["GET"]),
        Route("/slow", probe.slow),
        Route("/stream", probe.stream),
        *metrics_mod.routes,
    ]
    app = Starlette(routes=routes, middleware=build_middleware(settings))
    app.state.frink = SimpleNamespace(config=settings.frontend_config(), offload=Offload())
    app.state.metrics = metrics_mod.Metrics()
    return app


def client(app: Starlette, base_url: str = BASE) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=base_url)


async def _post(app: Starlette, path: str, headers: dict[str, str] | None = None,
                base_url: str = BASE) -> httpx.Response:
    async with client(app, base_url) as c:
        return await c.post(path, json={"x": 1}, headers=headers or {})


# --- bind and key sources --------------------------------------------------

def test_non_loopback_bind_without_key_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="non-loopback address needs an API key"):
        check_bind(make_settings(tmp_path, host="0.0.0.0"))
    with pytest.raises(ConfigError):
        check_bind(make_settings(tmp_path, host="192.168.1.20"))
    assert check_bind(make_settings(tmp_path, host="0.0.0.0", api_key=KEY)) == KEY
    assert check_bind(make_settings(tmp_path)) is None
    assert check_bind(make_settings(tmp_path, host="::1")) is None


@pytest.mark.parametrize("origin", ["null", "*", " NULL "])
def test_null_and_star_origins_are_refused_at_start_up(tmp_path: Path, origin: str) -> None:
    """`null` is what sandboxed iframes and file:// pages send: allowing it allows any page."""
    settings = make_settings(tmp_path, cors_origins=("http://localhost:3000", origin))
    with pytest.raises(ConfigError, match="would let any web page call this daemon"):
        check_bind(settings)
    with pytest.raises(ConfigError):
        SecurityMiddleware(lambda *a: None, settings, None)  # type: ignore[arg-type]
    assert check_bind(make_settings(tmp_path, cors_origins=("http://localhost:3000",))) is None


@pytest.mark.parametrize("host,loop", [("127.0.0.1", True), ("127.8.9.1", True), ("::1", True),
                                       ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                       ("::", False), ("10.0.0.1", False), ("myhost", False)])
def test_is_loopback_host(host: str, loop: bool) -> None:
    assert is_loopback_host(host) is loop


def test_key_file_must_be_owner_only(tmp_path: Path) -> None:
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    os.chmod(key_file, 0o644)
    settings = make_settings(tmp_path, api_key_file=str(key_file))
    with pytest.raises(ConfigError, match="mode 0644.*chmod 600"):
        resolve_api_key(settings)
    os.chmod(key_file, 0o600)
    assert resolve_api_key(settings) == KEY
    with pytest.raises(ConfigError, match="does not exist"):
        resolve_api_key(make_settings(tmp_path, api_key_file=str(tmp_path / "missing")))


def test_key_precedence_and_default_file(tmp_path: Path) -> None:
    settings = make_settings(tmp_path)
    assert resolve_api_key(settings) is None
    path = default_key_file(settings)
    path.parent.mkdir(parents=True)
    path.write_text("from-file")
    os.chmod(path, 0o600)
    assert resolve_api_key(settings) == "from-file"
    assert resolve_api_key(make_settings(tmp_path, api_key="flag")) == "flag"


def test_env_key_reaches_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FRINK_MLX_API_KEY", "from-env")
    settings = Settings.load(config_dir=str(tmp_path))
    assert resolve_api_key(settings) == "from-env"


# --- API key ---------------------------------------------------------------

async def test_missing_or_wrong_key_is_401_in_each_envelope(tmp_path: Path) -> None:
    app = make_app(make_settings(tmp_path, api_key=KEY), Probe())
    for headers in ({}, {"authorization": "Bearer nope"}, {"x-api-key": "nope"}):
        r = await _post(app, "/v1/chat/completions", headers)
        assert r.status_code == 401
        err = r.json()["error"]
        assert err["type"] == "authentication_error" and err["code"] == "invalid_api_key"
        r = await _post(app, "/v1/messages", headers)
        assert r.status_code == 401
        assert r.json()["type"] == "error"
        assert r.json()["error"]["type"] == "authentication_error"
        r = await _post(app, "/completion", headers)
        assert r.status_code == 401
        assert r.json()["error"]["code"] == 401
        assert "request-id" in r.headers


async def test_right_key_passes_and_health_stays_open(tmp_path: Path) -> None:
    app = make_app(make_settings(tmp_path, api_key=KEY), Probe())
    assert (await _post(app, "/v1/messages", {"x-api-key": KEY})).status_code == 200
    ok = await _post(app, "/v1/chat/completions", {"authorization": f"Bearer {KEY}"})
    assert ok.status_code == 200
    async with client(app) as c:
        assert (await c.get("/health")).status_code == 200
        assert (await c.get("/metrics")).status_code == 401
        assert (await c.get("/admin/models")).status_code == 401
        assert (await c.get("/metrics", headers={"x-api-key": KEY})).status_code == 200


# --- Host and CORS ---------------------------------------------------------

async def test_foreign_host_rejected(tmp_path: Path) -> None:
    app = make_app(make_settings(tmp_path), Probe())
    r = await _post(app, "/v1/chat/completions", base_url="http://evil.example:8177")
    assert r.status_code == 421
    assert r.json()["error"]["code"] == "misdirected_request"
    r = await _post(app, "/v1/messages", base_url="http://evil.example")
    assert r.status_code == 421 and r.json()["type"] == "error"
    async with client(app, "http://evil.example") as c:
        assert (await c.get("/health")).status_code == 421  # rebinding cannot even probe
    for base in ("http://localhost:8177", "http://[::1]:8177", "http://127.0.0.1"):
        assert (await _post(app, "/v1/chat/completions", base_url=base)).status_code == 200


async def test_allowed_hosts_setting(tmp_path: Path) -> None:
    app = make_app(make_settings(tmp_path, allowed_hosts=("mybox.lan",)), Probe())
    assert (await _post(app, "/completion", base_url="http://MyBox.lan:8177")).status_code == 200


async def test_cors_preflight(tmp_path: Path) -> None:
    allowed = "http://localhost:3000"
    app = make_app(make_settings(tmp_path, api_key=KEY, cors_origins=(allowed,)), Probe())
    preflight = {"access-control-request-method": "POST",
                 "access-control-request-headers": "authorization, content-type"}
    async with client(app) as c:
        bad = await c.options("/v1/chat/completions",
                              headers={**preflight, "origin": "http://evil.example"})
        assert bad.status_code == 403
        assert not [h for h in bad.headers if h.startswith("access-control-allow")]
        good = await c.options("/v1/chat/completions", headers={**preflight, "origin": allowed})
        assert good.status_code == 204  # answered before auth: no key sent
        assert good.headers["access-control-allow-origin"] == allowed
        assert good.headers["access-control-allow-headers"] == "authorization, content-type"
        assert "access-control-allow-credentials" not in good.headers
        r = await c.post("/v1/chat/completions", json={},
                         headers={"origin": allowed, "x-api-key": KEY})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == allowed
        r = await c.post("/v1/chat/completions", json={},
                         headers={"origin": "http://evil.example", "x-api-key": KEY})
        assert r.status_code == 403
        assert "access-control-allow-origin" not in r.headers


async def test_no_cors_by_default_but_same_origin_passes(tmp_path: Path) -> None:
    app = make_app(make_settings(tmp_path), Probe())
    async with client(app) as c:
        r = await c.options("/v1/chat/completions", headers={
            "origin": "http://localhost:3000", "access-control-request-method": "POST"})
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        r = await c.post("/v1/chat/completions", json={}, headers={"origin": BASE})
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


# --- size, flood, request id, access log -----------------------------------

async def test_ten_megabyte_body_is_413(tmp_path: Path) -> None:
    app = make_app(make_settings(tmp_path), Probe())
    async with client(app) as c:
        r = await c.post("/v1/chat/completions", content=b"x" * (10 * 1024 * 1024))
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "request_too_large"
        r = await c.post("/v1/messages", content=b"x" * (10 * 1024 * 1024))
        assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"


async def test_flood_beyond_bound_is_503_and_health_answers(tmp_path: Path) -> None:
    probe = Probe()
    settings = make_settings(tmp_path, max_queue=2, max_batch=1)
    app = make_app(settings, probe)
    async with client(app) as c:
        held = [asyncio.create_task(c.get("/slow")) for _ in range(3)]
        while probe.entered < 3:
            await asyncio.sleep(0.001)
        over = await c.get("/slow")
        assert over.status_code == 503
        assert over.headers["retry-after"] == "1"
        assert over.json()["error"]["code"] == "overloaded"
        assert (await c.get("/health")).status_code == 200
        probe.release.set()
        assert [(await t).status_code for t in held] == [200, 200, 200]
        assert (await c.get("/slow")).status_code == 200  # slots returned


async def test_request_id_on_every_response(tmp_path: Path) -> None:
    app = make_app(make_settings(tmp_path, api_key=KEY), Probe())
    async with client(app) as c:
        for r in (await c.get("/health"), await c.get("/nope"), await c.get("/metrics"),
                  await c.get("/stream", headers={"x-api-key": KEY})):
            assert r.headers["request-id"].startswith("req_")
        r = await c.get("/health", headers={"x-request-id": "client-abc.1"})
        assert r.headers["request-id"] == "client-abc.1"
        r = await c.get("/health", headers={"x-request-id": "bad id\twith spaces"})
        assert r.headers["request-id"].startswith("req_")
        s = await c.get("/stream", headers={"x-api-key": KEY})
        assert s.text == "data: 0\n\ndata: 1\n\ndata: 2\n\n"


async def test_access_log_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    app = make_app(make_settings(tmp_path), Probe())
    with caplog.at_level(logging.INFO, logger="frink_mlx.access"):
        async with client(app) as c:
            await c.post("/v1/chat/completions", json={}, headers={"x-request-id": "abc"})
            await c.get("/nope")
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "frink_mlx.access"]
    assert lines[0] == {
        "id": "abc", "method": "POST", "route": "/v1/chat/completions",
        "path": "/v1/chat/completions", "status": 200, "model": "tiny", "generation": 3,
        "prompt_tokens": 5, "completion_tokens": 4, "cached_tokens": None, "ttft_ms": 10.0,
        "duration_ms": lines[0]["duration_ms"]}
    assert lines[1]["route"] == "<unmatched>" and lines[1]["status"] == 404
    assert lines[1]["model"] is None


header_text = st.text(alphabet=st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)


@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(host=header_text, origin=st.none() | header_text, auth=st.none() | header_text,
       api_key=st.none() | header_text, request_id=st.none() | header_text,
       length=st.none() | header_text, method=st.sampled_from(["GET", "POST", "OPTIONS"]),
       path=st.sampled_from(["/health", "/v1/messages", "/completion", "/nope", "/metrics"]))
def test_gate_headers_never_500(tmp_path: Path, host: str, origin: str | None, auth: str | None,
                                api_key: str | None, request_id: str | None, length: str | None,
                                method: str, path: str) -> None:
    """Any printable header values: an answer with a request id, never a 5xx but 503."""
    app = make_app(make_settings(tmp_path, api_key=KEY, cors_origins=("http://ok.example",),
                                 allowed_hosts=("mybox",)), Probe())
    headers = {"host": host, "access-control-request-method": "POST"}
    for name, value in (("origin", origin), ("authorization", auth), ("x-api-key", api_key),
                        ("x-request-id", request_id), ("content-length", length)):
        if value is not None:
            headers[name] = value

    async def go() -> httpx.Response:
        async with client(app) as c:
            return await c.request(method, path, headers=headers)
    r = anyio.run(go)
    assert r.status_code < 500, (r.status_code, r.text)
    assert r.headers["request-id"]
    if r.status_code >= 400 and r.status_code != 404:
        assert "error" in r.json()
