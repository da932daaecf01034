"""Anthropic `thinking.budget_tokens` is enforced (handles.py rule 10).

A tiny llama with `<think>`/`</think>` as real tokens of its vocabulary (the
embedding grown to cover them) and a Qwen3-style template that opens the think
block in the prompt runs on the real engine. Greedy, a budget of 3 cuts the
reasoning after 3 tokens -- a prefix of the unbudgeted reasoning -- and the
answer follows the forced `</think>`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import mlx.core as mx
import pytest

from adapters.scripted import THINK_TEMPLATE, add_think_tokens
from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings


def _grow_vocab(checkpoint: Path, extra: int) -> Path:
    """Embedding rows for the added tokens, so the model can emit them."""
    config = json.loads((checkpoint / "config.json").read_text())
    weights = mx.load(str(checkpoint / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"]
    mx.random.seed(1)
    rows = (mx.random.normal((extra, embed.shape[1])) * 0.2).astype(embed.dtype)
    weights["model.embed_tokens.weight"] = mx.concatenate([embed, rows])
    mx.save_safetensors(str(checkpoint / "model.safetensors"), weights,
                        metadata={"format": "mlx"})
    config["vocab_size"] = embed.shape[0] + extra
    (checkpoint / "config.json").write_text(json.dumps(config))
    return checkpoint


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from conftest import make_tiny_llama
    from daemon_support import start_server

    root = tmp_path_factory.mktemp("think_budget")
    thinker = _grow_vocab(add_think_tokens(make_tiny_llama(root / "thinker",
                                                           chat_template=THINK_TEMPLATE)), 2)
    (root / "models.toml").write_text(
        f'default = "thinker"\n\n[models.thinker]\nsource = "{thinker}"\n')
    settings = Settings.load(models_path=str(root / "models.toml"), min_generation_s=0.0,
                             access_log=False, cache_dir=str(root / "cache"))
    live = start_server(create_app(settings, registry=load_registry(settings)))
    yield live
    live.stop()


def _message(client: httpx.Client, budget: int) -> dict[str, Any]:
    body = {"model": "thinker", "max_tokens": 24, "temperature": 0,
            "thinking": {"type": "enabled", "budget_tokens": budget},
            "messages": [{"role": "user", "content": "think about it"}]}
    response = client.post("/v1/messages", json=body)
    assert response.status_code == 200, response.text
    return response.json()


def _blocks(message: dict[str, Any], kind: str) -> str:
    key = "thinking" if kind == "thinking" else "text"
    return "".join(b[key] for b in message["content"] if b["type"] == kind)


def test_the_budget_closes_the_think_block(server: Any) -> None:
    with httpx.Client(base_url=server.url, timeout=60) as client:
        free = _message(client, 1000)
        capped = _message(client, 3)
    free_thinking, thinking = _blocks(free, "thinking"), _blocks(capped, "thinking")
    assert "</think>" not in free_thinking + thinking
    assert free["usage"]["output_tokens"] == 24 and _blocks(free, "text") == ""  # never closed
    assert free_thinking.startswith(thinking) and len(thinking) < len(free_thinking)
    tokenizer = server.state.hub.current.loaded.tokenizer
    assert len(tokenizer.encode(thinking, add_special_tokens=False)) <= 3
    assert capped["usage"]["output_tokens"] == 24
    assert _blocks(capped, "text") != ""  # the answer after the forced </think>
