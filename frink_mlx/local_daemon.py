"""Where the local daemon answers, for the commands that talk to it (`chat`, `open`).

Rules:
1. The base URL is --url when given, else the configured host and port; a
   wildcard bind address (0.0.0.0, ::) is reached at 127.0.0.1 and an IPv6
   literal is bracketed.
2. A daemon "answers" when /health replies 200 or 503 with its JSON (a
   loading or idle daemon answers too); /health needs no key.
"""

from __future__ import annotations

import argparse

from .settings import Settings


def daemon_url(settings: Settings, args: argparse.Namespace) -> str:
    """Rule 1, without a trailing slash."""
    if args.url:
        return str(args.url).rstrip("/")
    host = settings.host if settings.host not in ("0.0.0.0", "::") else "127.0.0.1"
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"http://{host}:{settings.port}"


def daemon_answers(url: str, headers: dict[str, str]) -> bool:
    """Rule 2, waiting at most two seconds."""
    import httpx

    try:
        r = httpx.get(url + "/health", headers=headers, timeout=2.0)
    except httpx.HTTPError:
        return False
    return r.status_code in (200, 503) and "state" in r.text
