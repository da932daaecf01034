"""A client that goes away is a 499 on every generating route (adapters/endpoint.py).

Real HTTP over real sockets into the real app and the real engine: for every
generating route, streaming and not, the client closes its socket before the
answer starts or in the middle of it. Each time:
- the access line says 499 (http/access.py rule 6),
- nothing is logged at ERROR (no traceback, no recorded 500),
- the decode stops within one engine step of the response ending, and the
  engine holds no KV block any more (/health's `kv.blocks_used` back to 0).
A client that drops mid-body is a 499 too, never a 500.

Raw sockets, not an HTTP client: the test must choose the exact moment the
connection closes. `coder` is the tiny llama with FIM tokens inside its
vocabulary (embedding rows padded), so /infill runs on the real engine too.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

from adapters.scripted import add_tokens, write_models_toml
from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

FIM_TOKENS = ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>")
MSGS = [{"role": "user", "content": "Tell me a very long story."}]
LONG = 1500

# route, body, framing separator of one stream frame
ROUTES: list[tuple[str, dict[str, Any], bytes]] = [
    ("/v1/chat/completions", {"model": "tiny", "messages": MSGS, "max_tokens": LONG,
                              "ignore_eos": True, "temperature": 0}, b"\n\n"),
    ("/v1/completions", {"model": "tiny", "prompt": "Once upon a time", "max_tokens": LONG,
                         "ignore_eos": True, "temperature": 0}, b"\n\n"),
    ("/v1/responses", {"model": "tiny", "input": "Tell me a very long story.",
                       "max_output_tokens": LONG, "temperature": 0}, b"\n\n"),
    ("/v1/messages", {"model": "tiny", "messages": MSGS, "max_tokens": LONG,
                      "temperature": 0}, b"\n\n"),
    ("/completion", {"model": "tiny", "prompt": "Once upon a time", "n_predict": LONG,
                     "ignore_eos": True, "temperature": 0}, b"\n\n"),
    ("/infill", {"model": "coder", "input_prefix": "def f(", "input_suffix": ")\n",
                 "n_predict": LONG, "ignore_eos": True, "temperature": 0}, b"\n\n"),
    ("/api/chat", {"model": "tiny", "messages": MSGS,
                   "options": {"num_predict": LONG, "temperature": 0}}, b"\n"),
    ("/api/generate", {"model": "tiny", "prompt": "Tell me a very long story.",
                       "options": {"num_predict": LONG, "temperature": 0}}, b"\n"),
]


def pad_vocab(checkpoint: Path, extra: int) -> Path:
    """Give a tiny (tied-embedding) llama `extra` more embedding rows, so tokens
    added to its tokenizer by `add_tokens` are real inputs and outputs."""
    import mlx.core as mx

    weights = mx.load(str(checkpoint / "model.safetensors"))
    embed = weights["model.embed_tokens.weight"]
    rows = (mx.random.normal((extra, embed.shape[1])) * 0.2).astype(embed.dtype)
    weights["model.embed_tokens.weight"] = mx.concatenate([embed, rows])
    mx.save_safetensors(str(checkpoint / "model.safetensors"), weights,
                        metadata={"format": "mlx"})
    config = json.loads((checkpoint / "config.json").read_text())
    config["vocab_size"] += extra
    (checkpoint / "config.json").write_text(json.dumps(config))
    return checkpoint


class Records(logging.Handler):
    """Every record at INFO and above, from any thread."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self.guard = threading.Lock()
        self.on_access: Any = None

    def emit(self, record: logging.LogRecord) -> None:
        if record.name == "frink_mlx.access" and self.on_access is not None:
            self.on_access(record)
        with self.guard:
            self.records.append(record)

    def errors(self) -> list[str]:
        with self.guard:
            return [f"{r.name}: {r.getMessage()}" for r in self.records
                    if r.levelno >= logging.ERROR]

    def access_line(self, request_id: str, timeout_s: float = 15.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self.guard:
                for r in self.records:
                    if r.name == "frink_mlx.access":
                        line = json.loads(r.getMessage())
                        if line["id"] == request_id:
                            return line
            time.sleep(0.02)
        raise AssertionError(f"no access line for {request_id}")


@pytest.fixture(scope="module")
def records() -> Iterator[Records]:
    handler = Records()
    watched = [logging.getLogger(), logging.getLogger("uvicorn"), logging.getLogger("frink_mlx")]
    access = logging.getLogger("frink_mlx.access")
    old_level = access.level
    access.setLevel(logging.INFO)
    for logger in watched:
        logger.addHandler(handler)
    yield handler
    for logger in watched:
        logger.removeHandler(handler)
    access.setLevel(old_level)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, records: Records) -> Iterator[Any]:
    from conftest import make_tiny_llama
    from daemon_support import generation_factory, start_server

    root = tmp_path_factory.mktemp("disconnect")
    tiny = make_tiny_llama(root / "tiny")
    coder = pad_vocab(add_tokens(make_tiny_llama(root / "coder"), FIM_TOKENS), len(FIM_TOKENS))
    path = write_models_toml(root, {"tiny": tiny, "coder": coder}, default="tiny")
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=True,
                             cache_dir=str(root / "cache"))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    live = start_server(app)
    yield live
    live.stop()


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=30)


def _head(url: str, path: str, request_id: str, length: int) -> bytes:
    host = url.removeprefix("http://")
    return (f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"x-request-id: {request_id}\r\nContent-Length: {length}\r\n\r\n").encode()


def _open(url: str, path: str, body: dict[str, Any], request_id: str) -> socket.socket:
    data = json.dumps(body).encode()
    sock = _connect(url)
    sock.sendall(_head(url, path, request_id, len(data)) + data)
    return sock


def _read_frames(sock: socket.socket, separator: bytes, num_frames: int) -> bytes:
    """Read until the headers and `num_frames` frames of the body have arrived."""
    buf = b""
    while True:
        chunk = sock.recv(65536)
        assert chunk, f"the server closed the stream early: {buf[:300]!r}"
        buf += chunk
        head, _, body = buf.partition(b"\r\n\r\n")
        if body and body.count(separator) >= num_frames:
            assert head.startswith(b"HTTP/1.1 200"), head
            return buf


def _engine(server: Any) -> Any:
    return server.state.hub.current.engine


def _wait_decoding(server: Any, before: int, tokens: int = 8) -> None:
    deadline = time.monotonic() + 60
    while _engine(server).stats().generated_tokens_total < before + tokens:
        assert time.monotonic() < deadline, "the decode never started"
        time.sleep(0.005)


def _ensure_model(server: Any, model: str) -> None:
    r = httpx.post(server.url + "/admin/models/load", json={"model": model, "wait": True},
                   timeout=120)
    assert r.status_code == 200, r.text


def _check_freed(server: Any, records: Records, request_id: str) -> dict[str, Any]:
    """Rules of the module docstring; returns the access line."""
    steps_at_line: list[int] = []
    engine = _engine(server)

    def snapshot(record: logging.LogRecord) -> None:
        if f'"id":"{request_id}"' in record.getMessage():
            steps_at_line.append(engine.stats().steps_total)

    records.on_access = snapshot
    try:
        line = records.access_line(request_id)
    finally:
        records.on_access = None
    deadline = time.monotonic() + 10
    while True:
        stats = engine.stats()
        if stats.num_running == 0 and stats.num_waiting == 0 and stats.num_blocks_used == 0:
            break
        assert time.monotonic() < deadline, f"the engine still holds the request: {stats}"
        time.sleep(0.01)
    time.sleep(0.1)
    stats = engine.stats()
    assert stats.num_blocks_used == 0
    if steps_at_line:  # the line is written after the runs were aborted
        assert stats.steps_total - steps_at_line[0] <= 1, "the decode ran on after the abort"
    health = httpx.get(server.url + "/health", timeout=10).json()
    assert health["kv"]["blocks_used"] == 0
    assert server.state.hub.num_leases() == 0
    return line


# When the client closes: right after sending (the server may not even have read
# the body), while the engine decodes its answer (nothing read yet; for a plain
# request this is mid-answer), or after reading the first frames of a stream.
MOMENTS = [(False, "at_once"), (False, "decoding"),
           (True, "at_once"), (True, "decoding"), (True, "frames")]


@pytest.mark.parametrize("stream,moment", MOMENTS, ids=[f"{'stream' if s else 'plain'}-{m}"
                                                         for s, m in MOMENTS])
@pytest.mark.parametrize("path,body,separator", ROUTES, ids=[r[0] for r in ROUTES])
def test_disconnect_is_499_and_frees_the_request(server: Any, records: Records, path: str,
                                                 body: dict[str, Any], separator: bytes,
                                                 stream: bool, moment: str) -> None:
    _ensure_model(server, body["model"])
    errors_before = len(records.errors())
    request_id = f"disc-{uuid.uuid4().hex[:12]}"
    before = _engine(server).stats().generated_tokens_total
    sock = _open(server.url, path, {**body, "stream": stream}, request_id)
    try:
        if moment == "frames":
            _read_frames(sock, separator, 4)
        elif moment == "decoding":
            _wait_decoding(server, before)
    finally:
        sock.close()
    line = _check_freed(server, records, request_id)
    assert line["status"] == 499, line
    assert line["route"] == path
    assert _engine(server).stats().generated_tokens_total - before < LONG
    assert records.errors()[errors_before:] == []


@pytest.mark.parametrize("path", [r[0] for r in ROUTES])
def test_client_dropping_mid_body_is_not_a_500(server: Any, records: Records, path: str) -> None:
    errors_before = len(records.errors())
    request_id = f"body-{uuid.uuid4().hex[:12]}"
    sock = _connect(server.url)
    sock.sendall(_head(server.url, path, request_id, 500) + b'{"model": "tiny", "mess')
    time.sleep(0.1)
    sock.close()
    line = records.access_line(request_id)
    assert line["status"] in (499, 400), line
    assert records.errors()[errors_before:] == []


def test_finished_answers_are_still_200(server: Any, records: Records) -> None:
    """Rule 6 of http/access.py only marks answers the client did not wait for."""
    _ensure_model(server, "tiny")
    for stream in (False, True):
        request_id = f"ok-{uuid.uuid4().hex[:12]}"
        r = httpx.post(server.url + "/v1/chat/completions", timeout=60,
                       headers={"x-request-id": request_id},
                       json={"model": "tiny", "messages": MSGS, "max_tokens": 4, "stream": stream})
        assert r.status_code == 200
        assert records.access_line(request_id)["status"] == 200
