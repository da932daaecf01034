"""Large bodies are decoded, rendered and tokenized off the event loop (core/offload.py),
and a text far past the ceiling is refused from its head (core/prompt.py rule 8): while
each request below runs, GET /health keeps answering. Real sockets, the real app.

Before: a 1.6 MiB prompt held the loop (and every /health) for 11 s on this tokenizer,
and an 8 MiB one for about a minute. What must hold is issue 32's: a neighbour keeps the
TTFT it has alone and /health answers within 100 ms (tests/stall_support.py).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest
from daemon_support import LiveServer, generation_factory, start_guarded_server, write_registry
from stall_support import assert_nobody_stalled, encoded

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


def posting(daemon: LiveServer, path: str, body: dict[str, Any], status: int,
            answers: list[httpx.Response] | None = None) -> Callable[[], None]:
    """`during` for stall_support: POST `body` (encoded now, not in the window), check its status."""
    request = encoded(body)

    def post() -> None:
        response = httpx.post(daemon.url + path, timeout=300, **request)
        assert response.status_code == status, response.text[:300]
        if answers is not None:
            answers.append(response)
    return post


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
def test_a_large_prompt_is_refused_while_nobody_stalls(daemon: LiveServer, shape: str) -> None:
    """Refused (the ceiling, in the protocol's words) while a neighbour streams with its
    TTFT alone and /health answers within 100 ms (tests/stall_support.py)."""
    path, body = SHAPES[shape]
    answers: list[httpx.Response] = []
    assert_nobody_stalled(daemon.url, posting(daemon, path, body, 400, answers), model="tiny-a")
    assert "2048" in answers[0].text  # the ceiling, in the protocol's words:
    assert "at least" in answers[0].text or "prompt is too long" in answers[0].text


def test_large_tokenize_and_detokenize_stall_nobody(daemon: LiveServer) -> None:
    content = text(20_000)
    answers: list[httpx.Response] = []
    assert_nobody_stalled(daemon.url, posting(daemon, "/tokenize", {"content": content}, 200,
                                              answers), model="tiny-a")
    tokens = answers[0].json()["tokens"]
    assert len(tokens) > 20_000
    answers.clear()
    assert_nobody_stalled(daemon.url, posting(daemon, "/detokenize", {"tokens": tokens}, 200,
                                              answers), model="tiny-a")
    assert answers[0].json()["content"] == content


def test_a_small_request_still_answers(daemon: LiveServer) -> None:
    r = httpx.post(daemon.url + "/v1/chat/completions", timeout=60, json={
        "model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
