"""Large bodies are decoded, rendered and tokenized off the event loop (core/offload.py),
and a text far past the ceiling is refused from its head (core/prompt.py rule 8): while
each request below runs, GET /health keeps answering. Real sockets, the real app.

Before: a 1.6 MiB prompt held the loop (and every /health) for 11 s on this tokenizer,
and an 8 MiB one for about a minute. The figure the issue asks for is 100 ms; on a
shared, loaded test machine the median is held to it and the worst to a second.
"""

from __future__ import annotations

import json
import random
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from daemon_support import LiveServer, generation_factory, start_guarded_server, write_registry

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

WORDS = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod".split()


def text(num_words: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) + str(rng.randint(0, 99)) for _ in range(num_words))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
           ) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("offload")
    settings = Settings.load(models_path=str(write_registry(root, tiny_llama_dir, tiny_llama_dir)),
                             min_generation_s=0.0, cache_dir=str(root / "cache"))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    live = start_guarded_server(app, settings)
    yield live
    live.stop()


def timed_health_during(daemon: LiveServer, path: str, body: dict[str, Any]
                        ) -> tuple[httpx.Response, list[float]]:
    """POST `body` while another client polls /health; the poll latencies in seconds."""
    data = json.dumps(body).encode()
    latencies: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=300) as client:
            while not done.is_set():
                started = time.monotonic()
                assert client.get(daemon.url + "/health").status_code == 200
                latencies.append(time.monotonic() - started)
                time.sleep(0.01)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        time.sleep(0.1)
        response = httpx.post(daemon.url + path, content=data, timeout=300,
                              headers={"content-type": "application/json"})
    finally:
        done.set()
        poller.join()
    return response, latencies


SHAPES = {
    "one-long-message": ("/v1/chat/completions",
                         {"model": "tiny-a", "messages": [{"role": "user", "content": text(500_000)}]}),
    "raw-prompt": ("/v1/completions", {"model": "tiny-a", "prompt": text(500_000)}),
    "many-messages": ("/v1/chat/completions", {"model": "tiny-a", "messages": [
        {"role": ("user", "assistant")[i % 2], "content": text(8, i)} for i in range(20_000)]}),
    "anthropic": ("/v1/messages", {"model": "tiny-a", "max_tokens": 8,
                                   "messages": [{"role": "user", "content": text(500_000)}]}),
}


@pytest.mark.parametrize("shape", list(SHAPES))
def test_a_large_prompt_is_refused_while_health_answers(daemon: LiveServer, shape: str) -> None:
    path, body = SHAPES[shape]
    response, latencies = timed_health_during(daemon, path, body)
    assert response.status_code == 400, response.text[:300]
    assert "2048" in response.text  # the ceiling, in the protocol's words:
    assert "at least" in response.text or "prompt is too long" in response.text
    assert latencies, "no /health answered"
    assert statistics.median(latencies) < 0.1, latencies
    assert max(latencies) < 1.0, max(latencies)


def test_large_tokenize_and_detokenize_answer_while_health_answers(daemon: LiveServer) -> None:
    content = text(20_000)
    response, latencies = timed_health_during(daemon, "/tokenize", {"content": content})
    assert response.status_code == 200
    tokens = response.json()["tokens"]
    assert len(tokens) > 20_000
    response, more = timed_health_during(daemon, "/detokenize", {"tokens": tokens})
    assert response.status_code == 200 and response.json()["content"] == content
    latencies += more
    assert statistics.median(latencies) < 0.1, latencies
    assert max(latencies) < 1.0, max(latencies)


def test_a_small_request_still_answers(daemon: LiveServer) -> None:
    r = httpx.post(daemon.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
