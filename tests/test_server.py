"""`frink-mlx serve` as a process: one JSON ready line, real answers, drain on SIGTERM, exit 0."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from daemon_support import write_registry

ROOT = Path(__file__).resolve().parents[1]


def test_serve_ready_line_and_graceful_drain(tmp_path):
    from conftest import make_tiny_llama

    reg = write_registry(tmp_path, make_tiny_llama(tmp_path / "a", seed=0),
                         make_tiny_llama(tmp_path / "b", seed=1))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRINK_MLX_LOG_LEVEL": "warning",
           "FRINK_MLX_DRAIN_TIMEOUT_S": "30"}
    proc = subprocess.Popen([sys.executable, "-m", "frink_mlx.cli", "serve", "--port", "0",
                             "--models", str(reg)], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    try:
        ready = json.loads(proc.stdout.readline())
        assert ready["event"] == "ready" and ready["pid"] == proc.pid
        assert ready["model"] == "tiny-a" and ready["url"].startswith("http://127.0.0.1:")
        assert ready["version"]
        url = ready["url"]
        assert httpx.get(url + "/health", timeout=10).json()["state"] == "ready"

        body = {"model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 400, "temperature": 0, "stream": True, "ignore_eos": True,
                "stream_options": {"include_usage": True}}
        usage: list[dict] = []
        started = threading.Event()

        def stream() -> None:
            with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=120) as r:
                for line in r.iter_lines():
                    started.set()
                    if line.startswith("data: {") and '"usage"' in line:
                        usage.append(json.loads(line[6:])["usage"])

        t = threading.Thread(target=stream)
        t.start()
        assert started.wait(60)
        proc.send_signal(signal.SIGTERM)        # in-flight stream must finish (drain)
        t.join(120)
        assert usage and usage[0]["completion_tokens"] == 400
        assert proc.wait(60) == 0
        assert proc.stdout.read() == ""          # exactly one line on stdout
    finally:
        if proc.poll() is None:
            proc.kill()


def test_serve_exits_2_without_a_ready_line_when_the_default_model_fails(tmp_path):
    reg = tmp_path / "models.toml"
    reg.write_text(f'default = "gone"\n[models.gone]\nsource = "{tmp_path / "missing"}"\n')
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FRINK_MLX_LOG_LEVEL": "warning"}
    proc = subprocess.run([sys.executable, "-m", "frink_mlx.cli", "serve", "--port", "0",
                           "--models", str(reg)], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "did not start" in proc.stderr
