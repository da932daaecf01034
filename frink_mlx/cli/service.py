"""`frink-mlx service install|uninstall|start|stop|status|logs`: run the daemon as a user service.

The daemon lives in the background for months, so installing it must be one
command and must not weaken its defaults. On macOS the verbs drive a
LaunchAgent (`launchd/dev.frink.mlx.plist.in` rendered into
~/Library/LaunchAgents, loaded with `launchctl bootstrap gui/$UID`); on Linux
the same verbs drive a systemd `--user` unit (`launchd/frink-mlx.service.in`
rendered into ~/.config/systemd/user).

Rules:
1. The service runs the venv's absolute interpreter (`sys.executable -m
   frink_mlx.cli serve`) bound to `settings.host`/`settings.port`, so it runs
   the same code and models as the shell that installed it.
2. A secret never goes into the plist/unit (LaunchAgents are world-readable);
   the service gets `--api-key-file`, a 0600 file that `--generate-key`
   creates (default `<config_dir>/api_key`) and `frink-mlx chat` reads.
   Installing for a non-loopback host without such a file is refused.
3. Restart on crash only; a clean SIGTERM drain (exit 0) stays stopped. The
   stop deadline is the drain deadline plus a margin.
4. `status` reports the service manager's view and `GET /health` at the
   address `chat` uses (local_daemon.py rules 1-3, the one prober); exit 0
   when the daemon answers (its state -- ready, loading with progress,
   draining -- is in the body it prints, whatever the status code), 3 (LSB
   "not running") when nothing answers or what answers is not frink-mlx.
5. Templates are read from `launchd/` next to the package (source checkout or
   editable install, which is what `make install-service` uses).
6. Open files: both templates raise the service's open-files limit, soft and
   hard, to `max_connections` plus a reserve (at least OPEN_FILES_MIN):
   launchd's `SoftResourceLimits` / `HardResourceLimits` `NumberOfFiles`
   (macOS starts agents with 256), systemd's `LimitNOFILE`.
7. Logs: on macOS the access lines go to `access.log` beside the service's
   log, rotated by size (serve.py rule 10), so the log launchd appends to
   without rotating holds the daemon's own lines only; systemd's journal
   rotates itself (an `access_log_file` given at install is kept either way).
8. A rank of a group (`--distributed`): `install` writes the group's shared
   secret (`distributed_secret_file`, default `<config_dir>/group_secret`,
   mode 0600) unless one is there, and passes its path, never its content,
   to the service (backend/trust.py). Every rank needs the same file: copy
   the one written on the first Mac to the others before installing them.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import frink_mlx

from ..backend.trust import ensure_secret
from ..errors import ConfigError
from ..http.binding import default_key_file, is_loopback_host, read_key_file
from ..settings import Settings, user_config_home
from .local_daemon import local_url, probe

LABEL = "dev.frink.mlx"
UNIT = "frink-mlx.service"
TEMPLATE_DIR = Path(frink_mlx.__file__).resolve().parent.parent / "launchd"
THROTTLE_INTERVAL_S = 10
STOP_MARGIN_S = 5
NOT_RUNNING = 3
OPEN_FILES_MIN = 4096
OPEN_FILES_RESERVE = 512


@dataclass(frozen=True, slots=True)
class ServicePlan:
    """Everything a template needs, decided once from Settings."""

    program_args: tuple[str, ...]
    environment: dict[str, str]
    working_directory: Path
    log_file: Path
    port: int
    url: str                     # where the service answers (local_daemon.py rule 1)
    key_file: Path | None
    exit_timeout_s: int
    open_files: int = OPEN_FILES_MIN

    @property
    def health_url(self) -> str:
        return self.url + "/health"


def plan_service(settings: Settings, *, key_file: Path | None, log_dir: Path,
                 python: str = sys.executable, access_log_file: Path | None = None
                 ) -> ServicePlan:
    """`access_log_file`: where the service writes access lines (rule 7); None: stderr."""
    if not is_loopback_host(settings.host) and key_file is None:
        raise ConfigError(f"refusing to install a service listening on {settings.host} without "
                          "an API key file; add --generate-key")
    args = [str(Path(python).absolute()), "-m", "frink_mlx.cli", "serve",
            "--host", settings.host, "--port", str(settings.port)]
    if key_file is not None:
        args += ["--api-key-file", str(key_file)]
    args += _distributed_args(settings)
    for flag, path in (("--ssl-certfile", settings.ssl_certfile),
                       ("--ssl-keyfile", settings.ssl_keyfile)):
        if path:  # paths only: the key stays in its own (0600) file
            args += [flag, str(Path(path).expanduser().absolute())]
    access = settings.access_log_file or access_log_file
    if access:
        args += ["--access-log-file", str(Path(access).expanduser().absolute())]
    env = {"PYTHONUNBUFFERED": "1", "FRINK_MLX_CONFIG_DIR": settings.config_dir}
    if settings.models_path:
        env["FRINK_MLX_MODELS"] = str(Path(settings.models_path).expanduser().absolute())
    package_root = Path(frink_mlx.__file__).resolve().parent.parent
    if package_root.name != "site-packages":  # source checkout: make the package importable
        env["PYTHONPATH"] = str(package_root)
    return ServicePlan(
        program_args=tuple(args), environment=env,
        working_directory=Path(settings.config_dir), log_file=log_dir / "frink-mlx.log",
        port=settings.port, url=local_url(settings.host, settings.port,
                                          tls=bool(settings.ssl_certfile)),
        key_file=key_file, exit_timeout_s=int(settings.drain_timeout_s) + STOP_MARGIN_S,
        open_files=max(OPEN_FILES_MIN, settings.max_connections + OPEN_FILES_RESERVE))


def _distributed_args(settings: Settings) -> list[str]:
    """One rank of a group of Macs (README, "Several Macs"); nothing on one machine."""
    args: list[str] = []
    if settings.distributed_hostfile:
        args += ["--distributed", str(Path(settings.distributed_hostfile).expanduser().absolute())]
    if settings.distributed_rank is not None:
        args += ["--rank", str(settings.distributed_rank)]
    if settings.distributed and settings.distributed_backend != "ring":
        args += ["--distributed-backend", settings.distributed_backend]
    if settings.distributed and settings.distributed_split != "auto":
        args += ["--distributed-split", settings.distributed_split]
    if settings.distributed:  # rule 8: the path only
        args += ["--distributed-secret-file",
                 str(Path(settings.group_secret_file()).expanduser().absolute())]
    return args


# --- rendering ---------------------------------------------------------------

def _fill(template_name: str, values: dict[str, str]) -> str:
    path = TEMPLATE_DIR / template_name
    if not path.is_file():
        raise ConfigError(f"service template {path} not found; install from a source checkout "
                          "(make install-service)")
    text = path.read_text(encoding="utf-8")
    for name, value in values.items():
        text = text.replace(f"@{name}@", value)
    return text


def render_plist(plan: ServicePlan, label: str = LABEL) -> str:
    """The LaunchAgent XML; every value XML-escaped."""
    args = "\n".join(f"\t\t<string>{escape(a)}</string>" for a in plan.program_args)
    env = "\n".join(f"\t\t<key>{escape(k)}</key>\n\t\t<string>{escape(v)}</string>"
                    for k, v in plan.environment.items())
    return _fill("dev.frink.mlx.plist.in", {
        "LABEL": escape(label), "PROGRAM_ARGUMENTS": args, "ENVIRONMENT": env,
        "WORKING_DIRECTORY": escape(str(plan.working_directory)),
        "THROTTLE_INTERVAL_S": str(THROTTLE_INTERVAL_S),
        "EXIT_TIMEOUT_S": str(plan.exit_timeout_s), "OPEN_FILES": str(plan.open_files),
        "STDOUT_PATH": escape(str(plan.log_file)), "STDERR_PATH": escape(str(plan.log_file)),
    })


def systemd_quote(word: str) -> str:
    """One ExecStart/Environment word: double-quoted, with \\, ", % and $ escaped."""
    escaped = word.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("%", "%%").replace("$", "$$") + '"'


def render_unit(plan: ServicePlan) -> str:
    env = "\n".join(f"Environment={systemd_quote(f'{k}={v}')}"
                    for k, v in plan.environment.items())
    return _fill("frink-mlx.service.in", {
        "UNIT": UNIT, "README": str(TEMPLATE_DIR / "README.md"),
        "EXEC_START": " ".join(systemd_quote(a) for a in plan.program_args),
        "WORKING_DIRECTORY": systemd_quote(str(plan.working_directory)), "ENVIRONMENT": env,
        "THROTTLE_INTERVAL_S": str(THROTTLE_INTERVAL_S),
        "EXIT_TIMEOUT_S": str(plan.exit_timeout_s), "OPEN_FILES": str(plan.open_files),
    })


# --- keys, commands, health ---------------------------------------------------

def ensure_key_file(path: Path) -> bool:
    """Create a 0600 key file at `path` unless one exists (checked); True if created."""
    if path.exists():
        read_key_file(path)  # refuses a group/world-readable or empty file
        return False
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("frk-" + secrets.token_urlsafe(32) + "\n")
    return True


def run_tool(argv: list[str], *, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run launchctl/systemctl/journalctl; a failure is a ConfigError naming the command."""
    if shutil.which(argv[0]) is None:
        raise ConfigError(f"'{argv[0]}' not found on PATH; is this the right service manager?")
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        detail = (done.stderr or done.stdout).strip().splitlines()
        raise ConfigError(f"'{shlex.join(argv)}' failed (exit {done.returncode})"
                          + (f": {detail[-1]}" if detail else ""))
    return done


def report_health(plan: ServicePlan) -> int:
    """Rule 4: the daemon's /health body and 0, else why not and NOT_RUNNING."""
    found = probe(plan.url)
    if not found.answers:
        print(f"health: no frink-mlx daemon answers at {plan.health_url} ({found.detail})")
        return NOT_RUNNING
    print(f"health: {plan.health_url} -> {json.dumps(found.body, sort_keys=True)}")
    return 0


# --- the two service managers -------------------------------------------------

class Launchd:
    """A LaunchAgent in the user's GUI domain (`gui/$UID`)."""

    def __init__(self, plan: ServicePlan, plist_path: Path, uid: int, label: str = LABEL) -> None:
        self.plan, self.plist_path = plan, plist_path
        self.domain = f"gui/{uid}"
        self.target = f"{self.domain}/{label}"
        self.label = label

    def _loaded(self) -> bool:
        return run_tool(["launchctl", "print", self.target], check=False).returncode == 0

    def _require_installed(self) -> None:
        if not self.plist_path.exists():
            raise ConfigError(f"{self.plist_path} is not installed; run: frink-mlx service install")

    def install(self) -> int:
        self.plist_path.parent.mkdir(parents=True, exist_ok=True)
        self.plan.log_file.parent.mkdir(parents=True, exist_ok=True)
        self.plan.working_directory.mkdir(parents=True, exist_ok=True)
        if self._loaded():
            run_tool(["launchctl", "bootout", self.target])
        self.plist_path.write_text(render_plist(self.plan, self.label), encoding="utf-8")
        run_tool(["launchctl", "enable", self.target])
        run_tool(["launchctl", "bootstrap", self.domain, str(self.plist_path)])
        print(f"installed {self.plist_path}; {self.label} starts now and at every login")
        print(f"logs: {self.plan.log_file}; check with: frink-mlx service status")
        return 0

    def uninstall(self) -> int:
        if self._loaded():
            run_tool(["launchctl", "bootout", self.target])
        self.plist_path.unlink(missing_ok=True)
        print(f"removed {self.plist_path} (logs and key file kept)")
        return 0

    def start(self) -> int:
        self._require_installed()
        if not self._loaded():
            run_tool(["launchctl", "bootstrap", self.domain, str(self.plist_path)])
        run_tool(["launchctl", "kickstart", self.target])
        print(f"started {self.label}")
        return 0

    def stop(self) -> int:
        if not self._loaded():
            print(f"{self.label} is not loaded")
            return 0
        run_tool(["launchctl", "bootout", self.target])  # SIGTERM, then ExitTimeOut
        print(f"stopped {self.label}")
        return 0

    def status(self) -> int:
        done = run_tool(["launchctl", "print", self.target], check=False)
        if done.returncode != 0:
            print(f"{self.label}: not loaded ({self.plist_path})")
            report_health(self.plan)
            return NOT_RUNNING
        keys = ("state", "pid", "last exit code", "runs")
        facts = [line.strip() for line in done.stdout.splitlines()
                 if line.strip().split(" = ")[0] in keys]
        print(f"{self.label}: loaded; " + ("; ".join(facts) or "no state reported"))
        return report_health(self.plan)

    def logs(self, lines: int = 50, follow: bool = False) -> int:
        path = self.plan.log_file
        if not path.exists():
            print(f"no log yet at {path}")
            return 1
        if follow:
            os.execvp("tail", ["tail", "-n", str(lines), "-f", str(path)])
        tail = path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
        print("\n".join(tail))
        return 0


class Systemd:
    """A systemd --user unit; logs live in the user journal."""

    def __init__(self, plan: ServicePlan, unit_path: Path) -> None:
        self.plan, self.unit_path = plan, unit_path

    @staticmethod
    def _ctl(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return run_tool(["systemctl", "--user", *args], check=check)

    def install(self) -> int:
        self.unit_path.parent.mkdir(parents=True, exist_ok=True)
        self.plan.working_directory.mkdir(parents=True, exist_ok=True)
        self.unit_path.write_text(render_unit(self.plan), encoding="utf-8")
        self._ctl("daemon-reload")
        self._ctl("enable", UNIT)
        self._ctl("restart", UNIT)
        print(f"installed {self.unit_path}; {UNIT} starts now and at every login")
        print(f"logs: journalctl --user -u {UNIT}; check with: frink-mlx service status")
        return 0

    def uninstall(self) -> int:
        if self.unit_path.exists():
            self._ctl("disable", "--now", UNIT, check=False)
            self.unit_path.unlink()
            self._ctl("daemon-reload")
        print(f"removed {self.unit_path} (key file kept)")
        return 0

    def start(self) -> int:
        if not self.unit_path.exists():
            raise ConfigError(f"{self.unit_path} is not installed; run: frink-mlx service install")
        self._ctl("start", UNIT)
        print(f"started {UNIT}")
        return 0

    def stop(self) -> int:
        self._ctl("stop", UNIT)
        print(f"stopped {UNIT}")
        return 0

    def status(self) -> int:
        active = self._ctl("is-active", UNIT, check=False).stdout.strip() or "unknown"
        print(f"{UNIT}: {active} ({self.unit_path})")
        healthy = report_health(self.plan)
        return healthy if active == "active" else NOT_RUNNING

    def logs(self, lines: int = 50, follow: bool = False) -> int:
        argv = ["journalctl", "--user", "-u", UNIT, "-n", str(lines), "--no-pager"]
        if follow:
            os.execvp("journalctl", argv + ["-f"])
        print(run_tool(argv).stdout, end="")
        return 0


# --- the command --------------------------------------------------------------

def choose_backend(name: str | None) -> str:
    if name in ("launchd", "systemd"):
        return name
    return "launchd" if sys.platform == "darwin" else "systemd"


def service_command(settings: Settings, args: argparse.Namespace) -> int:
    """Dispatch one verb to the platform's service manager."""
    backend = choose_backend(getattr(args, "backend", None))
    key_path = (Path(settings.api_key_file).expanduser() if settings.api_key_file
                else default_key_file(settings))
    if args.action == "install" and getattr(args, "generate_key", False):
        created = ensure_key_file(key_path)
        print(f"api key file: {key_path} ({'created' if created else 'kept existing'}, mode 0600)")
    if args.action == "install" and settings.distributed:
        secret = Path(settings.group_secret_file()).expanduser()
        created = ensure_secret(secret)
        print(f"group secret: {secret} ({'created' if created else 'kept existing'}, mode 0600); "
              "every rank needs this same file")
    key_file = key_path if key_path.exists() else None
    home = Path.home()
    log_dir = (home / "Library" / "Logs" / "frink-mlx" if backend == "launchd"
               else Path(settings.cache_dir) / "logs")
    plan = plan_service(settings, key_file=key_file, log_dir=log_dir,
                        access_log_file=log_dir / "access.log" if backend == "launchd" else None)
    manager = (Launchd(plan, home / "Library" / "LaunchAgents" / f"{LABEL}.plist", os.getuid())
               if backend == "launchd"
               else Systemd(plan, Path(user_config_home()) / "systemd" / "user" / UNIT))
    verb = getattr(manager, args.action)
    if args.action == "logs":
        return int(verb(lines=getattr(args, "lines", 50), follow=getattr(args, "follow", False)))
    return int(verb())
