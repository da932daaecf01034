"""cli/local_daemon.py: the one loopback rule and the one /health prober, shared by every command.

The URL half is pure; the prober half runs against small real servers on loopback ports:
frink's /health bodies (ready 200, loading 503), something else's answer, nothing
listening, and a port that accepts connections but never answers.
"""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from frink_mlx.cli.local_daemon import Health, daemon_answers, daemon_url, local_url, probe
from frink_mlx.cli.service import plan_service
from frink_mlx.settings import Settings

# --- rule 1: one loopback URL --------------------------------------------------------


@pytest.mark.parametrize(("host", "url"), [
    ("127.0.0.1", "http://127.0.0.1:8177"),
    ("0.0.0.0", "http://127.0.0.1:8177"),
    ("::", "http://127.0.0.1:8177"),
    ("", "http://127.0.0.1:8177"),
    ("::1", "http://[::1]:8177"),
    ("[::1]", "http://[::1]:8177"),       # given bracketed: bracketed once
    ("fe80::1", "http://[fe80::1]:8177"),
    ("localhost", "http://localhost:8177"),
    ("192.168.1.20", "http://192.168.1.20:8177"),
])
def test_local_url(host: str, url: str) -> None:
    assert local_url(host, 8177) == url


def test_tls_makes_it_https() -> None:
    assert local_url("0.0.0.0", 9443, tls=True) == "https://127.0.0.1:9443"
    settings = Settings(host="::1", port=9443, ssl_certfile="c.pem", ssl_keyfile="k.pem")
    assert daemon_url(settings) == "https://[::1]:9443"


def test_a_url_flag_wins_without_its_trailing_slash() -> None:
    assert daemon_url(Settings(port=1), "http://box.local:7/") == "http://box.local:7"


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0", "::", "::1", "[::1]", "localhost"])
def test_service_status_probes_where_chat_and_open_talk(tmp_path: Path, host: str) -> None:
    """The rule the two copies used to disagree on (service.py bracketed "[::1]" twice)."""
    settings = Settings(host=host, port=8190, config_dir=str(tmp_path))
    plan = plan_service(settings, key_file=tmp_path / "key", log_dir=tmp_path)
    assert plan.health_url == daemon_url(settings) + "/health"


# --- rules 2 and 3: one prober --------------------------------------------------------


def serve(status: int, body: bytes) -> http.server.HTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status if self.path == "/health" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def answering(request: pytest.FixtureRequest) -> Iterator[str]:
    status, body = request.param
    server = serve(status, body)
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


LOADING = b'{"state": "loading", "progress": {"model": "smollm2", "phase": "convert"}}'


@pytest.mark.parametrize(("answering", "health", "answers"), [
    ((200, b'{"state": "ready", "model": "tiny"}'), Health.READY, True),
    ((503, LOADING), Health.LOADING, True),
    ((503, b'{"state": "draining"}'), Health.LOADING, True),
    ((200, b'{"status": "ok"}'), Health.FOREIGN, False),
    ((404, b"<html>not here</html>"), Health.FOREIGN, False),
], indirect=["answering"])
def test_what_answers(answering: str, health: Health, answers: bool) -> None:
    found = probe(answering)
    assert found.health is health and found.answers is answers
    assert daemon_answers(answering) is answers


def test_a_loading_daemon_says_what_it_loads() -> None:
    server = serve(503, LOADING)
    try:
        found = probe(f"http://127.0.0.1:{server.server_address[1]}")
    finally:
        server.shutdown()
    assert found.detail == "state 'loading', loading smollm2: convert"
    assert found.body["state"] == "loading"


def test_nothing_listening_is_absent() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    found = probe(f"http://127.0.0.1:{port}")
    assert found.health is Health.ABSENT and found.detail == "connection refused"
    assert not found.answers


def test_a_port_that_accepts_but_never_answers_is_silent() -> None:
    with socket.socket() as sock:  # listening, never accept()ed: the kernel completes connects
        sock.bind(("127.0.0.1", 0))
        sock.listen(8)
        found = probe(f"http://127.0.0.1:{sock.getsockname()[1]}", timeout_s=0.3)
    assert found.health is Health.SILENT and "within 0.3 s" in found.detail
