"""Model names clients hard-code (issue 23): `fallback` serves unknown names as "default".

A chat model with a MiniLM side-car is the default; every name below is one a
mainstream client sends unless told otherwise. The response's `model` says
what answered. GET /v1/models/{id} stays strict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import anthropic
import httpx
import pytest

from adapters.test_embeddings import LiveServer, registry, settings
from frink_mlx.app import create_app


@pytest.fixture(scope="module")
def fallback_server(tiny_llama_dir: Path) -> Iterator[LiveServer]:
    reg = registry("chat", {"embeddings": "minilm"}, tiny_llama_dir)
    reg.fallback = settings(fallback=True).fallback_enabled()
    with LiveServer(create_app(settings(), registry=reg)) as server:
        yield server


@pytest.mark.parametrize("name", ["text-embedding-3-small", "ada-002", "3-small", "GPT-4"])
def test_embedding_names_fall_back_to_the_side_car(fallback_server: LiveServer, name: str) -> None:
    out = fallback_server.client().embeddings.create(model=name, input="hello world",
                                                     encoding_format="float")
    assert out.model == "minilm" and len(out.data[0].embedding) == 384


@pytest.mark.parametrize("name", ["gpt-4o-mini", "GPT-4", None])
def test_chat_names_fall_back_to_the_default(fallback_server: LiveServer, name: Any) -> None:
    body = {"model": name, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(fallback_server.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["model"] == "chat"


def test_claude_code_names_fall_back(fallback_server: LiveServer) -> None:
    client = anthropic.Anthropic(base_url=fallback_server.url, api_key="unused", max_retries=0)
    message = client.messages.create(model="claude-sonnet-4-5-20250929", max_tokens=2,
                                     messages=[{"role": "user", "content": "hi"}])
    assert message.model == "chat"


def test_model_lookup_stays_strict(fallback_server: LiveServer) -> None:
    r = httpx.get(fallback_server.url + "/v1/models/gpt-4o-mini", timeout=10)
    assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"


def test_fallback_defaults_to_loopback_only() -> None:
    assert settings().fallback is False
    assert settings(fallback=None, host="127.0.0.1").fallback_enabled()
    assert not settings(fallback=None, host="0.0.0.0").fallback_enabled()
    assert settings(fallback=True, host="0.0.0.0").fallback_enabled()
