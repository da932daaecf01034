"""A client that stops reading is cut after `send_timeout_s`; one that reads slowly is not
(http/timeouts.py rule 6), on real sockets, served as `frink-mlx serve` serves it.

The listening socket's send buffer is shrunk (accepted sockets inherit it) and the
stalled client shrinks its receive buffer, so the server's buffers fill within the
first frames of an n=8 stream rather than after the megabytes the kernel would
otherwise take. What must hold: the model lease is back to 0 (GET /health,
`models.*.leases`) within `send_timeout_s` plus a poll and a step, the access line says
499, and a second client keeps its TTFT meanwhile (tests/stall_support.py). A reader that takes a little
every few milliseconds gets its whole stream, however long it takes.
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
from urllib.parse import urlparse

import httpx
import pytest
from daemon_support import LiveServer, generation_factory, start_guarded_server, write_registry
from stall_support import assert_nobody_stalled

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

SEND_S = 2.0
STREAM = {"model": "tiny-a", "messages": [{"role": "user", "content": "Tell me a story."}],
          "stream": True, "n": 8, "temperature": 0, "ignore_eos": True}


class Lines(logging.Handler):
    """Every record of the frink_mlx loggers at INFO and above."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []
        self.guard = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        with self.guard:
            self.records.append(record)

    def messages(self, *, at_least: int = logging.INFO) -> list[str]:
        with self.guard:
            return [r.getMessage() for r in self.records if r.levelno >= at_least]


@pytest.fixture(scope="module")
def lines() -> Iterator[Lines]:
    handler = Lines()
    logger, access = logging.getLogger("frink_mlx"), logging.getLogger("frink_mlx.access")
    old = logger.level, access.level
    logger.setLevel(logging.INFO)
    access.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(old[0])
    access.setLevel(old[1])


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path, lines: Lines
           ) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("slow_readers")
    settings = Settings.load(models_path=str(write_registry(root, tiny_llama_dir, tiny_llama_dir)),
                             send_timeout_s=SEND_S, min_generation_s=0.0,
                             cache_dir=str(root / "cache"))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    live = start_guarded_server(app, settings, sndbuf=4096)
    yield live
    live.stop()


def leases(daemon: LiveServer) -> int:
    models = httpx.get(daemon.url + "/health", timeout=10).json()["models"]
    return sum(m["leases"] for m in models.values())


def open_stream(daemon: LiveServer, body: dict[str, object], request_id: str,
                rcvbuf: int) -> socket.socket:
    url = urlparse(daemon.url)
    data = json.dumps(body).encode()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)  # before connect: the window
    sock.settimeout(30)
    sock.connect((url.hostname, url.port))
    sock.sendall((f"POST /v1/chat/completions HTTP/1.1\r\nHost: {url.hostname}\r\n"
                  f"Content-Type: application/json\r\nx-request-id: {request_id}\r\n"
                  f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    return sock


def access_line(lines: Lines, request_id: str, timeout_s: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for message in lines.messages():
            if f'"id":"{request_id}"' in message:
                return json.loads(message)
        time.sleep(0.05)
    raise AssertionError(f"no access line for {request_id}")


def test_a_client_that_stops_reading_is_cut_and_frees_its_lease(daemon: LiveServer,
                                                                lines: Lines) -> None:
    request_id = f"stall-{uuid.uuid4().hex[:12]}"
    sock = open_stream(daemon, {**STREAM, "max_tokens": 1500}, request_id, rcvbuf=4096)
    try:
        started = time.monotonic()
        while leases(daemon) == 0:  # the stream has started
            assert time.monotonic() - started < 30
            time.sleep(0.02)
        other = httpx.post(daemon.url + "/v1/chat/completions", timeout=30, json={
            "model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8})
        assert other.status_code == 200  # a second client is answered meanwhile
        while leases(daemon) > 0:
            assert time.monotonic() - started < SEND_S + 3, "the stalled stream kept its lease"
            time.sleep(0.05)
        held_s = time.monotonic() - started
    finally:
        sock.close()
    line = access_line(lines, request_id)
    assert line["status"] == 499, line
    assert line["completion_tokens"] < 8 * 1500
    assert held_s >= SEND_S
    assert any("read nothing for" in m for m in lines.messages())
    health = httpx.get(daemon.url + "/health", timeout=10).json()
    assert health["kv"]["blocks_used"] == 0 and health["running"] == 0


def test_a_slow_but_steady_reader_gets_its_whole_stream(daemon: LiveServer, lines: Lines
                                                         ) -> None:
    request_id = f"slow-{uuid.uuid4().hex[:12]}"
    sock = open_stream(daemon, {**STREAM, "max_tokens": 200}, request_id, rcvbuf=4096)
    started, data = time.monotonic(), b""
    try:
        while not data.endswith(b"data: [DONE]\n\n\r\n0\r\n\r\n"):  # the last chunk
            chunk = sock.recv(1024)
            assert chunk, f"the stream was cut after {len(data)} bytes"
            data += chunk
            time.sleep(0.01)  # at most 100 KiB a second: slower than the engine, never stalled
    finally:
        sock.close()
    took = time.monotonic() - started
    assert data.startswith(b"HTTP/1.1 200 ")
    assert data.count(b'"finish_reason":"length"') == 8
    assert took > SEND_S, f"{took:.1f} s: the stream never waited on this reader"
    assert access_line(lines, request_id)["status"] == 200
    assert leases(daemon) == 0


def test_slow_readers_log_nothing_at_error(lines: Lines) -> None:
    assert lines.messages(at_least=logging.ERROR) == []


def test_while_a_stalled_stream_waits_to_be_cut_health_answers_and_a_neighbour_decodes(
        daemon: LiveServer, lines: Lines) -> None:
    """Issue 32, what must hold: during the stall (up to send_timeout_s), a second client
    streams with the TTFT it has alone and /health answers within 100 ms
    (tests/stall_support.py: the baseline, GC, noise); the stall is cut, 499, within
    send_timeout_s plus a poll and a step of its start."""
    cut_after: list[float] = []

    def stall() -> None:
        request_id = f"stall-{uuid.uuid4().hex[:12]}"
        started = time.monotonic()
        sock = open_stream(daemon, {**STREAM, "max_tokens": 1500}, request_id, rcvbuf=4096)
        try:
            line = access_line(lines, request_id, timeout_s=SEND_S + 10)
            cut_after.append(time.monotonic() - started)
        finally:
            sock.close()
        assert line["status"] == 499, line

    assert_nobody_stalled(daemon.url, stall, model="tiny-a")
    assert cut_after and all(SEND_S <= s < SEND_S + 3 for s in cut_after), cut_after
    deadline = time.monotonic() + 10
    while leases(daemon) > 0:
        assert time.monotonic() < deadline, "a lease was kept"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def default_daemon(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path,
                   lines: Lines) -> Iterator[LiveServer]:
    """As `frink-mlx serve` binds it: the listening socket with the default
    send_buffer_bytes, nothing shrunk by the test."""
    root = tmp_path_factory.mktemp("slow_readers_default")
    settings = Settings.load(models_path=str(write_registry(root, tiny_llama_dir, tiny_llama_dir)),
                             send_timeout_s=SEND_S, min_generation_s=0.0,
                             cache_dir=str(root / "cache"))
    app = create_app(settings, registry=load_registry(settings), factory=generation_factory())
    live = start_guarded_server(app, settings)
    yield live
    live.stop()


def test_with_the_default_send_buffer_a_stalled_stream_is_cut_before_it_fits_in_it(
        default_daemon: LiveServer, lines: Lines) -> None:
    """The soak found it (benchmarks/results/soak-2026-12-03-30min.txt): with the kernel's
    own autotuned buffer (megabytes) a never-read n=8 stream of 300 tokens with 20 top
    logprobs (~3 MiB) fit whole in it, so nothing ever paused and it ran to its end.
    Capped at send_buffer_bytes, it is cut (499) with most of its tokens never made."""
    request_id = f"stall-default-{uuid.uuid4().hex[:12]}"
    sock = open_stream(default_daemon, {**STREAM, "max_tokens": 300, "logprobs": True,
                                        "top_logprobs": 20}, request_id, rcvbuf=4096)
    try:
        line = access_line(lines, request_id, timeout_s=60)
    finally:
        sock.close()
    assert line["status"] == 499, line
    assert line["completion_tokens"] < 8 * 300 // 2, line
