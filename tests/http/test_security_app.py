"""The security gates on the real app (create_app), through its real routes.

No model is loaded here (load_default=False): every gate answers before the
hub is asked for anything.
"""

from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Iterator

import anyio
import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from frink_mlx.app import create_app
from frink_mlx.registry import ModelSpec, Registry
from frink_mlx.settings import Settings

KEY = "sk-app-test"
BASE = "http://127.0.0.1:8177"


def tiny_registry(model_dir: Path) -> Registry:
    spec = ModelSpec(name="tiny", source=str(model_dir))
    return Registry(entries={"tiny": spec}, default="tiny", path="<test>")


@pytest.fixture
def app_client(tmp_path: Path, tiny_llama_dir: Path) -> Iterator[TestClient]:
    settings = Settings(config_dir=str(tmp_path), api_key=KEY,
                        cors_origins=("http://localhost:3000",))
    app = create_app(settings, registry=tiny_registry(tiny_llama_dir), load_default=False)
    with TestClient(app, base_url=BASE) as client:
        yield client


def test_missing_and_wrong_key_in_each_envelope(app_client: TestClient) -> None:
    for headers in ({}, {"x-api-key": "wrong"}, {"authorization": "Bearer wrong"}):
        r = app_client.post("/v1/messages", json={}, headers=headers)
        assert r.status_code == 401
        assert r.json() == {"type": "error", "error": {
            "type": "authentication_error", "message": r.json()["error"]["message"]}}
        r = app_client.post("/v1/chat/completions", json={}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        r = app_client.post("/completion", json={}, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
        assert r.headers["request-id"].startswith("req_")


def test_key_admits_and_gates_admin_and_metrics(app_client: TestClient) -> None:
    assert app_client.get("/metrics").status_code == 401
    assert app_client.get("/admin/models").status_code == 401
    r = app_client.post("/v1/messages", json={"model": "tiny"}, headers={"x-api-key": KEY})
    assert r.status_code == 400  # past the gate: a real validation error, in Anthropic's shape
    assert r.json()["type"] == "error"
    m = app_client.get("/metrics", headers={"authorization": f"Bearer {KEY}"})
    assert m.status_code == 200
    names = {f.name for f in text_string_to_metric_families(m.text)}
    assert {"frink_requests", "frink_requests_rejected"} <= names


def test_foreign_host_and_origin(app_client: TestClient) -> None:
    r = app_client.post("/v1/messages", json={}, headers={"host": "rebind.evil.example:8177",
                                                          "x-api-key": KEY})
    assert r.status_code == 421
    r = app_client.options("/v1/messages", headers={
        "origin": "http://evil.example", "access-control-request-method": "POST"})
    assert r.status_code == 403
    assert "access-control-allow-origin" not in r.headers
    r = app_client.options("/v1/messages", headers={
        "origin": "http://localhost:3000", "access-control-request-method": "POST",
        "access-control-request-headers": "x-api-key, content-type"})
    assert r.status_code == 204
    assert r.headers["access-control-allow-origin"] == "http://localhost:3000"


def test_ten_megabyte_body_is_413(app_client: TestClient) -> None:
    body = b"{" + b" " * (10 * 1024 * 1024) + b"}"
    r = app_client.post("/v1/messages", content=body, headers={"x-api-key": KEY})
    assert r.status_code == 413 and r.json()["error"]["type"] == "request_too_large"
    r = app_client.post("/v1/chat/completions", content=body, headers={"x-api-key": KEY})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_flood_beyond_bound_is_503_and_health_answers(tmp_path: Path,
                                                            tiny_llama_dir: Path) -> None:
    """Requests whose bodies never finish hold their slots (a slow client); one more is 503."""
    settings = Settings(config_dir=str(tmp_path), max_batch=1, max_queue=1)
    app = create_app(settings, registry=tiny_registry(tiny_llama_dir), load_default=False)
    release = anyio.Event()

    async def held_body() -> AsyncIterator[bytes]:
        yield b'{"model": "tiny", '
        await release.wait()
        yield b'"messages": []}'

    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        gauge = app.state.metrics.in_flight
        async with anyio.create_task_group() as tg:
            results: list[int] = []

            async def post_held() -> None:
                r = await c.post("/v1/chat/completions", content=held_body(),
                                 headers={"content-type": "application/json"})
                results.append(r.status_code)

            for _ in range(2):
                tg.start_soon(post_held)
            with anyio.fail_after(10):
                while gauge._value.get() < 2:
                    await anyio.sleep(0.005)
            over = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": []})
            assert over.status_code == 503
            assert over.headers["retry-after"] == "1"
            assert over.json()["error"]["code"] == "overloaded"
            health = await c.get("/health")  # answered by the route, not the bound
            assert health.json()["state"] == "unavailable" and "error" not in health.json()
            metrics = await c.get("/metrics")
            assert metrics.status_code == 200
            assert 'frink_requests_rejected_total{reason="overloaded"} 1.0' in metrics.text
            release.set()
        assert results == [400, 400]  # the held requests finish normally (empty messages)
        after = await c.post("/v1/chat/completions", json={"model": "tiny", "messages": []})
        assert after.status_code == 400  # slots returned: past the bound again


@pytest.mark.anyio
@pytest.mark.parametrize("path,shape", [("/v1/chat/completions", "openai"),
                                        ("/v1/messages", "anthropic")])
async def test_stalled_body_gets_408_and_frees_its_slot(tmp_path: Path, tiny_llama_dir: Path,
                                                        path: str, shape: str) -> None:
    settings = Settings(config_dir=str(tmp_path), body_timeout_s=0.2)
    app = create_app(settings, registry=tiny_registry(tiny_llama_dir), load_default=False)
    never = anyio.Event()

    async def stalled_body() -> AsyncIterator[bytes]:
        yield b'{"model": '
        await never.wait()
        yield b"}"

    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=BASE) as c:
        with anyio.fail_after(10):
            r = await c.post(path, content=stalled_body(),
                             headers={"content-type": "application/json"})
        assert r.status_code == 408
        if shape == "openai":
            assert r.json()["error"]["code"] == "request_timeout"
        else:
            assert r.json()["type"] == "error" and "stalled" in r.json()["error"]["message"]
        assert app.state.metrics.in_flight._value.get() == 0
