"""/metrics parses with prometheus_client's own parser and moves with traffic."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from frink_mlx import metrics as metrics_mod
from frink_mlx.core.offload import Offload
from frink_mlx.engine.types import EngineStats
from frink_mlx.http.access import note_generation
from frink_mlx.http.security import build_middleware
from frink_mlx.metrics import Metrics
from frink_mlx.settings import Settings

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def generate(request: Request) -> JSONResponse:
    """Stands in for a generating endpoint: 10 ms to the first token, 20 ms more to finish."""
    await request.body()
    await asyncio.sleep(0.03)
    note_generation(request, model="tiny", generation=1, prompt_tokens=5, completion_tokens=4,
                    ttft_s=0.01)
    return JSONResponse({"ok": True})


def make_app(settings: Settings) -> Starlette:
    routes = [Route("/v1/chat/completions", generate, methods=["POST"]), *metrics_mod.routes]
    app = Starlette(routes=routes, middleware=build_middleware(settings))
    app.state.frink = SimpleNamespace(config=settings.frontend_config(), offload=Offload())
    app.state.metrics = Metrics()
    return app


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: str, name: str, **labels: str) -> float:
    return samples(text).get((name, tuple(sorted(labels.items()))), 0.0)


async def test_counters_move_with_requests(tmp_path: Path) -> None:
    app = make_app(Settings(config_dir=str(tmp_path)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1:8177") as c:
        before = (await c.get("/metrics")).text
        assert value(before, "frink_requests_total", route="/v1/chat/completions",
                     method="POST", status="200") == 0
        for _ in range(3):
            await c.post("/v1/chat/completions", json={})
        await c.post("/v1/chat/completions", content=b"x" * (9 * 1024 * 1024))
        r = await c.get("/metrics")
        assert r.headers["content-type"].startswith("text/plain")
        after = r.text
    assert value(after, "frink_requests_total", route="/v1/chat/completions",
                 method="POST", status="200") == 3
    assert value(after, "frink_requests_total", route="/v1/chat/completions",
                 method="POST", status="413") == 1  # refused before routing, counted by route
    assert value(after, "frink_requests_rejected_total", reason="size") == 1
    assert value(after, "frink_prompt_tokens_total", model="tiny") == 15
    assert value(after, "frink_generation_tokens_total", model="tiny") == 12
    assert value(after, "frink_time_to_first_token_seconds_count", model="tiny") == 3
    assert value(after, "frink_time_per_output_token_seconds_count", model="tiny") == 3
    assert value(after, "frink_request_duration_seconds_count", route="/metrics") == 1


async def test_methods_outside_the_known_ones_are_one_other_series(tmp_path: Path) -> None:
    """Counted before the Host and key checks: made-up methods must not grow the series."""
    app = make_app(Settings(config_dir=str(tmp_path)))
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://127.0.0.1:8177") as c:
        for i in range(5):
            await c.request(f"BREW{i}", "/v1/chat/completions")
        await c.request("BREW0", "/nowhere", headers={"host": "evil.example"})
        text = (await c.get("/metrics")).text
    assert "BREW" not in text
    assert value(text, "frink_requests_total", route="/v1/chat/completions", method="other",
                 status="405") == 5
    assert value(text, "frink_requests_total", route="<unmatched>", method="other",
                 status="421") == 1


def test_engine_gauges_are_lazy_and_absent_without_engine() -> None:
    metrics = Metrics()
    assert "frink_queue_depth" not in metrics.render().decode()
    stats = EngineStats(num_blocks_total=64, num_blocks_used=10, num_blocks_cached=5,
                        block_size=16, num_running=2, num_waiting=7, prefix_hit_tokens_total=48)
    metrics.bind_stats(lambda: {"tiny": stats})
    text = metrics.render().decode()
    assert value(text, "frink_queue_depth", model="tiny") == 7
    assert value(text, "frink_running_sequences", model="tiny") == 2
    assert value(text, "frink_kv_blocks_capacity", model="tiny") == 64
    assert value(text, "frink_kv_blocks_used", model="tiny") == 10
    assert value(text, "frink_kv_blocks_cached", model="tiny") == 5
    assert value(text, "frink_prefix_cache_hit_tokens_total", model="tiny") == 48
    assert "frink_spec_draft_model_tokens" not in text  # no draft model: not reported
    stats.num_waiting = 1  # read at scrape time, not cached
    assert value(metrics.render().decode(), "frink_queue_depth", model="tiny") == 1

    def broken() -> dict[str, EngineStats]:
        raise RuntimeError("mid-swap")
    metrics.bind_stats(broken)
    assert "frink_queue_depth" not in metrics.render().decode()


def test_each_resident_model_reports_its_own_engine() -> None:
    metrics = Metrics()
    a = EngineStats(num_blocks_total=64, num_blocks_used=10, num_running=2)
    b = EngineStats(num_blocks_total=32, num_blocks_used=0, num_running=0,
                    extra={"draft_model_tokens_total": 9.0, "draft_model_accepted_total": 4.0})
    metrics.bind_stats(lambda: {"chat": a, "fim": b})
    text = metrics.render().decode()
    assert value(text, "frink_kv_blocks_used", model="chat") == 10
    assert value(text, "frink_kv_blocks_used", model="fim") == 0
    assert value(text, "frink_kv_blocks_capacity", model="fim") == 32
    assert value(text, "frink_running_sequences", model="chat") == 2
    assert value(text, "frink_spec_draft_model_tokens_total", model="fim") == 9
    assert 'frink_spec_draft_model_tokens_total{model="chat"}' not in text


def test_model_load_and_registries_are_private() -> None:
    a, b = Metrics(), Metrics()
    a.observe_model_load("smollm2", generation=4, load_time_s=1.25)
    text = a.render().decode()
    assert value(text, "frink_model_generation") == 4
    assert value(text, "frink_model_load_seconds", model="smollm2") == 1.25
    assert value(text, "frink_model_loads_total", model="smollm2") == 1
    assert value(b.render().decode(), "frink_model_loads_total", model="smollm2") == 0
