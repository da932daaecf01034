"""`frink-mlx open`: the page's URL from the settings, opened only when a daemon answers."""

from __future__ import annotations

import argparse
import io
import socket

import pytest
from daemon_support import start_server

from frink_mlx.app import create_app
from frink_mlx.cli.main import build_parser
from frink_mlx.cli.open import open_command
from frink_mlx.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["open", *argv])


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory):
    settings = Settings(config_dir=str(tmp_path_factory.mktemp("cfg")), access_log=False)
    server = start_server(create_app(settings, load_default=False))
    yield server
    server.stop()


def test_opens_the_configured_address(live) -> None:
    port = int(live.url.rsplit(":", 1)[1])
    opened: list[str] = []
    out = io.StringIO()
    settings = Settings(port=port)
    rc = open_command(settings, args(), out=out, opener=lambda url: opened.append(url) or True)
    assert rc == 0 and opened == [f"http://127.0.0.1:{port}/"]
    assert out.getvalue().strip() == f"opened http://127.0.0.1:{port}/"


def test_wildcard_bind_and_print(live) -> None:
    port = int(live.url.rsplit(":", 1)[1])
    out = io.StringIO()
    settings = Settings(host="0.0.0.0", port=port)
    rc = open_command(settings, args("--print"), out=out, opener=lambda url: pytest.fail(url))
    assert rc == 0 and out.getvalue().strip() == f"http://127.0.0.1:{port}/"


def test_no_daemon_is_an_error_with_a_hint(capsys: pytest.CaptureFixture[str]) -> None:
    port = free_port()
    rc = open_command(Settings(port=port), args(), opener=lambda url: pytest.fail(url))
    assert rc == 1
    assert "no daemon answers" in capsys.readouterr().err
    opened: list[str] = []
    rc = open_command(Settings(port=port), args("--no-check"), out=io.StringIO(),
                      opener=lambda url: opened.append(url) or True)
    assert rc == 0 and opened == [f"http://127.0.0.1:{port}/"]


def test_ipv6_literal_and_explicit_url() -> None:
    out = io.StringIO()
    assert open_command(Settings(host="::1", port=9), args("--print", "--no-check"), out=out) == 0
    assert out.getvalue().strip() == "http://[::1]:9/"
    out = io.StringIO()
    rc = open_command(Settings(), args("--print", "--no-check", "--url", "http://localhost:7/"),
                      out=out)
    assert rc == 0 and out.getvalue().strip() == "http://localhost:7/"


def test_a_browser_that_will_not_start(live, capsys: pytest.CaptureFixture[str]) -> None:
    port = int(live.url.rsplit(":", 1)[1])
    assert open_command(Settings(port=port), args(), opener=lambda url: False) == 1
    assert "open http://127.0.0.1" in capsys.readouterr().err
