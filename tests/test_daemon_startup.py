"""`frink-mlx serve` from the outside: start-up refusals, /health while loading, unavailable
registry entries, sampling defaults from the model, and max_tokens budgets (cli/serve.py rules
2-3, registry rules 5 and 7, loader rule 7, handles rule 3)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from daemon_support import ROOT, DaemonProcess, daemon_env, write_registry

GONE = '\n[models.gone]\nsource = "{missing}"\n'


def serve_refused(*args: str, **settings: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "frink_mlx.cli", "serve", *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=120,
                          env=daemon_env(log_level="info", **settings))


def test_a_busy_port_is_one_line_and_exit_2(tmp_path: Path, tiny_llama_dir: Path) -> None:
    registry = write_registry(tmp_path, tiny_llama_dir, tiny_llama_dir)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        done = serve_refused("--port", str(port), "--models", str(registry))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"frink-mlx: error: cannot listen on 127.0.0.1:{port}: the port is already in use "
        "(another frink-mlx? `frink-mlx service status` tells; pick another with --port N, "
        "or --port 0 for a free one)"]


@pytest.mark.parametrize("origin", ["null", "*"])
def test_a_null_or_star_cors_origin_is_one_line_and_exit_2(origin: str) -> None:
    done = serve_refused("--port", "0", "--cors-origin", "http://localhost:3000",
                         "--cors-origin", origin)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.splitlines() == [
        f"frink-mlx: error: refusing --cors-origin {origin!r}: it would let any web page call "
        "this daemon; name each origin exactly (e.g. http://localhost:3000)"]


def test_a_missing_default_model_is_one_line_and_exit_2(tmp_path: Path) -> None:
    registry = tmp_path / "models.toml"
    missing = tmp_path / "nowhere" / "model.gguf"
    registry.write_text(f'default = "gone"\n[models.gone]\nsource = "{missing}"\n')
    done = serve_refused("--port", "0", "--models", str(registry))
    assert done.returncode == 2 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("frink-mlx: error: the daemon did not start: the default model "
                               f"'gone' is unavailable: source not found: {missing}")
    assert "--model NAME" in lines[0] and str(registry) in lines[0]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """tiny-a: registry [sampling] temperature 0 over its generation_config's 1.5, and a
    max_tokens cap; tiny-b: generation_config temperature 0 only; gone: missing."""
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("startup")
    a, b = make_tiny_llama(root / "a", seed=0), make_tiny_llama(root / "b", seed=1)
    (a / "generation_config.json").write_text(json.dumps({"temperature": 1.5, "top_p": 0.5}))
    (b / "generation_config.json").write_text(json.dumps({"temperature": 0.0}))
    registry = write_registry(root, a, b, GONE.format(missing=root / "missing"))
    text = registry.read_text().replace('aliases = ["alpha", "gpt-4o-mini"]\n',
                                        'aliases = ["alpha", "gpt-4o-mini"]\nmax_tokens = 12\n'
                                        '[models.tiny-a.sampling]\ntemperature = 0.0\n', 1)
    registry.write_text(text)
    proc = DaemonProcess(root, "--models", str(registry), min_generation_s=0)
    proc.ready()
    yield proc
    assert proc.terminate() == 0


def chat(url: str, model: str, **kw: Any) -> httpx.Response:
    body = {"model": model, "messages": [{"role": "user", "content": "Hello there"}], **kw}
    return httpx.post(url + "/v1/chat/completions", json=body, timeout=120)


def test_unavailable_entries_are_warned_listed_and_refused_by_name(daemon: DaemonProcess) -> None:
    url = daemon.url
    missing = str(Path(daemon.log_path).parent / "missing")
    warned = [line for line in daemon.log_lines_at("WARNING") if "'gone' is unavailable" in line]
    assert warned and f"source not found: {missing}" in warned[0]
    listed = {m["id"]: m for m in httpx.get(url + "/v1/models", timeout=10).json()["data"]}
    assert listed["tiny-a"]["status"] == "available"
    assert listed["gone"]["status"] == "unavailable"
    assert listed["gone"]["reason"] == f"source not found: {missing}"
    r = chat(url, "gone")
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_unavailable"
    assert r.json()["error"]["param"] == "model" and missing in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/messages", timeout=10, json={
        "model": "gone", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 404 and r.json()["error"]["type"] == "not_found_error"
    assert missing in r.json()["error"]["message"]
    r = httpx.post(url + "/admin/models/load", json={"model": "gone"}, timeout=10)
    assert r.status_code == 404 and missing in r.json()["error"]["message"]
    models = subprocess.run([sys.executable, "-m", "frink_mlx.cli", "models", "--models",
                             str(Path(daemon.log_path).parent / "models.toml")],
                            capture_output=True, text=True, cwd=ROOT, env=daemon_env(), timeout=60)
    gone = next(line for line in models.stdout.splitlines() if line.startswith("gone "))
    assert gone.endswith(f"unavailable: source not found: {missing}")
    assert httpx.get(url + "/health", timeout=10).json()["model"] == "tiny-a"


def test_sampling_defaults_come_from_the_model(daemon: DaemonProcess) -> None:
    url = daemon.url
    # tiny-a: models.toml's temperature 0 wins over generation_config.json's 1.5
    greedy_a = chat(url, "tiny-a", temperature=0, max_tokens=12).json()
    assert [chat(url, "tiny-a").json()["choices"][0]["message"]["content"]
            for _ in range(2)] == [greedy_a["choices"][0]["message"]["content"]] * 2
    # tiny-b: generation_config.json's temperature 0 applies when the client sends none
    greedy_b = chat(url, "tiny-b", temperature=0, max_tokens=24).json()
    texts = {chat(url, "tiny-b", max_tokens=24).json()["choices"][0]["message"]["content"]
             for _ in range(2)}
    assert texts == {greedy_b["choices"][0]["message"]["content"]}
    # ... and the client's own temperature still wins (sampled: answers differ)
    sampled = {chat(url, "tiny-b", max_tokens=24, temperature=2.0).json()["choices"][0][
        "message"]["content"] for _ in range(3)}
    assert len(sampled) > 1


def test_llama_cpp_routes_report_the_sampling_a_run_used(daemon: DaemonProcess) -> None:
    """generation_settings and /props say what runs: models.toml's temperature 0, not 1."""
    url = daemon.url
    out = httpx.post(url + "/completion", json={"model": "tiny-a", "prompt": "Hi",
                                                 "n_predict": 2}, timeout=120).json()
    assert out["generation_settings"]["temperature"] == 0.0
    out = httpx.post(url + "/completion", json={"model": "tiny-a", "prompt": "Hi",
                                                 "n_predict": 2, "temperature": 0.7},
                     timeout=120).json()
    assert out["generation_settings"]["temperature"] == 0.7
    props = httpx.get(url + "/props", params={"model": "tiny-a"}, timeout=10).json()
    assert props["model_alias"] == "tiny-a" and props["n_ctx"] > 0
    params = props["default_generation_settings"]["params"]
    assert params["temperature"] == 0.0 and params["top_p"] == 0.5   # generation_config's
    props = httpx.get(url + "/props", params={"model": "tiny-b"}, timeout=10).json()
    params = props["default_generation_settings"]["params"]  # tiny-b: its own defaults
    assert props["model_alias"] == "tiny-b" and params["top_p"] == 1.0
    missing = httpx.get(url + "/props", params={"model": "nope"}, timeout=10)
    assert missing.status_code == 404 and "nope" in missing.json()["error"]["message"]


def test_max_tokens_is_capped_by_the_registry_and_clamped_to_the_context(
        daemon: DaemonProcess) -> None:
    url = daemon.url
    r = chat(url, "tiny-a", ignore_eos=True)   # no max_tokens: the entry's cap of 12
    assert r.status_code == 200 and r.headers["frink-max-tokens"] == "12"
    assert r.json()["usage"]["completion_tokens"] == 12
    assert "frink-max-tokens-requested" not in r.headers
    r = chat(url, "tiny-a", max_tokens=20, ignore_eos=True)  # a client's own limit wins
    assert r.json()["usage"]["completion_tokens"] == 20 and r.headers["frink-max-tokens"] == "20"
    body = {"model": "tiny-a", "messages": [{"role": "user", "content": "Hello there"}],
            "max_tokens": 10**12, "stream": True}
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        ceiling = httpx.get(url + "/health", timeout=10).json()["context_ceiling"]
        budget = int(r.headers["frink-max-tokens"])
        assert 0 < budget < ceiling and r.headers["frink-max-tokens-requested"] == str(10**12)


def test_the_start_up_heap_is_frozen_before_the_ready_line(daemon: DaemonProcess) -> None:
    """cli/serve.py rule 12: logged before the ready line is written (ready() has read it),
    so by then the daemon's own heap -- modules, the model, its tokenizer -- is frozen, and
    a full collection walks only what came after."""
    lines = [line for line in daemon.log_lines_at("INFO") if "start-up heap frozen: " in line]
    assert len(lines) == 1, lines
    frozen = int(lines[0].split("start-up heap frozen: ")[1].split()[0])
    assert frozen > 50_000, lines[0]   # a daemon with the tiny model in: about 105,000


def test_client_errors_log_nothing_at_error(daemon: DaemonProcess) -> None:
    assert daemon.log_lines_at("ERROR") == []


@pytest.mark.slow
def test_health_answers_at_once_while_the_default_model_loads(tmp_path: Path) -> None:
    """The packaged registry (SmolLM2 from its GGUF, imported into an empty cache: seconds)."""
    daemon = DaemonProcess(tmp_path, cache_dir=tmp_path / "cache", config_dir=tmp_path / "cfg",
                           models=None)
    try:
        url = listening_url(daemon)
        started = time.monotonic()
        health = httpx.get(url + "/health", timeout=10)
        assert time.monotonic() - started < 5.0  # at once, though a load is running
        assert health.status_code == 503 and health.headers["retry-after"] == "2"
        assert health.json()["state"] == "loading" and health.json()["loading"] == "smollm2"
        assert health.json()["progress"]["model"] == "smollm2"
        assert health.json()["progress"]["elapsed_s"] >= 0
        refused_while_loading(url)
        assert daemon.ready(300)["model"] == "smollm2"
        assert httpx.get(url + "/health", timeout=5).json()["state"] == "ready"
        readme_question(url)
        assert "loading smollm2" in daemon.log()
        assert daemon.log_lines_at("ERROR") == []
    finally:
        assert daemon.terminate() == 0


def listening_url(daemon: DaemonProcess) -> str:
    """The URL from the 'listening on' log line (the ready line waits for the model)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        for line in daemon.log().splitlines():
            if " listening on " in line:
                return line.split(" listening on ")[1].split()[0]
        assert daemon.proc.poll() is None, daemon.log()
        time.sleep(0.05)
    raise AssertionError("no 'listening on' line: " + daemon.log())


def refused_while_loading(url: str) -> None:
    r = chat(url, "default")
    assert r.status_code == 503 and r.headers["retry-after"] == "2", r.text
    assert r.json()["error"]["code"] == "model_not_loaded" and "loading" in r.json()["error"]["message"]
    r = httpx.post(url + "/v1/messages", timeout=10, json={
        "model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
    assert r.status_code == 503 and r.json()["error"]["type"] == "overloaded_error"
    r = httpx.post(url + "/completion", json={"prompt": "Hi", "n_predict": 4}, timeout=10)
    assert r.status_code == 503 and r.json()["error"]["code"] == 503


def readme_question(url: str) -> None:
    """README's curl, as written: no max_tokens, no temperature -- a short, right answer."""
    started = time.monotonic()
    r = chat(url, "default", messages=[{"role": "user", "content": "What is the capital of France?"}])
    took = time.monotonic() - started
    answer = r.json()["choices"][0]["message"]["content"]
    assert r.status_code == 200 and "Paris" in answer, answer
    assert r.json()["usage"]["completion_tokens"] < 100 and took < 60

