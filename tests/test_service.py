"""`frink-mlx service ...`: rendered templates, and the exact launchctl/systemctl sequence.

The service managers are fakes on PATH that append their argv to a log and keep
just enough state ("loaded"/"active") for the verbs to branch the way the real
ones would.
"""

from __future__ import annotations

import argparse
import http.server
import os
import plistlib
import shlex
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from frink_mlx.cli import service
from frink_mlx.cli.service import plan_service, render_plist, render_unit, service_command
from frink_mlx.errors import ConfigError
from frink_mlx.settings import Settings

REPO = Path(__file__).resolve().parent.parent
UID = os.getuid()
TARGET = f"gui/{UID}/dev.frink.mlx"

FAKE_LAUNCHCTL = """#!/bin/sh
echo "launchctl $*" >> "$FAKE_LOG"
case "$1" in
  print) if [ -f "$FAKE_STATE/loaded" ]; then
           printf '%s\\n' "$2 = {" "	state = running" "	pid = 4242" "	runs = 1" "}"; exit 0
         fi
         echo "Could not find service" >&2; exit 113;;
  bootstrap) touch "$FAKE_STATE/loaded";;
  bootout) rm -f "$FAKE_STATE/loaded";;
esac
exit 0
"""

FAKE_SYSTEMCTL = """#!/bin/sh
echo "systemctl $*" >> "$FAKE_LOG"
case "$2" in
  restart|start) touch "$FAKE_STATE/active";;
  stop) rm -f "$FAKE_STATE/active";;
  disable) rm -f "$FAKE_STATE/active";;
  is-active) if [ -f "$FAKE_STATE/active" ]; then echo active; exit 0; fi; echo inactive; exit 3;;
esac
exit 0
"""

FAKE_JOURNALCTL = """#!/bin/sh
echo "journalctl $*" >> "$FAKE_LOG"
echo "Nov 29 frink-mlx[42]: frink-mlx ready on http://127.0.0.1:8177"
"""


class Fakes:
    def __init__(self, root: Path) -> None:
        self.bin, self.state, self.log = root / "bin", root / "state", root / "calls.log"
        self.bin.mkdir(parents=True)
        self.state.mkdir()
        for name, text in (("launchctl", FAKE_LAUNCHCTL), ("systemctl", FAKE_SYSTEMCTL),
                           ("journalctl", FAKE_JOURNALCTL)):
            path = self.bin / name
            path.write_text(text)
            path.chmod(0o755)

    def calls(self) -> list[str]:
        lines = self.log.read_text().splitlines() if self.log.exists() else []
        self.log.unlink(missing_ok=True)
        return lines


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Fakes:
    f = Fakes(tmp_path / "fakes")
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "xdg"))
    monkeypatch.setenv("PATH", f"{f.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_LOG", str(f.log))
    monkeypatch.setenv("FAKE_STATE", str(f.state))
    return f


def unused_port() -> int:
    """A port nothing listens on (bound once, then closed): status probes it and finds no
    daemon, whatever runs on this machine's default port."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def settings_for(tmp_path: Path, **kw: object) -> Settings:
    kw.setdefault("port", unused_port())
    return Settings(config_dir=str(tmp_path / "home" / "cfg"),  # type: ignore[arg-type]
                    cache_dir=str(tmp_path / "home" / "cache"), **kw)


def verb(action: str, backend: str, **kw: object) -> argparse.Namespace:
    return argparse.Namespace(action=action, backend=backend, generate_key=False, lines=50,
                              follow=False, **kw)


# --- rendering -----------------------------------------------------------------

def odd_plan(tmp_path: Path):
    weird = tmp_path / "a&b <c> 'd'"
    s = Settings(config_dir=str(weird / "cfg"), models_path=str(weird / "models.toml"),
                 port=9123, drain_timeout_s=12.0)
    return plan_service(s, key_file=weird / "key", log_dir=weird / "logs",
                        python="/opt/venv dir/bin/python")


def test_plist_round_trips_through_plistlib(tmp_path: Path) -> None:
    plan = odd_plan(tmp_path)
    data = plistlib.loads(render_plist(plan).encode())
    assert data["Label"] == "dev.frink.mlx"
    assert data["ProgramArguments"] == [
        "/opt/venv dir/bin/python", "-m", "frink_mlx.cli", "serve", "--host", "127.0.0.1",
        "--port", "9123", "--api-key-file", str(tmp_path / "a&b <c> 'd'" / "key")]
    assert data["RunAtLoad"] is True
    assert data["KeepAlive"] == {"SuccessfulExit": False}
    assert data["ThrottleInterval"] == 10 and data["ExitTimeOut"] == 17
    assert data["ProcessType"] == "Interactive"
    env = data["EnvironmentVariables"]
    assert env["FRINK_MLX_MODELS"] == str(tmp_path / "a&b <c> 'd'" / "models.toml")
    assert env["PYTHONUNBUFFERED"] == "1"
    assert data["StandardOutPath"] == data["StandardErrorPath"] == str(plan.log_file)


@pytest.mark.skipif(shutil.which("plutil") is None, reason="plutil is macOS-only")
def test_plist_passes_plutil_lint(tmp_path: Path) -> None:
    path = tmp_path / "dev.frink.mlx.plist"
    path.write_text(render_plist(odd_plan(tmp_path)))
    subprocess.run(["plutil", "-lint", str(path)], check=True)


def test_systemd_unit_rendering(tmp_path: Path) -> None:
    plan = odd_plan(tmp_path)
    unit = render_unit(plan)
    lines = unit.splitlines()
    exec_start = next(line for line in lines if line.startswith("ExecStart="))
    assert shlex.split(exec_start.removeprefix("ExecStart=")) == list(plan.program_args)
    assert "Restart=on-failure" in lines and "RestartSec=10" in lines
    assert "TimeoutStopSec=17" in lines and "WantedBy=default.target" in lines
    assert f'Environment="FRINK_MLX_MODELS={tmp_path}/a&b <c> \'d\'/models.toml"' in lines
    assert "@" not in "".join(line for line in lines if not line.startswith("#"))
    assert service.systemd_quote('50% of $HOME "x"') == '"50%% of $$HOME \\"x\\""'


def test_the_service_raises_the_open_files_limit_to_fit_the_connection_cap(tmp_path: Path
                                                                          ) -> None:
    """Rule 6: launchd starts agents with 256 open files; every connection is one."""
    data = plistlib.loads(render_plist(odd_plan(tmp_path)).encode())
    assert data["SoftResourceLimits"] == data["HardResourceLimits"] == {"NumberOfFiles": 4096}
    assert "LimitNOFILE=4096" in render_unit(odd_plan(tmp_path)).splitlines()
    many = plan_service(Settings(config_dir=str(tmp_path), max_connections=8000), key_file=None,
                        log_dir=tmp_path)
    assert many.open_files == 8512
    assert plistlib.loads(render_plist(many).encode())["SoftResourceLimits"] == {
        "NumberOfFiles": 8512}


def test_access_lines_go_to_their_own_rotated_file_on_macos(tmp_path: Path) -> None:
    """Rule 7: the file launchd appends to never rotates; the access log does."""
    plan = plan_service(Settings(config_dir=str(tmp_path)), key_file=None, log_dir=tmp_path,
                        access_log_file=tmp_path / "access.log")
    at = plan.program_args.index("--access-log-file")
    assert plan.program_args[at + 1] == str(tmp_path / "access.log")
    journal = plan_service(Settings(config_dir=str(tmp_path)), key_file=None, log_dir=tmp_path)
    assert "--access-log-file" not in journal.program_args


def test_a_tls_service_gets_its_certificate_paths_and_probes_https(tmp_path: Path) -> None:
    s = Settings(config_dir=str(tmp_path), ssl_certfile=str(tmp_path / "c.pem"),
                 ssl_keyfile=str(tmp_path / "k.pem"), port=9443)
    plan = plan_service(s, key_file=None, log_dir=tmp_path)
    assert list(plan.program_args[-4:]) == ["--ssl-certfile", str(tmp_path / "c.pem"),
                                            "--ssl-keyfile", str(tmp_path / "k.pem")]
    assert plan.health_url == "https://127.0.0.1:9443/health"


def test_a_rank_of_a_group_of_macs_is_installed_with_its_hostfile_and_rank(tmp_path: Path) -> None:
    hostfile = tmp_path / "ring.json"
    s = Settings(config_dir=str(tmp_path), distributed_hostfile=str(hostfile), distributed_rank=1,
                 distributed_backend="jaccl", distributed_split="pipeline")
    plan = plan_service(s, key_file=None, log_dir=tmp_path)
    assert list(plan.program_args[-10:]) == ["--distributed", str(hostfile), "--rank", "1",
                                             "--distributed-backend", "jaccl",
                                             "--distributed-split", "pipeline",
                                             "--distributed-secret-file",
                                             str(tmp_path / "group_secret")]
    one = plan_service(Settings(config_dir=str(tmp_path)), key_file=None, log_dir=tmp_path)
    assert "--distributed" not in one.program_args
    assert "--distributed-secret-file" not in one.program_args


def test_non_loopback_install_needs_key_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--generate-key"):
        plan_service(Settings(host="0.0.0.0", config_dir=str(tmp_path)), key_file=None,
                     log_dir=tmp_path)


# --- command sequences ------------------------------------------------------------

def test_installing_a_rank_writes_the_group_secret_once_and_passes_its_path(
        tmp_path: Path, fakes: Fakes) -> None:
    """Rule 8: a 0600 secret beside the key, kept on re-install; its path, not its
    content, in the plist (LaunchAgents are world-readable)."""
    settings = settings_for(tmp_path, distributed_hostfile=str(tmp_path / "ring.json"),
                            distributed_rank=0)
    plist = tmp_path / "home" / "Library" / "LaunchAgents" / "dev.frink.mlx.plist"
    secret = tmp_path / "home" / "cfg" / "group_secret"
    assert service_command(settings, verb("install", "launchd")) == 0
    assert stat.S_IMODE(secret.stat().st_mode) == 0o600 and len(secret.read_text().strip()) == 64
    first = secret.read_text()
    args = plistlib.loads(plist.read_bytes())["ProgramArguments"]
    assert args[args.index("--distributed-secret-file") + 1] == str(secret)
    assert first.strip() not in plist.read_text()
    assert service_command(settings, verb("install", "launchd")) == 0
    assert secret.read_text() == first
    secret.chmod(0o644)   # a copied file left readable is refused, not silently used
    with pytest.raises(ConfigError, match="chmod 600"):
        service_command(settings, verb("install", "launchd"))


def test_launchd_verbs(tmp_path: Path, fakes: Fakes) -> None:
    settings = settings_for(tmp_path)
    plist = tmp_path / "home" / "Library" / "LaunchAgents" / "dev.frink.mlx.plist"
    key = tmp_path / "home" / "cfg" / "api_key"
    args = verb("install", "launchd")
    args.generate_key = True
    assert service_command(settings, args) == 0
    assert fakes.calls() == [f"launchctl print {TARGET}", f"launchctl enable {TARGET}",
                             f"launchctl bootstrap gui/{UID} {plist}"]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and key.read_text().startswith("frk-")
    assert str(key) in plistlib.loads(plist.read_bytes())["ProgramArguments"]
    assert (tmp_path / "home" / "Library" / "Logs" / "frink-mlx").is_dir()

    first_key = key.read_text()
    assert service_command(settings, args) == 0  # re-install reloads, keeps the key
    assert fakes.calls() == [f"launchctl print {TARGET}", f"launchctl bootout {TARGET}",
                             f"launchctl enable {TARGET}", f"launchctl bootstrap gui/{UID} {plist}"]
    assert key.read_text() == first_key

    assert service_command(settings, verb("stop", "launchd")) == 0
    assert fakes.calls() == [f"launchctl print {TARGET}", f"launchctl bootout {TARGET}"]
    assert service_command(settings, verb("start", "launchd")) == 0
    assert fakes.calls() == [f"launchctl print {TARGET}", f"launchctl bootstrap gui/{UID} {plist}",
                             f"launchctl kickstart {TARGET}"]
    assert service_command(settings, verb("status", "launchd")) == 3  # nothing on /health
    assert fakes.calls() == [f"launchctl print {TARGET}"]
    assert service_command(settings, verb("uninstall", "launchd")) == 0
    assert fakes.calls() == [f"launchctl print {TARGET}", f"launchctl bootout {TARGET}"]
    assert not plist.exists() and key.exists()
    with pytest.raises(ConfigError, match="not installed"):
        service_command(settings, verb("start", "launchd"))


def test_systemd_verbs(tmp_path: Path, fakes: Fakes, capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_for(tmp_path, models_path=str(tmp_path / "m.toml"))
    unit = tmp_path / "home" / "xdg" / "systemd" / "user" / "frink-mlx.service"
    assert service_command(settings, verb("install", "systemd")) == 0
    assert fakes.calls() == ["systemctl --user daemon-reload",
                             "systemctl --user enable frink-mlx.service",
                             "systemctl --user restart frink-mlx.service"]
    text = unit.read_text()
    assert "--api-key-file" not in text  # no key file: loopback service without auth
    assert f'Environment="FRINK_MLX_MODELS={tmp_path}/m.toml"' in text
    assert service_command(settings, verb("stop", "systemd")) == 0
    assert fakes.calls() == ["systemctl --user stop frink-mlx.service"]
    assert service_command(settings, verb("start", "systemd")) == 0
    assert fakes.calls() == ["systemctl --user start frink-mlx.service"]
    assert service_command(settings, verb("status", "systemd")) == 3
    assert fakes.calls() == ["systemctl --user is-active frink-mlx.service"]
    capsys.readouterr()
    assert service_command(settings, verb("logs", "systemd")) == 0
    assert fakes.calls() == ["journalctl --user -u frink-mlx.service -n 50 --no-pager"]
    assert "ready on" in capsys.readouterr().out
    assert service_command(settings, verb("uninstall", "systemd")) == 0
    assert fakes.calls() == ["systemctl --user disable --now frink-mlx.service",
                             "systemctl --user daemon-reload"]
    assert not unit.exists()


def serve_health(body: bytes) -> http.server.HTTPServer:
    """A server on a free loopback port answering /health 200 with `body` (else 404)."""
    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.fixture
def health_server() -> Iterator[int]:
    server = serve_health(b'{"state": "ready", "model": "tiny", "generation": 1}')
    yield server.server_address[1]
    server.shutdown()


def test_status_reads_launchctl_and_health(tmp_path: Path, fakes: Fakes, health_server: int,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_for(tmp_path, port=health_server)
    service_command(settings, verb("install", "launchd"))
    fakes.calls()
    capsys.readouterr()
    assert service_command(settings, verb("status", "launchd")) == 0
    out = capsys.readouterr().out
    assert "state = running; pid = 4242" in out and '"state": "ready"' in out


def test_status_of_something_else_on_the_port_is_not_running(
        tmp_path: Path, fakes: Fakes, capsys: pytest.CaptureFixture[str]) -> None:
    """Rule 4 with local_daemon.py rule 3: JSON without frink's `state` is FOREIGN, as
    `chat` reads it, so `status` does not call it the daemon."""
    server = serve_health(b'{"status": "ok"}')
    try:
        settings = settings_for(tmp_path, port=server.server_address[1])
        service_command(settings, verb("install", "launchd"))
        capsys.readouterr()
        assert service_command(settings, verb("status", "launchd")) == 3
        assert "not a frink-mlx daemon" in capsys.readouterr().out
    finally:
        server.shutdown()


def test_status_reports_a_daemon_that_is_still_loading(tmp_path: Path, fakes: Fakes,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    class Loading(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"state": "loading", "progress": {"model": "smollm2", "phase": "loading"}}'
            self.send_response(503)
            self.send_header("retry-after", "2")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Loading)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        settings = settings_for(tmp_path, port=server.server_address[1])
        service_command(settings, verb("install", "launchd"))
        capsys.readouterr()
        assert service_command(settings, verb("status", "launchd")) == 0
        assert '"state": "loading"' in capsys.readouterr().out
    finally:
        server.shutdown()


def test_launchd_logs_tail(tmp_path: Path, fakes: Fakes,
                           capsys: pytest.CaptureFixture[str]) -> None:
    settings = settings_for(tmp_path)
    log = tmp_path / "home" / "Library" / "Logs" / "frink-mlx" / "frink-mlx.log"
    log.parent.mkdir(parents=True)
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    args = verb("logs", "launchd")
    args.lines = 3
    assert service_command(settings, args) == 0
    assert capsys.readouterr().out == "line 97\nline 98\nline 99\n"


def test_make_install_service_calls_the_command(tmp_path: Path, fakes: Fakes) -> None:
    if shutil.which("make") is None:
        pytest.skip("make not installed")
    bin_dir = tmp_path / "venvbin"
    bin_dir.mkdir()
    entry = bin_dir / "frink-mlx"
    entry.write_text(f'#!/bin/sh\nPYTHONPATH="{REPO}" exec "{sys.executable}" '
                     f'-m frink_mlx.cli "$@" --backend systemd\n')
    entry.chmod(0o755)
    stamp = tmp_path / "stamp"
    stamp.touch()
    env = {**os.environ, "FRINK_MLX_CONFIG_DIR": str(tmp_path / "home" / "cfg"),
           "FRINK_MLX_CACHE_DIR": str(tmp_path / "home" / "cache")}
    done = subprocess.run(["make", "-s", "install-service", f"BIN={bin_dir}", f"STAMP={stamp}"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert fakes.calls() == ["systemctl --user daemon-reload",
                             "systemctl --user enable frink-mlx.service",
                             "systemctl --user restart frink-mlx.service"]
    assert (tmp_path / "home" / "xdg" / "systemd" / "user" / "frink-mlx.service").exists()
