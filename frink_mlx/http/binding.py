"""Keys and binding: which API key the daemon enforces, and what it may listen on.

Why apart from the request gates (http/security.py): these run once, at
start-up and in the commands that talk to the daemon (`chat`, `launch`,
`service`), never per request.

`check_bind(settings)` refuses to start on a non-loopback address without a
key, a TLS setting without its pair or with a file it cannot read, or `null`
or `*` among the CORS origins (`null` is what sandboxed iframes and file://
pages send, so allowing it allows any page; `*` is no origin); a non-loopback
address served without TLS is one warning (the key and every prompt cross the
network in cleartext). The server calls it before binding, and the middleware
checks the origins again.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import stat
from pathlib import Path

from ..errors import ConfigError
from ..settings import Settings

log = logging.getLogger("frink_mlx.http")

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
KEY_FILE_NAME = "api_key"


def default_key_file(settings: Settings) -> Path:
    """Where `frink-mlx service install --generate-key` writes the key."""
    return Path(settings.config_dir) / KEY_FILE_NAME


def read_key_file(path: Path) -> str:
    """The key in `path`; the file must be a regular file readable by its owner only."""
    try:
        st = path.stat()
    except FileNotFoundError:
        raise ConfigError(f"api key file {path} does not exist") from None
    if not stat.S_ISREG(st.st_mode):
        raise ConfigError(f"api key file {path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise ConfigError(
            f"api key file {path} has mode {mode:04o}; it must not be readable by group or "
            f"others (run: chmod 600 {path})")
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise ConfigError(f"api key file {path} is empty")
    return key


def resolve_api_key(settings: Settings) -> str | None:
    """The key the daemon enforces and clients send, or None (no auth).

    Precedence: `settings.api_key` (--api-key, $FRINK_MLX_API_KEY) >
    `settings.api_key_file` (--api-key-file, must exist, mode 0600) > the
    default key file `<config_dir>/api_key` when it exists (also checked).
    """
    if settings.api_key:
        return settings.api_key
    if settings.api_key_file:
        return read_key_file(Path(settings.api_key_file).expanduser())
    default = default_key_file(settings)
    if default.exists():
        return read_key_file(default)
    return None


def is_loopback_host(host: str) -> bool:
    """True for names/addresses only this machine can reach (bind addresses)."""
    name = host.strip().strip("[]").lower()
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def check_bind(settings: Settings) -> str | None:
    """Refuse a non-loopback bind without a key; returns the key (or None).

    Raises ConfigError naming the setting; the server calls this first.
    """
    check_cors_origins(settings.cors_origins)
    key = resolve_api_key(settings)
    if not is_loopback_host(settings.host) and not key:
        raise ConfigError(
            f"refusing to listen on {settings.host}: a non-loopback address needs an API key "
            "(--api-key, $FRINK_MLX_API_KEY, or --api-key-file with mode 0600)")
    tls = check_tls(settings)
    if not is_loopback_host(settings.host) and not tls:
        log.warning("listening on %s without TLS: the API key and every prompt cross the "
                    "network in cleartext (--ssl-certfile/--ssl-keyfile, or bind 127.0.0.1)",
                    settings.host)
    return key


def check_tls(settings: Settings) -> bool:
    """True when the daemon serves HTTPS; a certificate without its key (or the other way
    round) or a file it cannot read is a ConfigError naming the setting."""
    pair = {"ssl_certfile": settings.ssl_certfile, "ssl_keyfile": settings.ssl_keyfile}
    given = {name: path for name, path in pair.items() if path}
    if not given:
        return False
    if len(given) == 1:
        (name,) = given
        other = "ssl_keyfile" if name == "ssl_certfile" else "ssl_certfile"
        raise ConfigError(f"--{name.replace('_', '-')} needs --{other.replace('_', '-')} too")
    for name, path in given.items():
        if not os.access(Path(path).expanduser(), os.R_OK):
            raise ConfigError(f"--{name.replace('_', '-')}: cannot read {path}")
    return True


def check_cors_origins(origins: tuple[str, ...]) -> None:
    """Refuse `null` and `*` as CORS origins (module docstring), naming the setting."""
    for origin in origins:
        if origin.strip().lower() in ("null", "*"):
            raise ConfigError(f"refusing --cors-origin {origin.strip()!r}: it would let any web "
                              "page call this daemon; name each origin exactly "
                              "(e.g. http://localhost:3000)")
