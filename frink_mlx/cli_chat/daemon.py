"""Talking to a running daemon: the /health probe and streamed OpenAI requests.

Why a probe with more than two answers: `chat` used to treat anything but a
quick /health reply as "no daemon" and load a second copy of the model, even
while the daemon was merely loading. Rules:
1. `probe()` says one of: READY (200), LOADING (a 503 from frink's /health),
   SILENT (the port accepted the connection but /health did not answer in
   time: a daemon busy starting), ABSENT (nothing listens), FOREIGN (something
   else answers). Only ABSENT lets a caller fall back to an in-process model.
2. `wait_ready()` polls LOADING and SILENT daemons, noting once what it waits
   for; Ctrl-C stops the wait.
3. Requests stream (`stream: true`, `stream_options.include_usage`) so speed
   and token counts come from the daemon's own usage chunk.
4. Transport failures become `Unavailable` (common.py rule 2): refused or
   timed out before any answer -> DAEMON_UNREACHABLE; a connection that
   breaks while the answer streams -> DAEMON_LOST. An error envelope becomes
   a FrinkError carrying the daemon's status, code and message. A 503 with
   Retry-After (a swap or load in progress, a full queue) is retried after
   the delay, up to RETRY_BUDGET_S in all, with one note.
5. Ctrl-C closes the response, which closes the connection; the daemon aborts
   the request within one engine step (README: "a client that disconnects").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

import httpx

from ..errors import FrinkError, Unavailable
from .common import (
    DAEMON_LOST,
    DAEMON_UNREACHABLE,
    ChatParams,
    Emit,
    Messages,
    Note,
    Stats,
)

PROBE_TIMEOUT_S = 2.0
READY_WAIT_S = 600.0      # a daemon loading a large model may take minutes
RETRY_BUDGET_S = 120.0


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
    """Rule 1."""
    try:
        r = httpx.get(url + "/health", headers=headers, timeout=timeout_s)
    except httpx.ConnectError as exc:
        return Probe(Health.ABSENT, _reason(exc))
    except httpx.TimeoutException:
        return Probe(Health.SILENT, f"no answer to /health within {timeout_s:g} s")
    except httpx.HTTPError as exc:
        return Probe(Health.SILENT, _reason(exc))
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
    progress = body.get("progress")
    if isinstance(progress, (int, float)):
        return f", {progress:.0%} loaded" if progress <= 1 else f", {progress:g}% loaded"
    return ""


def wait_ready(url: str, headers: dict[str, str], note: Note,
               limit_s: float = READY_WAIT_S) -> Probe:
    """Rule 2: poll until READY, ABSENT or FOREIGN (or the limit); note each change once."""
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


def _reason(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "refused" in text.lower():
        return "connection refused"
    return text.splitlines()[0]


def error_from(status: int, body: Any, retry_after: str | None = None) -> FrinkError:
    """An error envelope (OpenAI's `{"error": {...}}`) as a FrinkError with its status."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        message, code = str(err.get("message") or err), err.get("code")
    else:
        message, code = (str(err) if err else f"HTTP {status}"), None
    exc = FrinkError(message, code=str(code) if code else None,
                     retry_after_s=_seconds(retry_after))
    exc.status = status
    return exc


def _seconds(text: str | None) -> float | None:
    """A Retry-After header in seconds (the HTTP-date form is not used by frink)."""
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and value >= 0 else None


@dataclass
class DaemonBackend:
    """common.Backend over HTTP (rules 3-5)."""

    url: str
    headers: dict[str, str]
    model: str
    note: Note
    loaded: str | None = None     # what /health said the daemon had loaded when we met it
    client: httpx.Client = field(init=False)

    def __post_init__(self) -> None:
        timeout = httpx.Timeout(connect=5.0, read=None, write=30.0, pool=5.0)
        self.client = httpx.Client(base_url=self.url, headers=self.headers, timeout=timeout)

    @property
    def label(self) -> str:
        return f"the daemon at {self.url}"

    def answer(self, messages: Messages, params: ChatParams, emit: Emit) -> Stats:
        body = self._body(params) | {"messages": messages}
        return self._stream("/v1/chat/completions", body, emit, "delta")

    def complete(self, prompt: str, params: ChatParams, emit: Emit) -> Stats:
        body = self._body(params) | {"prompt": prompt}
        return self._stream("/v1/completions", body, emit, "text")

    def switch_model(self, name: str) -> str:
        """Check the daemon knows `name` (GET /v1/models/NAME); the next request names it."""
        r = self._send("GET", f"/v1/models/{name}")
        if r.status_code != 200:
            raise error_from(r.status_code, _json(r))
        self.model = name
        return str(_json(r).get("id") or name)

    def close(self) -> None:
        self.client.close()

    def _body(self, params: ChatParams) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self.model, "stream": True,
                                "stream_options": {"include_usage": True},
                                "max_tokens": params.max_tokens}
        for key, value in (("temperature", params.temperature), ("top_p", params.top_p),
                           ("seed", params.seed)):
            if value is not None:
                body[key] = value
        return body

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            return self.client.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            raise self._unreachable(exc) from None

    def _unreachable(self, exc: BaseException) -> Unavailable:
        return Unavailable(f"no daemon answers at {self.url} ({_reason(exc)})",
                           code=DAEMON_UNREACHABLE)

    def _stream(self, path: str, body: dict[str, Any], emit: Emit, kind: str) -> Stats:
        deadline = time.monotonic() + RETRY_BUDGET_S
        while True:
            try:
                return self._stream_once(path, body, emit, kind)
            except FrinkError as exc:
                wait_s = exc.retry_after_s
                if exc.code in (DAEMON_UNREACHABLE, DAEMON_LOST) or exc.status != 503 \
                        or wait_s is None or time.monotonic() + wait_s > deadline:
                    raise
                self.note(f"[the daemon is busy: {exc.message}; retrying in {wait_s:g} s]")
                time.sleep(max(wait_s, 0.1))

    def _stream_once(self, path: str, body: dict[str, Any], emit: Emit, kind: str) -> Stats:
        started, first = time.perf_counter(), None
        stats = Stats()
        try:
            with self.client.stream("POST", path, json=body) as r:
                if r.status_code != 200:
                    r.read()
                    raise error_from(r.status_code, _json(r), r.headers.get("retry-after"))
                for chunk in _sse_chunks(r.iter_lines()):
                    text = _chunk_text(chunk, kind)
                    if text:
                        first = first or time.perf_counter()
                        emit(text)
                    _note_usage(chunk, stats)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise self._unreachable(exc) from None
        except httpx.HTTPError as exc:
            raise Unavailable(f"the daemon at {self.url} went away mid-answer ({_reason(exc)})",
                              code=DAEMON_LOST) from None
        end = time.perf_counter()
        stats.prompt_s = (first or end) - started
        stats.decode_s = end - (first or end)
        return stats


def _json(r: httpx.Response) -> Any:
    try:
        return r.json()
    except ValueError:
        return {"error": {"message": f"HTTP {r.status_code}: {r.text[:200]}"}}


def _sse_chunks(lines: Iterator[str]) -> Iterator[dict[str, Any]]:
    """`data: {...}` frames as dicts; an error frame raises (rule 4)."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":
            return
        chunk = json.loads(data)
        if isinstance(chunk, dict) and "error" in chunk:
            raise error_from(500, chunk)
        yield chunk


def _chunk_text(chunk: dict[str, Any], kind: str) -> str:
    parts = []
    for choice in chunk.get("choices") or ():
        text = choice.get("delta", {}).get("content") if kind == "delta" else choice.get("text")
        if text:
            parts.append(text)
    return "".join(parts)


def _note_usage(chunk: dict[str, Any], stats: Stats) -> None:
    usage = chunk.get("usage")
    if not usage:
        return
    stats.prompt_tokens = int(usage.get("prompt_tokens") or 0)
    stats.completion_tokens = int(usage.get("completion_tokens") or 0)
    details = usage.get("prompt_tokens_details") or {}
    stats.cached_tokens = details.get("cached_tokens")
