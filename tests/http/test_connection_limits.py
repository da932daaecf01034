"""Connection and log limits on real sockets against `frink-mlx serve`: the connection cap
(http/timeouts.py rule 7), the open-files limit (cli/serve.py rule 9), the rotated access log
(cli/serve.py rule 10) and what strangers can make it log (http/access.py rule 9); none of
them stalls a neighbour (tests/stall_support.py)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlparse

import httpx
import pytest
from daemon_support import (
    ROOT,
    DaemonProcess,
    flood_at_the_cap,
    write_registry,
)
from stall_support import assert_nobody_stalled

from frink_mlx.http.log_budget import LogBudget

CAP = 4
MAX_BYTES = 4000


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
           ) -> Iterator[DaemonProcess]:
    root = tmp_path_factory.mktemp("limits")
    proc = DaemonProcess(root, "--models", str(write_registry(root, tiny_llama_dir, tiny_llama_dir)),
                         max_connections=CAP, access_log_file=root / "logs" / "access.log",
                         access_log_max_bytes=MAX_BYTES, access_log_backups=2)
    proc.ready()
    proc.access_log = root / "logs" / "access.log"  # type: ignore[attr-defined]
    yield proc
    assert proc.terminate() == 0


def connect(daemon: DaemonProcess) -> socket.socket:
    url = urlparse(daemon.url)
    return socket.create_connection((url.hostname, url.port), timeout=10)


def read_all(sock: socket.socket) -> bytes:
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def access_lines(daemon: DaemonProcess) -> list[dict[str, object]]:
    base: Path = daemon.access_log  # type: ignore[attr-defined]
    lines = []
    for path in sorted(base.parent.glob(base.name + "*"), reverse=True):
        lines += [json.loads(line[line.index("{"):]) for line in path.read_text().splitlines()]
    return lines


def test_a_connection_past_the_cap_gets_503_before_sending_a_byte(daemon: DaemonProcess) -> None:
    held = [connect(daemon) for _ in range(CAP)]
    try:
        time.sleep(0.2)
        with connect(daemon) as extra:
            started = time.monotonic()
            answer = read_all(extra)  # nothing sent: the refusal does not wait for headers
            took = time.monotonic() - started
        assert answer.startswith(b"HTTP/1.1 503 ") and b"retry-after: 1" in answer
        assert took < 5
        with connect(daemon) as extra:  # a client that does send its request gets it too
            extra.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert read_all(extra).startswith(b"HTTP/1.1 503 ")
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert httpx.get(daemon.url + "/health", timeout=10).status_code == 200
    assert "max_connections 4" in daemon.log()


def test_the_open_files_limit_is_raised_to_fit_the_cap() -> None:
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_NOFILE, (64, "
            "resource.getrlimit(resource.RLIMIT_NOFILE)[1]));"
            "from frink_mlx.cli.serve import raise_open_files; raise_open_files(512);"
            "print(resource.getrlimit(resource.RLIMIT_NOFILE)[0])")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=60, check=True)
    import resource

    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    wanted = 512 + 256
    assert int(done.stdout) == (wanted if hard == resource.RLIM_INFINITY else min(wanted, hard))


def test_pre_auth_refusals_are_rate_limited_and_their_paths_cut(daemon: DaemonProcess) -> None:
    before = len([x for x in access_lines(daemon) if x["status"] == 421])
    with httpx.Client(timeout=10) as client:
        for k in range(60):
            r = client.get(daemon.url + "/v1/models/" + "x" * 16_000 + str(k),
                           headers={"host": "evil.example"})
            assert r.status_code == 421
    time.sleep(0.5)
    refused = [x for x in access_lines(daemon) if x["status"] == 421][before:]
    assert 0 < len(refused) <= LogBudget().burst
    assert all(len(str(x["path"])) < 300 and "...(+" in str(x["path"]) for x in refused)
    metrics = httpx.get(daemon.url + "/metrics", timeout=10).text
    assert 'frink_requests_rejected_total{reason="host"} 60.0' in metrics


def test_refusals_and_connections_past_the_cap_stall_nobody(daemon: DaemonProcess) -> None:
    """Issue 32, what must hold, on the daemon as a process: while strangers are refused
    (a foreign Host with a 16 KiB path) and connections past the cap get their 503 -- the
    cap is filled with idle ones first, beside the neighbour's, the poller's and the
    flood's own -- a neighbour streams with the TTFT it has alone and /health answers
    within 100 ms (tests/stall_support.py)."""
    heads: list[bytes] = []

    def foreign_hosts(client: httpx.Client, k: int) -> None:
        for _ in range(3):
            r = client.get("/v1/models/" + "x" * 16_000 + str(k), headers={"host": "evil.example"})
            assert r.status_code == 421

    def flood() -> None:
        heads.extend(flood_at_the_cap(daemon.url, CAP, 30, foreign_hosts))

    assert_nobody_stalled(daemon.url, flood, model="tiny-a")
    assert heads and set(heads) == {b"HTTP/1.1 503 Service Unavailable"}, heads


def test_the_access_log_rotates_by_size_and_keeps_its_backups(daemon: DaemonProcess) -> None:
    with httpx.Client(timeout=10) as client:
        for _ in range(80):  # about 200 bytes a line: several times MAX_BYTES
            assert client.get(daemon.url + "/health").status_code == 200
    time.sleep(0.5)
    base: Path = daemon.access_log  # type: ignore[attr-defined]
    files = sorted(p.name for p in base.parent.iterdir())
    assert files == ["access.log", "access.log.1", "access.log.2"]
    assert all(p.stat().st_size <= MAX_BYTES for p in base.parent.iterdir())
    assert '"route":"/health"' in base.read_text()
    assert '"route":"/health"' not in daemon.log()  # access lines left stderr


def test_log_budget_counts_what_it_suppressed() -> None:
    now = [0.0]
    budget = LogBudget(burst=2, window_s=10.0, clock=lambda: now[0])
    assert [budget.take() for _ in range(4)] == [(True, 0), (True, 0), (False, 0), (False, 0)]
    now[0] = 10.0
    assert budget.take() == (True, 2) and budget.take() == (True, 0)


def test_limits_log_nothing_at_error(daemon: DaemonProcess) -> None:
    assert daemon.log_lines_at("ERROR") == []
