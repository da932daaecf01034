"""A request that times out waiting for KV blocks is a real 503 + Retry-After.

The daemon's tiny llama gets a 128-block pool (16 tokens a block, 512 B a
token). A holder request (1040 prompt ids, 1000 tokens with ignore_eos) keeps
more than half the pool for its whole decode; a ~1100-token chat prompt can
then never be admitted and, after queue_timeout_s, must be refused with 503
and Retry-After in each protocol's envelope -- OpenAI chat (stream and not),
Anthropic, llama.cpp -- before any byte of a stream is sent. /health answers
meanwhile.
"""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

BLOCK_SIZE = 16
NUM_BLOCKS = 128
BYTES_PER_TOKEN = 2 * 2 * 2 * 16 * 4  # K,V * layers * kv heads * head dim * float32


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import make_tiny_llama
    from daemon_support import start_server

    root: Path = tmp_path_factory.mktemp("admission")
    tiny = make_tiny_llama(root / "tiny")
    (root / "models.toml").write_text(f'default = "tiny"\n\n[models.tiny]\nsource = "{tiny}"\n')
    settings = Settings.load(models_path=str(root / "models.toml"), min_generation_s=0.0,
                             access_log=False, cache_dir=str(root / "cache"),
                             block_size=BLOCK_SIZE, queue_timeout_s=0.3,
                             max_kv_pool_bytes=NUM_BLOCKS * BLOCK_SIZE * BYTES_PER_TOKEN)
    live = start_server(create_app(settings, registry=load_registry(settings)))
    yield live
    live.stop()


def _long_message(client: httpx.Client, num_tokens: int) -> str:
    unit = "lorem ipsum dolor "
    per_unit = len(client.post("/tokenize", json={"content": unit * 10}).json()["tokens"]) / 10
    return unit * int(num_tokens / per_unit)


class Holder:
    """A streaming llama.cpp completion that keeps most of the pool busy."""

    def __init__(self, url: str) -> None:
        self.started = threading.Event()
        self.num_frames = 0
        self.status: int | None = None
        self.thread = threading.Thread(target=self._run, args=(url,), daemon=True)
        self.thread.start()
        assert self.started.wait(60), "the holder never started"

    def _run(self, url: str) -> None:
        body = {"prompt": [5] * 1040, "n_predict": 1000, "ignore_eos": True, "stream": True,
                "cache_prompt": False}
        with httpx.Client(base_url=url, timeout=120) as client, \
                client.stream("POST", "/completion", json=body) as response:
            self.status = response.status_code
            for line in response.iter_lines():
                if line.startswith("data:"):
                    self.num_frames += 1
                    self.started.set()
        self.started.set()


def test_queue_timeout_is_503_with_retry_after_in_every_envelope(server: Any) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        stats = server.state.hub.current.engine.stats()
        assert stats.num_blocks_total == NUM_BLOCKS
        text = _long_message(client, 1100)
        holder = Holder(server.url)
        messages = [{"role": "user", "content": text}]
        calls = {
            "chat": ("/v1/chat/completions", {"model": "tiny", "messages": messages,
                                              "max_tokens": 4}),
            "chat_stream": ("/v1/chat/completions", {"model": "tiny", "messages": messages,
                                                     "max_tokens": 4, "stream": True}),
            "anthropic": ("/v1/messages", {"model": "tiny", "messages": messages,
                                           "max_tokens": 4}),
            "llamacpp": ("/completion", {"prompt": text, "n_predict": 4}),
        }
        with concurrent.futures.ThreadPoolExecutor(len(calls)) as pool:
            futures = {name: pool.submit(client.post, path, json=body)
                       for name, (path, body) in calls.items()}
            health = client.get("/health")
            answers = {name: f.result() for name, f in futures.items()}
        assert health.status_code == 200
        assert holder.thread.is_alive(), "the holder finished before the refusals were checked"
        for name, response in answers.items():
            assert response.status_code == 503, (name, response.text)
            assert int(response.headers["retry-after"]) >= 1, name
            assert "event-stream" not in response.headers.get("content-type", ""), name
        for name in ("chat", "chat_stream"):
            assert answers[name].json()["error"]["code"] == "overloaded"
        assert answers["anthropic"].json()["type"] == "error"
        assert answers["anthropic"].json()["error"]["type"] == "overloaded_error"
        assert answers["llamacpp"].json()["error"]["code"] == 503
        holder.thread.join(120)
        assert holder.status == 200 and holder.num_frames > 100
        # the pool is free again: the same request now runs
        again = client.post(*calls["chat"][:1], json=calls["chat"][1])
        assert again.status_code == 200, again.text
