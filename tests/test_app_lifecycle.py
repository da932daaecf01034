"""Generations under load, through real HTTP and the real engine: swap mid-stream,
unload -> 503, admin load conflicts and failures, concurrency, client disconnects."""

from __future__ import annotations

import concurrent.futures
import json
import time

import httpx
import pytest
from daemon_support import generation_factory, start_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

PROMPT = [{"role": "user", "content": "Hello there"}]
# broken: its files are there but cannot load (a failed load: 500, last_error);
# gone: its source is missing (unavailable: 404 with the reason, no load attempted).
BROKEN = '\n[models.broken]\nsource = "{broken}"\n[models.gone]\nsource = "{missing}"\n'


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("lifecycle")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    broken = root / "broken"
    broken.mkdir()
    (broken / "config.json").write_text('{"model_type": "no_such_architecture"}')
    path = write_registry(root, a, b, BROKEN.format(broken=broken, missing=root / "missing"))
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(root / "cache"))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    server = start_server(app)
    yield server
    server.stop()


def body(model: str, **kw) -> dict:
    return {"model": model, "messages": PROMPT, "temperature": 0, "max_tokens": 24, **kw}


def chat_text(live, model: str, **kw) -> str:
    r = httpx.post(live.url + "/v1/chat/completions", json=body(model, **kw), timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]["content"]


def wait_for(cond, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def ensure_active(live, name: str) -> None:
    r = httpx.post(live.url + "/admin/models/load", json={"model": name, "wait": True}, timeout=120)
    assert r.status_code == 200, r.text


def test_swap_mid_stream_never_splices(live):
    ensure_active(live, "tiny-a")
    long = dict(max_tokens=300, ignore_eos=True)
    old_text = chat_text(live, "tiny-a", **long)
    hub = live.state.hub
    old_gen = hub.current
    parts = []
    with httpx.stream("POST", live.url + "/v1/chat/completions",
                      json=body("tiny-a", stream=True, **long), timeout=120) as r:
        lines = r.iter_lines()
        for line in lines:  # read a little of the old model's answer
            if line.startswith("data: {"):
                parts.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
            if len(parts) > 3:
                break
        new_text = chat_text(live, "beta")             # just-in-time swap to tiny-b
        assert hub.current.spec.name == "tiny-b" and hub.current.number > old_gen.number
        assert old_gen in hub.retired                   # still leased by the stream
        assert new_text == chat_text(live, "tiny-b")
        for line in lines:
            if line.startswith("data: {"):
                for c in json.loads(line[6:])["choices"]:
                    parts.append(c["delta"].get("content") or "")
    assert "".join(parts) == old_text
    wait_for(lambda: old_gen not in hub.retired)        # freed after its last lease


def test_unload_answers_503_with_retry_after_until_load(live):
    ensure_active(live, "tiny-a")
    r = httpx.post(live.url + "/admin/models/unload", timeout=30)
    assert r.status_code == 200 and r.json()["model"] == "tiny-a"
    for model in ("tiny-a", "default"):
        r = httpx.post(live.url + "/v1/chat/completions", json=body(model), timeout=30)
        assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1
        assert r.json()["error"]["code"] == "model_not_loaded"
    h = httpx.get(live.url + "/health", timeout=10)
    assert h.status_code == 503 and h.json()["state"] == "unavailable"
    ensure_active(live, "tiny-a")
    assert httpx.get(live.url + "/health", timeout=10).json()["state"] == "ready"


def test_admin_load_conflict_and_failure_reporting(live, monkeypatch):
    ensure_active(live, "tiny-a")
    hub = live.state.hub
    real = hub.factory

    def slow_factory(*args):  # keep the first load in flight while the second arrives
        time.sleep(0.5)
        return real(*args)

    monkeypatch.setattr(hub, "factory", slow_factory)
    r1 = httpx.post(live.url + "/admin/models/load", json={"model": "tiny-b"}, timeout=30)
    r2 = httpx.post(live.url + "/admin/models/load", json={"model": "tiny-a"}, timeout=30)
    assert r1.status_code == 202 and r2.status_code == 409
    wait_for(lambda: live.state.hub.loading is None)
    r = httpx.post(live.url + "/admin/models/load", json={"model": "broken", "wait": True},
                   timeout=60)
    assert r.status_code == 500
    info = httpx.get(live.url + "/admin/models", timeout=10).json()
    assert info["active"]["model"] == "tiny-b"             # the old model keeps serving
    assert info["last_error"]["model"] == "broken"
    assert chat_text(live, "default")
    r = httpx.post(live.url + "/admin/models/load", json={"model": "nope"}, timeout=10)
    assert r.status_code == 404
    for path, payload in (("/admin/models/load", {"model": "gone", "wait": True}),
                          ("/v1/chat/completions", body("gone"))):
        r = httpx.post(live.url + path, json=payload, timeout=10)
        assert r.status_code == 404, r.text
        error = r.json()["error"]
        assert error["code"] == "model_unavailable" and error["param"] == "model"
        assert f"source not found: {live.state.registry.entries['gone'].source}" in error["message"]
    assert httpx.get(live.url + "/admin/models", timeout=10).json()["active"]["model"] == "tiny-b"


def test_concurrent_requests_all_answer_correctly(live):
    ensure_active(live, "tiny-a")
    expected = chat_text(live, "tiny-a")
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: chat_text(live, "tiny-a"), range(6)))
    assert results == [expected] * 6


def _engine_idle(live) -> bool:
    stats = live.state.engine_stats()
    return stats.num_running == 0 and stats.num_waiting == 0


def test_stream_disconnect_stops_the_decode(live):
    ensure_active(live, "tiny-a")
    engine = live.state.hub.current.engine
    with httpx.stream("POST", live.url + "/v1/chat/completions",
                      json=body("tiny-a", stream=True, max_tokens=1500, ignore_eos=True),
                      timeout=60) as r:
        for n, _ in enumerate(r.iter_lines()):
            if n > 4:
                break
    wait_for(lambda: _engine_idle(live), 5.0)
    steps = engine.stats().steps_total
    time.sleep(0.3)
    assert engine.stats().steps_total == steps   # nothing is decoding any more
    assert live.state.hub.num_leases() == 0


def test_non_stream_disconnect_stops_the_decode(live):
    ensure_active(live, "tiny-a")
    engine = live.state.hub.current.engine
    before = engine.stats().generated_tokens_total
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live.url + "/v1/chat/completions",
                   json=body("tiny-a", max_tokens=1800, ignore_eos=True), timeout=0.5)
    wait_for(lambda: _engine_idle(live), 5.0)
    assert engine.stats().generated_tokens_total - before < 1800
    assert live.state.hub.num_leases() == 0
