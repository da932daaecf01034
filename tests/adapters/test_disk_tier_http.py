"""The prefix cache's SSD tier through the real app (engine/kv/disk.py, serving/hub.py
rule 8): a restarted daemon on the same cache directory answers a long prompt from disk
with the same greedy output, says so in usage (`cached_tokens`, `disk_cached_tokens`),
/health, /metrics and /admin/status; a model unloaded and loaded again reads its blocks
back; a cache directory that cannot be written leaves the daemon serving, with one
warning and the tier off."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest
from daemon_support import generation_factory, write_registry
from starlette.testclient import TestClient

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

BASE = "http://127.0.0.1:8177"
LONG = " ".join(f"item {i} is a word about caches and blocks." for i in range(40))


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("disk")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    return write_registry(root, a, b)


def _app(registry_file: Path, cache: Path, **kw: Any) -> Any:
    settings = Settings.load(models_path=str(registry_file), min_generation_s=0.0,
                             access_log=False, cache_dir=str(cache), config_dir=str(cache / "cfg"),
                             fallback=False, **kw)
    return create_app(settings, registry=load_registry(settings), factory=generation_factory())


@pytest.fixture
def daemon(registry_file: Path, tmp_path: Path) -> Iterator[Any]:
    """`daemon()` starts an app on this test's cache directory; each is stopped at the end."""
    clients: list[TestClient] = []

    def start(**kw: Any) -> TestClient:
        client = TestClient(_app(registry_file, tmp_path, **kw), base_url=BASE)
        client.__enter__()
        clients.append(client)
        return client

    yield start
    for client in clients:
        client.__exit__(None, None, None)


def chat(client: TestClient, model: str = "tiny-a") -> dict[str, Any]:
    response = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": LONG}],
        "max_tokens": 8, "temperature": 0})
    assert response.status_code == 200, response.text
    return response.json()


def stop(client: TestClient) -> None:
    client.__exit__(None, None, None)  # the lifespan's end: engines flush, the tier closes


def test_a_restarted_daemon_answers_from_disk_with_the_same_output(daemon) -> None:
    first = daemon()
    cold = chat(first)
    assert cold["usage"]["prompt_tokens_details"] == {"cached_tokens": 0, "disk_cached_tokens": 0}
    stop(first)
    second = daemon()
    warm = chat(second)
    assert warm["choices"][0]["message"] == cold["choices"][0]["message"]
    details = warm["usage"]["prompt_tokens_details"]
    assert details["cached_tokens"] == details["disk_cached_tokens"] > 300
    health = second.get("/health").json()["kv_disk"]
    assert health["enabled"] is True and health["reads"] == 1 and health["hit_blocks"] > 75
    assert health["bytes"] > 0 and health["files"] >= health["hit_blocks"]
    metrics = second.get("/metrics").text
    assert f"frink_kv_disk_hit_blocks_total {float(health['hit_blocks'])}" in metrics
    assert "frink_kv_disk_bytes " in metrics and "frink_kv_disk_reads_total 1.0" in metrics
    assert 'frink_prefix_cache_disk_hit_tokens_total{model="tiny-a"}' in metrics
    status = second.get("/admin/status").json()
    assert status["kv_disk"]["hit_blocks"] == health["hit_blocks"]
    assert status["counters"]["disk_hit_tokens_total"] == details["disk_cached_tokens"]


def test_a_model_loaded_again_reads_its_blocks_back(daemon) -> None:
    client = daemon()
    cold = chat(client)
    assert client.post("/admin/models/unload", json={"model": "tiny-a"}).status_code == 200
    chat(client, "tiny-b")  # another model meanwhile: its own namespace
    again = chat(client)
    assert again["choices"][0]["message"] == cold["choices"][0]["message"]
    assert again["usage"]["prompt_tokens_details"]["disk_cached_tokens"] > 300


def test_the_tier_off_reports_no_disk_tokens(daemon) -> None:
    client = daemon(kv_disk_bytes=0)
    body = chat(client)
    assert body["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
    assert client.get("/health").json()["kv_disk"] is None
    assert "frink_kv_disk" not in client.get("/metrics").text


def test_an_unwritable_cache_directory_serves_with_one_warning(daemon, tmp_path: Path,
                                                               caplog) -> None:
    (tmp_path / "blocked").write_text("a file where the directory would be")
    client = daemon(kv_disk_dir=str(tmp_path / "blocked" / "kv"))
    bodies = [chat(client) for _ in range(2)]
    assert bodies[0]["choices"] == bodies[1]["choices"]
    warnings = [r for r in caplog.records if "KV disk tier off" in r.getMessage()]
    assert len(warnings) == 1
    health = client.get("/health").json()["kv_disk"]
    assert health["enabled"] is False and "NotADirectoryError" in health["error"]
    assert "frink_kv_disk_enabled 0.0" in client.get("/metrics").text
