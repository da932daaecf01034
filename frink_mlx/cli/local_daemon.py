"""Where the local daemon answers, and whether it does: the one loopback rule and the
one /health prober every command uses (`chat`, `generate`, `open`, `launch`, `service
status`).

Rules:
1. The base URL is --url when given, else the configured host and port as
   this machine reaches them (`local_url`): a wildcard bind address (0.0.0.0,
   ::, or empty) is reached at 127.0.0.1, an IPv6 literal is bracketed once
   (given bare or bracketed), and the scheme is https when the daemon serves
   TLS. `service` writes the same URL into the plan it probes.
2. A daemon "answers" when /health replies 200 or 503 with its JSON (a
   loading or idle daemon answers too); /health needs no key.
3. `probe()` says more than yes or no: READY (200), LOADING (a 503 from
   frink's /health), SILENT (the port accepted the connection but /health did
   not answer in time: a daemon busy starting), ABSENT (nothing listens),
   FOREIGN (something else answers: no JSON body with frink's `state`). Only
   ABSENT lets `chat` and `generate` fall back to a model loaded in process:
   a daemon that is starting is waited for (`wait_ready`, noting once what it
   waits for; Ctrl-C stops it), never doubled by a second copy of the model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..settings import Settings

PROBE_TIMEOUT_S = 2.0
READY_WAIT_S = 600.0      # a daemon loading a large model may take minutes


WILDCARD_HOSTS = frozenset({"0.0.0.0", "::", ""})


def local_url(host: str, port: int, *, tls: bool = False) -> str:
    """Rule 1: the base URL (no trailing slash) of a daemon bound to `host`:`port` here."""
    name = host.strip().strip("[]")
    if name in WILDCARD_HOSTS:
        name = "127.0.0.1"
    shown = f"[{name}]" if ":" in name else name
    return f"{'https' if tls else 'http'}://{shown}:{port}"


def daemon_url(settings: Settings, url: str | None = None) -> str:
    """Rule 1: `url` (a --url flag) when given, else where the configured daemon answers."""
    if url:
        return url.rstrip("/")
    # a self-signed certificate: point SSL_CERT_FILE at it (httpx reads it)
    return local_url(settings.host, settings.port, tls=bool(settings.ssl_certfile))


def daemon_answers(url: str, headers: dict[str, str] | None = None) -> bool:
    """Rule 2, waiting at most PROBE_TIMEOUT_S."""
    return probe(url, headers).answers


class Health(Enum):
    READY = "ready"
    LOADING = "loading"
    SILENT = "silent"
    ABSENT = "absent"
    FOREIGN = "foreign"


@dataclass(slots=True)
class Probe:
    health: Health
    detail: str                  # why, in words ("connection refused", "HTTP 404", ...)
    body: dict[str, Any] = field(default_factory=dict)

    @property
    def answers(self) -> bool:
        """Rule 2: a frink-mlx daemon replied (ready, or loading, idle, draining)."""
        return self.health in (Health.READY, Health.LOADING)


def probe(url: str, headers: dict[str, str] | None = None,
          timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """Rule 3: what answers /health at the base URL `url`."""
    import httpx

    try:
        r = httpx.get(url + "/health", headers=headers or {}, timeout=timeout_s)
    except httpx.ConnectError as exc:
        return Probe(Health.ABSENT, reason(exc))
    except httpx.TimeoutException:
        return Probe(Health.SILENT, f"no answer to /health within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return Probe(Health.SILENT, reason(exc))
    try:
        body = r.json()
    except ValueError:
        body = None
    if not isinstance(body, dict) or "state" not in body:
        return Probe(Health.FOREIGN, f"HTTP {r.status_code} from /health, not a frink-mlx daemon")
    if r.status_code == 200:
        return Probe(Health.READY, str(body.get("state")), body)
    return Probe(Health.LOADING, f"state {body.get('state')!r}" + _progress(body), body)


def _progress(body: dict[str, Any]) -> str:
    """The daemon's load snapshot (serving/hub.py LoadProgress) in a few words."""
    progress = body.get("progress")
    if not isinstance(progress, dict) or not progress.get("model"):
        return ""
    detail = f" ({progress['detail']})" if progress.get("detail") else ""
    elapsed = progress.get("elapsed_s")
    since = f", {elapsed:.0f} s" if isinstance(elapsed, (int, float)) else ""
    return f", loading {progress['model']}: {progress.get('phase') or '?'}{detail}{since}"


def wait_ready(url: str, headers: dict[str, str], note: Callable[[str], None],
               limit_s: float = READY_WAIT_S) -> Probe:
    """Rule 3: poll until READY, ABSENT or FOREIGN (or the limit); note each change once."""
    deadline, said = time.monotonic() + limit_s, ""
    while True:
        found = probe(url, headers)
        if found.health not in (Health.LOADING, Health.SILENT) or time.monotonic() > deadline:
            return found
        if found.health.value != said:
            said = found.health.value
            note(f"[the daemon at {url} is not ready yet ({found.detail}); waiting, "
                 "Ctrl-C to give up]")
        time.sleep(0.5)


def reason(exc: BaseException) -> str:
    """A transport failure in a few words."""
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text.splitlines()[0]
