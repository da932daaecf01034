"""GET /admin/status and the page's shell, on the real app with a tiny model loaded.

What is pinned: the status JSON reports what /health and the engine report
(same KV numbers, same model), each registry entry's state with its reason
(resident, available, loading with elapsed seconds, unavailable: missing
source or a failed load), the counters after a real chat, and the access ring
(work recorded, the page's own polling left out). The shell is public and the
data keyed; assets outside the allow-list are 404s in the OpenAI envelope.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
from daemon_support import generation_factory, write_registry
from starlette.testclient import TestClient

from frink_mlx.adapters.page import CSP
from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

KEY = "sk-page-test"
BASE = "http://127.0.0.1:8177"
# gone: its source is missing (unavailable from the start; a load is refused, never tried);
# broken: its files are there but cannot load (unavailable once a load failed).
BROKEN = ('\n[models.gone]\nsource = "/nonexistent/checkpoint"\n'
          '\n[models.broken]\nsource = "{broken}"\n')


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("status")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no_such_architecture"}')
    return write_registry(root, a, b, extra=BROKEN.format(broken=broken))


def _settings(registry_file: Path, tmp: Path, **kw: Any) -> Settings:
    return Settings.load(models_path=str(registry_file), min_generation_s=0.0, access_log=False,
                         cache_dir=str(tmp / "cache"), config_dir=str(tmp / "cfg"), **kw)


@pytest.fixture(scope="module")
def client(registry_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = _settings(registry_file, tmp_path_factory.mktemp("s"))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    with TestClient(app, base_url=BASE) as c:
        yield c


def _states(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in body["models"]}


def test_status_matches_health_and_names_every_entry(client: TestClient) -> None:
    health = client.get("/health").json()
    body = client.get("/admin/status").json()
    assert body["model"] == health["model"] == "tiny-a"
    assert body["generation"] == health["generation"]
    assert body["kv"] == health["kv"] and body["kv"]["blocks_total"] > 0
    assert body["context_ceiling"] == health["context_ceiling"]
    assert body["running"] == health["running"] and body["queued"] == health["queue_depth"]
    assert body["version"] == health["version"] and body["uptime_s"] > 0
    assert body["backend"]["name"] in ("CPU", "Metal", "CUDA")
    memory = body["memory"]
    assert memory["budget_bytes"] > memory["weights_bytes"] > 0
    assert memory["kv_pool_bytes"] > 0 and memory["budget_source"] in ("ram", "metal")
    assert memory["held_bytes"] is None or memory["held_bytes"] >= memory["weights_bytes"]
    states = _states(body)
    assert states["tiny-a"]["state"] == "resident" and states["tiny-a"]["default"] is True
    assert states["tiny-a"]["aliases"] == ["alpha", "gpt-4o-mini"]
    assert states["tiny-b"]["state"] == "available" and states["tiny-b"]["reason"] is None
    assert states["gone"]["state"] == "unavailable"
    assert "source not found" in states["gone"]["reason"]


def test_counters_and_ring_after_a_chat(client: TestClient) -> None:
    before = client.get("/admin/status").json()
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    for _ in range(2):  # the second prompt hits the prefix cache
        r = client.post("/v1/chat/completions", json={
            "model": "tiny-a", "messages": messages, "max_tokens": 5, "temperature": 0})
        assert r.status_code == 200
    client.get("/health")
    client.get("/ui/main.js")
    body = client.get("/admin/status").json()
    counters = body["counters"]
    assert counters["generated_tokens_total"] >= before["counters"]["generated_tokens_total"] + 2
    assert counters["prefix_hit_tokens_total"] > 0
    assert counters["prefix_hit_rate"] == pytest.approx(
        counters["prefix_hit_tokens_total"] / counters["prompt_tokens_total"], abs=1e-4)
    routes = [r["route"] for r in body["recent"]]
    assert "/v1/chat/completions" in routes
    assert not {"/health", "/admin/status", "/ui/{name}", "/"} & set(routes)  # quiet routes
    last = body["recent"][-1]
    assert last["route"] == "/v1/chat/completions" and last["status"] == 200
    assert last["model"] == "tiny-a" and last["completion_tokens"] == 5
    assert last["cached_tokens"] > 0 and last["ttft_ms"] > 0 and last["duration_ms"] > 0
    seqs = [r["seq"] for r in body["recent"]]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_loading_state_reports_elapsed_seconds(registry_file: Path, tmp_path: Path) -> None:
    release = threading.Event()
    real = generation_factory()

    def held_factory(spec: Any, config: Any, number: int, gate: Any, backend: Any) -> Any:
        release.wait(30)  # the real load, started only once the test has looked
        return real(spec, config, number, gate, backend)

    settings = _settings(registry_file, tmp_path)
    app = create_app(settings, registry=load_registry(settings), factory=held_factory,
                     load_default=False)
    with TestClient(app, base_url=BASE) as c:
        assert c.post("/admin/models/load", json={"model": "tiny-b"}).status_code == 202
        time.sleep(0.3)
        body = c.get("/admin/status").json()
        assert body["state"] == "loading" and body["kv"] is None and body["counters"] is None
        tiny_b = _states(body)["tiny-b"]
        assert tiny_b["state"] == "loading" and tiny_b["loading_s"] >= 0.2
        release.set()
        deadline = time.monotonic() + 30
        while c.get("/admin/status").json()["state"] != "ready":
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert _states(c.get("/admin/status").json())["tiny-b"]["state"] == "resident"


def test_failed_load_is_unavailable_with_its_reason(client: TestClient) -> None:
    r = client.post("/admin/models/load", json={"model": "gone", "wait": True})
    assert r.status_code == 404 and "source not found" in r.json()["error"]["message"]
    r = client.post("/admin/models/load", json={"model": "broken", "wait": True})
    assert r.status_code >= 400
    states = _states(client.get("/admin/status").json())
    assert states["broken"]["state"] == "unavailable"
    assert states["broken"]["reason"].startswith("last load failed:")
    assert states["tiny-a"]["state"] == "resident"  # the old model stays


@pytest.fixture
def keyed(registry_file: Path, tmp_path: Path) -> Iterator[TestClient]:
    settings = _settings(registry_file, tmp_path, api_key=KEY)
    app = create_app(settings, registry=load_registry(settings), load_default=False)
    with TestClient(app, base_url=BASE) as c:
        yield c


def test_shell_is_public_and_data_needs_the_key(keyed: TestClient) -> None:
    page = keyed.get("/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CSP
    assert page.headers["x-frame-options"] == "DENY"
    assert page.headers["x-content-type-options"] == "nosniff"
    assert '<script type="module" src="/ui/main.js">' in page.text
    script = keyed.get("/ui/main.js")
    assert script.status_code == 200 and script.headers["content-type"].startswith("text/javascript")
    assert keyed.get("/ui/main.js", headers={"if-none-match": script.headers["etag"]}).status_code == 304
    r = keyed.get("/admin/status")
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    r = keyed.get("/admin/status", headers={"authorization": f"Bearer {KEY}"})
    assert r.status_code == 200 and r.json()["model"] is None and r.json()["kv"] is None


def test_unknown_assets_are_404_in_the_openai_envelope(keyed: TestClient) -> None:
    for path in ("/ui/nope.js", "/ui/index.html", "/ui/.hidden.js", "/ui/app.py",
                 "/ui/" + "a" * 80 + ".js"):
        r = keyed.get(path)
        assert r.status_code == 404, path
        assert r.json()["error"]["param"] == "name"
    assert keyed.get("/ui/..%2F..%2Fapp.py").status_code == 404  # no route matches a slash


def test_shell_obeys_the_host_and_origin_gates(keyed: TestClient) -> None:
    assert keyed.get("/", headers={"host": "rebind.evil.example"}).status_code == 421
    assert keyed.get("/ui/main.js", headers={"origin": "http://evil.example"}).status_code == 403


def test_idle_unloaded_model_is_available_with_a_reason(registry_file: Path, tmp_path: Path) -> None:
    settings = _settings(registry_file, tmp_path, keep_alive_s=0.4)
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    with TestClient(app, base_url=BASE) as c:
        deadline = time.monotonic() + 30
        while _states(body := c.get("/admin/status").json())["tiny-a"]["state"] != "available":
            assert time.monotonic() < deadline  # resident, then draining while it is freed
            time.sleep(0.05)
        assert body["state"] == "idle"
        assert "unloaded after idling" in _states(body)["tiny-a"]["reason"]
        assert body["model"] is None and body["kv"] is None and body["memory"]["budget_bytes"] is None


def test_status_answers_when_the_in_flight_bound_is_full(registry_file: Path, tmp_path: Path) -> None:
    import socket

    import httpx
    from daemon_support import start_server

    settings = _settings(registry_file, tmp_path, max_batch=1, max_queue=0)
    live = start_server(create_app(settings, registry=load_registry(settings), load_default=False))
    host, port = live.url.removeprefix("http://").split(":")
    try:
        with socket.create_connection((host, int(port))) as held:  # the one slot: a body never sent
            held.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                         b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n")
            deadline = time.monotonic() + 10
            while httpx.get(live.url + "/v1/models", timeout=10).status_code != 503:
                assert time.monotonic() < deadline
                time.sleep(0.02)
            status = httpx.get(live.url + "/admin/status", timeout=10)
            assert status.status_code == 200 and status.json()["state"] == "unavailable"
            assert httpx.get(live.url + "/", timeout=10).status_code == 200
            assert httpx.get(live.url + "/ui/app.css", timeout=10).status_code == 200
    finally:
        live.stop()
