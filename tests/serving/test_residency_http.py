"""Several models resident in one daemon, through real HTTP and real tiny checkpoints.

Three random-weight llamas (different seeds) stay resident; requests interleaved
across them answer exactly what each model answers alone (greedy); a fourth that
does not fit the budget evicts the least recently used idle one, never one with a
live stream; /admin/models and /health show each model's residency and a memory
sum equal to what each generation reports.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterator

import httpx
import pytest
from daemon_support import generation_factory, start_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

POOL_BYTES = 256 * 1024
EXTRA = '\n[models.tiny-c]\nsource = "{c}"\n[models.tiny-d]\nsource = "{d}"\n'
PROMPT = [{"role": "user", "content": "Say something about the sea."}]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("resident")
    a, b, c, d = (make_tiny_llama(root / n, seed=i) for i, n in enumerate("abcd"))
    weights = (a / "model.safetensors").stat().st_size
    # three models (weights + a pool capped at POOL_BYTES) fit; a fourth's estimate does not
    budget = 3 * (weights + POOL_BYTES) + weights // 2
    path = write_registry(root, a, b, EXTRA.format(c=c, d=d))
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(root / "cache"), kv_budget_bytes=budget,
                             memory_headroom_fraction=0.0, max_kv_pool_bytes=POOL_BYTES,
                             evict_wait_s=1.0)
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    server = start_server(app)
    yield server
    server.stop()


def chat(live: Any, model: str, max_tokens: int = 24) -> str:
    r = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
        "model": model, "messages": PROMPT, "temperature": 0, "max_tokens": max_tokens,
        "ignore_eos": True})
    assert r.status_code == 200, r.text
    assert r.json()["model"] == model
    return str(r.json()["choices"][0]["message"]["content"])


def admin(live: Any) -> dict[str, Any]:
    return dict(httpx.get(live.url + "/admin/models", timeout=10).json())


def resident(live: Any) -> list[str]:
    return [m["name"] for m in admin(live)["models"] if m["residency"]["state"] == "resident"]


def unload(live: Any, model: str) -> None:
    r = httpx.post(live.url + "/admin/models/unload", json={"model": model}, timeout=60)
    assert r.status_code == 200, r.text


def test_three_resident_models_interleaved_answer_as_alone(live: Any) -> None:
    solo = {}
    for name in ("tiny-a", "tiny-b", "tiny-c"):  # each alone in the daemon
        for other in resident(live):
            unload(live, other)
        solo[name] = chat(live, name)
        assert resident(live) == [name]
    for name in ("tiny-a", "tiny-b"):
        chat(live, name)
    assert sorted(resident(live)) == ["tiny-a", "tiny-b", "tiny-c"]
    order = ["tiny-a", "tiny-b", "tiny-c"] * 3
    with ThreadPoolExecutor(len(order)) as pool:
        answers = list(pool.map(chat, [live] * len(order), order))
    assert answers == [solo[name] for name in order]
    info = admin(live)
    states = {m["name"]: m["residency"] for m in info["models"]}
    assert all(states[n]["bytes"] > 0 and states[n]["kv_blocks"] > 0 for n in solo)
    assert states["tiny-d"]["state"] == "available" and states["tiny-d"]["bytes"] is None
    held = sum(states[n]["bytes"] for n in solo)
    assert info["memory"]["held_bytes"] == held
    from frink_mlx.serving.residency import measure_nbytes

    assert held == sum(measure_nbytes(g) for g in live.state.hub.resident)
    health = httpx.get(live.url + "/health", timeout=10).json()
    assert health["models"]["tiny-a"]["state"] == "resident"
    assert health["memory"]["held_bytes"] == held
    listed = httpx.get(live.url + "/v1/models", timeout=10).json()["data"]
    assert {m["id"]: m["residency"]["state"] for m in listed}["tiny-c"] == "resident"
    metrics = httpx.get(live.url + "/metrics", timeout=10).text  # one engine sample per model
    for name in solo:
        blocks = states[name]["kv_blocks"]
        assert f'frink_kv_blocks_capacity{{model="{name}"}} {float(blocks)}' in metrics
        assert f'frink_running_sequences{{model="{name}"}} 0.0' in metrics
        assert f'frink_sliced_prefill_turns_total{{model="{name}"}} ' in metrics


def test_a_fourth_model_evicts_the_lru_idle_one_never_a_live_stream(live: Any) -> None:
    for name in ("tiny-a", "tiny-b", "tiny-c"):
        chat(live, name)  # all three resident; LRU order a, b, c
    long_solo = chat(live, "tiny-a", max_tokens=200)  # a is now the most recent...
    chat(live, "tiny-b")
    chat(live, "tiny-c")                              # ...and the LRU again: a, b, c
    parts: list[str] = []
    with httpx.stream("POST", live.url + "/v1/chat/completions", timeout=120, json={
            "model": "tiny-a", "messages": PROMPT, "temperature": 0, "max_tokens": 200,
            "ignore_eos": True, "stream": True}) as r:
        lines = r.iter_lines()
        for line in lines:
            if line.startswith("data: {"):
                parts.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
            if len(parts) > 3:
                break
        chat(live, "tiny-d")  # needs room: a is LRU but streaming, so b goes
        assert sorted(resident(live)) == ["tiny-a", "tiny-c", "tiny-d"]
        for line in lines:
            if line.startswith("data: {"):
                parts.append(json.loads(line[6:])["choices"][0]["delta"].get("content") or "")
    assert "".join(parts) == long_solo


def test_unload_by_name_keeps_the_others_and_the_hub_open(live: Any) -> None:
    chat(live, "tiny-a")
    chat(live, "tiny-c")
    unload(live, "tiny-c")
    assert "tiny-c" not in resident(live) and "tiny-a" in resident(live)
    assert chat(live, "tiny-a")  # still served, no reload needed
    r = httpx.post(live.url + "/admin/models/unload", json={"model": "nope"}, timeout=10)
    assert r.status_code == 404 and "nope" in r.text
