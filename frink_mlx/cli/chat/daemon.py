"""Talking to a running daemon: streamed OpenAI requests (finding it: local_daemon.py).

Rules:
1. Requests stream (`stream: true`, `stream_options.include_usage`) so speed
   and token counts come from the daemon's own usage chunk.
2. Transport failures become `Unavailable` (common.py rule 2): refused or
   timed out before any answer -> DAEMON_UNREACHABLE; a connection that
   breaks while the answer streams -> DAEMON_LOST. An error envelope becomes
   a FrinkError carrying the daemon's status, code and message. A 503 with
   Retry-After (a swap or load in progress, a full queue) is retried after
   the delay, up to RETRY_BUDGET_S in all, with one note.
3. Ctrl-C closes the response, which closes the connection; the daemon aborts
   the request within one engine step (README: "a client that disconnects").
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from ...errors import FrinkError, Unavailable
from ..local_daemon import reason
from .common import (
    DAEMON_LOST,
    DAEMON_UNREACHABLE,
    ChatParams,
    Emit,
    Messages,
    Note,
    Stats,
)

RETRY_BUDGET_S = 120.0


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
class DaemonModel:
    """common.ChatModel over HTTP (rules 1-3)."""

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
        return Unavailable(f"no daemon answers at {self.url} ({reason(exc)})",
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
            raise Unavailable(f"the daemon at {self.url} went away mid-answer ({reason(exc)})",
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
    """`data: {...}` frames as dicts; an error frame raises (rule 2)."""
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
