"""HTTPS: `frink-mlx serve --ssl-certfile --ssl-keyfile` (cli/serve.py rule 11), with a
self-signed certificate made here by `openssl`; and http/security.py's TLS checks."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from daemon_support import DaemonProcess, write_registry

from frink_mlx.errors import ConfigError
from frink_mlx.http.binding import check_bind
from frink_mlx.settings import Settings

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def self_signed(root: Path) -> tuple[Path, Path]:
    cert, key = root / "cert.pem", root / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    key.chmod(0o600)
    return cert, key


@pytest.fixture(scope="module")
def tls_daemon(tmp_path_factory: pytest.TempPathFactory, tiny_llama_dir: Path
               ) -> Iterator[tuple[DaemonProcess, Path]]:
    root = tmp_path_factory.mktemp("tls")
    cert, key = self_signed(root)
    proc = DaemonProcess(root, "--models", str(write_registry(root, tiny_llama_dir, tiny_llama_dir)),
                         ssl_certfile=cert, ssl_keyfile=key)
    proc.ready()
    yield proc, cert
    assert proc.terminate() == 0


def test_the_daemon_serves_https_and_its_ready_line_says_so(tls_daemon: tuple[DaemonProcess, Path]
                                                            ) -> None:
    daemon, cert = tls_daemon
    assert daemon.url.startswith("https://127.0.0.1:")
    with httpx.Client(verify=str(cert), timeout=60) as client:
        assert client.get(daemon.url + "/health").status_code == 200
        body = {"model": "tiny-a", "messages": [{"role": "user", "content": "Hi"}],
                "max_tokens": 4, "stream": True, "ignore_eos": True}
        with client.stream("POST", daemon.url + "/v1/chat/completions", json=body) as r:
            frames = [line for line in r.iter_lines() if line.startswith("data: ")]
    assert frames[-1] == "data: [DONE]"
    assert json.loads(frames[-2][6:])["choices"][0]["finish_reason"] == "length"
    with pytest.raises(httpx.HTTPError):  # cleartext HTTP is not served on that port
        httpx.get(daemon.url.replace("https://", "http://") + "/health", timeout=10).raise_for_status()


def test_half_a_tls_pair_or_an_unreadable_file_is_refused(tmp_path: Path) -> None:
    cert, key = self_signed(tmp_path)
    with pytest.raises(ConfigError, match="--ssl-certfile needs --ssl-keyfile"):
        check_bind(Settings(config_dir=str(tmp_path), ssl_certfile=str(cert)))
    with pytest.raises(ConfigError, match="cannot read"):
        check_bind(Settings(config_dir=str(tmp_path), ssl_certfile=str(cert),
                            ssl_keyfile=str(tmp_path / "missing.pem")))
    check_bind(Settings(config_dir=str(tmp_path), ssl_certfile=str(cert), ssl_keyfile=str(key)))


def test_a_non_loopback_bind_without_tls_is_one_warning(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    cert, key = self_signed(tmp_path)
    with caplog.at_level(logging.WARNING, logger="frink_mlx.http"):
        check_bind(Settings(config_dir=str(tmp_path), host="0.0.0.0", api_key="k" * 16))
        assert [r.getMessage() for r in caplog.records if "cleartext" in r.getMessage()]
        caplog.clear()
        check_bind(Settings(config_dir=str(tmp_path), host="0.0.0.0", api_key="k" * 16,
                            ssl_certfile=str(cert), ssl_keyfile=str(key)))
        check_bind(Settings(config_dir=str(tmp_path)))  # loopback: nothing to say
    assert not [r for r in caplog.records if "cleartext" in r.getMessage()]
