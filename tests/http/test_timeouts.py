"""Header, body and idle keep-alive timeouts on real sockets against `frink-mlx serve`
(http/timeouts.py, http/security.py gate 5)."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import httpx
import pytest
from daemon_support import DaemonProcess, write_registry

HEADER_S, BODY_S, IDLE_S = 1.5, 2.0, 1.0


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
           ) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("timeouts")
    proc = DaemonProcess(root, "--models", str(write_registry(root, tiny_llama_dir, tiny_llama_dir)),
                         header_timeout_s=HEADER_S, body_timeout_s=BODY_S, idle_timeout_s=IDLE_S)
    proc.ready()
    yield proc
    assert proc.terminate() == 0


def connect(daemon: DaemonProcess) -> socket.socket:
    url = urlparse(daemon.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=15)
    return sock


def read_until_closed(sock: socket.socket, limit_s: float = 15.0) -> tuple[bytes, float]:
    """Everything the server sends until it closes; and how long that took."""
    started, data = time.monotonic(), b""
    sock.settimeout(limit_s)
    while True:
        chunk = sock.recv(65536)
        if not chunk:
            return data, time.monotonic() - started
        data += chunk


def test_an_idle_connection_that_never_speaks_is_closed(daemon: DaemonProcess) -> None:
    with connect(daemon) as sock:
        data, took = read_until_closed(sock)
    assert data == b"" and HEADER_S - 0.2 <= took < HEADER_S + 5


def test_half_sent_headers_get_408_and_are_closed(daemon: DaemonProcess) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        data, took = read_until_closed(sock)
    assert data.startswith(b"HTTP/1.1 408 ") and b"connection: close" in data.lower()
    assert took < HEADER_S + 5


def test_headers_trickled_a_byte_at_a_time_are_cut_at_the_total_limit(daemon: DaemonProcess
                                                                       ) -> None:
    request = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
    started = time.monotonic()
    with connect(daemon) as sock:
        closed = False
        for byte in request:  # 0.25 s a byte: each one well inside the limit
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                closed = True
                break
            time.sleep(0.25)
            if time.monotonic() - started > HEADER_S + 5:
                break
        data, _ = read_until_closed(sock) if not closed else (b"", 0.0)
    assert closed or data.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < HEADER_S + 6


def test_a_body_sent_at_one_byte_a_second_gets_408_in_the_envelope(daemon: DaemonProcess
                                                                   ) -> None:
    body = json.dumps({"model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}]})
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    started = time.monotonic()
    with connect(daemon) as sock:
        sock.sendall(head)
        sock.settimeout(1.0)
        data = b""
        for byte in body.encode():
            try:
                sock.sendall(bytes([byte]))
                data += sock.recv(65536)
            except (socket.timeout, TimeoutError):
                continue
            except OSError:
                break
            if data:
                break
        rest, _ = read_until_closed(sock)
    response = data + rest
    assert response.startswith(b"HTTP/1.1 408 "), response[:200]
    error = json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]
    assert error["code"] == "request_timeout" and error["param"] == "body"
    assert BODY_S - 0.2 <= time.monotonic() - started < BODY_S + 5


def test_keep_alive_connections_are_closed_after_the_idle_timeout(daemon: DaemonProcess) -> None:
    with connect(daemon) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(10)
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        data, took = read_until_closed(sock)
    assert took < IDLE_S + 5


def test_a_long_stream_outlives_every_timer(daemon: DaemonProcess) -> None:
    body = {"model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}], "stream": True,
            "max_tokens": 64, "temperature": 0, "ignore_eos": True}
    started, frames = time.monotonic(), []
    with httpx.stream("POST", daemon.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                frames.append(json.loads(line[6:]))
                time.sleep(0.05)  # a slow reader: the response takes longer than HEADER_S
    assert time.monotonic() - started > HEADER_S
    assert frames[-1]["choices"][0]["finish_reason"] == "length"


def test_client_timeouts_log_nothing_at_error(daemon: DaemonProcess) -> None:
    assert daemon.log_lines_at("ERROR") == []
