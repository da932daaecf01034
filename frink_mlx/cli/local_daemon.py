"""Where the local daemon answers, for the commands that talk to it (`chat`, `generate`, `open`).

Rules:
1. The base URL is --url when given, else the configured host and port; a
   wildcard bind address (0.0.0.0, ::) is reached at 127.0.0.1 and an IPv6
   literal is bracketed.
2. A daemon "answers" when /health replies 200 or 503 with its JSON (a
   loading or idle daemon answers too); /health needs no key.
3. `probe()` says more than yes or no: READY (200), LOADING (a 503 from
   frink's /health), SILENT (the port accepted the connection but /health did
   not answer in time: a daemon busy starting), ABSENT (nothing listens),
   FOREIGN (something else answers). Only ABSENT lets `chat` and `generate`
   fall back to a model loaded in process: a daemon that is starting is
   waited for (`wait_ready`, noting once what it waits for; Ctrl-C stops it),
   never doubled by a second copy of the model.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from ..settings import Settings

PROBE_TIMEOUT_S = 2.0
READY_WAIT_S = 600.0      # a daemon loading a large model may take minutes


def daemon_url(settings: Settings, args: argparse.Namespace) -> str:
    """Rule 1, without a trailing slash."""
    if args.url:
        return str(args.url).rstrip("/")
    host = settings.host if settings.host not in ("0.0.0.0", "::") else "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    scheme = "https" if settings.ssl_certfile else "http"  # a self-signed one: SSL_CERT_FILE
    return f"{scheme}://{host}:{settings.port}"


def daemon_answers(url: str, headers: dict[str, str]) -> bool:
    """Rule 2, waiting at most two seconds."""
    return probe(url, headers).health in (Health.READY, Health.LOADING)


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


def probe(url: str, headers: dict[str, str], timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """Rule 3: what answers /health at `url`."""
    import httpx

    try:
        r = httpx.get(url + "/health", headers=headers, timeout=timeout_s)
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
