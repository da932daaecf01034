"""A daemon load that downloads from the Hub shows its progress in /health and
/admin/models (a fake Hub on a free port trickles the bytes), then serves the model."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
from daemon_support import generation_factory, start_server

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

sys.path.insert(0, str(Path(__file__).resolve().parent / "models"))
from fake_hub import FakeHub, checkpoint_files


def test_hub_download_progress_in_health_and_admin(tmp_path: Path, tiny_llama_dir: Path) -> None:
    hub = FakeHub(chunk_delay_s=0.15).start()
    hub.add_repo("org/tiny", checkpoint_files(tiny_llama_dir))
    models = tmp_path / "models.toml"
    models.write_text(f'default = "local"\n[models.local]\nsource = "{tiny_llama_dir}"\n'
                      '[models.hf]\nsource = "org/tiny"\n')
    settings = Settings.load(models_path=str(models), min_generation_s=0.0, access_log=False,
                             cache_dir=str(tmp_path / "cache"), hf_endpoint=hub.url,
                             hf_cache_dir=str(tmp_path / "hf"), hf_offline=False)
    server = start_server(create_app(settings, registry=load_registry(settings),
                                     factory=generation_factory()))
    try:
        status = httpx.get(server.url + "/admin/status", timeout=10).json()
        hf = next(m for m in status["models"] if m["name"] == "hf")
        assert hf["state"] == "available", hf  # not cached yet, but a load would download it
        r = httpx.post(server.url + "/admin/models/load", json={"model": "hf"}, timeout=30)
        assert r.status_code == 202, r.text
        seen, admin_seen = [], []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            health = httpx.get(server.url + "/health", timeout=10).json()
            if health["model"] == "hf":
                break
            if health["progress"] is not None:
                seen.append(health["progress"])
            admin = httpx.get(server.url + "/admin/models", timeout=10).json()
            if admin["progress"] is not None:
                assert admin["loading"] == "hf"
                admin_seen.append(admin["progress"])
            hf = next(m for m in httpx.get(server.url + "/admin/status", timeout=10).json()["models"]
                      if m["name"] == "hf")
            if hf["state"] == "loading" and hf["progress"] is not None:
                admin_seen.append(hf["progress"])
            time.sleep(0.05)
        assert health["model"] == "hf" and health["progress"] is None
        assert any(p["phase"] == "download" for p in admin_seen)
        downloads = [p for p in seen if p["phase"] == "download"]
        assert downloads and downloads[0]["detail"] == "org/tiny"
        total = sum(len(b) for b in checkpoint_files(tiny_llama_dir).values())
        assert any(p["total_bytes"] == total and 0 < p["done_bytes"] < total for p in downloads)
        assert all(p["fraction"] is None or 0 <= p["fraction"] <= 1 for p in downloads)
        assert httpx.get(server.url + "/admin/models", timeout=10).json()["progress"] is None
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60, json={
            "model": "hf", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert r.status_code == 200, r.text
    finally:
        server.stop()
        hub.stop()
