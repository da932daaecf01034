"""Request ids, one structured access-log line per request, and request metrics.

The outermost middleware, so refusals (421/401/413/503) are logged, counted
and carry a request id like everything else. Pure ASGI: it only wraps `send`
to add headers and note the status, so streams flow through untouched.

Rules:
1. Every response carries `request-id` (Anthropic's name) and `x-request-id`
   (OpenAI's). A valid incoming `x-request-id` (1-128 of [A-Za-z0-9._:-]) is
   honoured; otherwise one is minted (`req_` + 24 hex digits).
2. The id is on `request.state.request_id` for the endpoint to reuse.
3. Endpoints that generate leave what they know on `request.state`; every
   attribute is optional (absent = not measured, logged as null):
       model: str              served model name
       generation: int         model generation that served it
       prompt_tokens: int      completion_tokens: int      cached_tokens: int
       ttft_s: float           seconds from arrival to the first token
   (`note_generation(request, ...)` sets them.) Every Run that
   `Frontend.generate` starts while serving the request is also tracked
   (`track_run`, through a context variable the middleware sets per request),
   so every generating route -- OpenAI, Responses, Anthropic, llama.cpp --
   reports model, generation, tokens and TTFT without saying so itself; several
   runs (completions with a list of prompts) are summed, TTFT is the earliest.
   The runs' numbers replace what an endpoint noted (they cover every run);
   notes remain for work that is not a Run (embeddings). After the response ends this
   middleware logs them and feeds Metrics: observe_request, observe_tokens,
   observe_ttft and observe_token_latency (mean inter-token time, from
   (duration - ttft) / (completion_tokens - 1)).
4. One JSON object per line on the `frink_mlx.access` logger at INFO:
   id, method, route, path, status, model, generation, prompt_tokens,
   completion_tokens, cached_tokens, ttft_ms, duration_ms.
5. The same facts (less the path) also go into a bounded ring,
   `RecentRequests` on `app.state.recent_requests`, which the status page
   shows (adapters/status.py) whether or not the log line is enabled. The
   ring keeps work, not observation: requests to QUIET_ROUTES (the page, its
   assets, its status poll, /health, /metrics) are left out, or a page polling
   every second would push every real request out within minutes. Each record
   gets a sequence number, so a poller can tell which records are new.
6. A response the client did not wait for is recorded as 499 (nginx's "client
   closed request"), in the log line and in the metrics, whatever status its
   headers carried: the app received `http.disconnect` before the last body
   byte was sent. So a stream cut mid-answer (headers said 200), a request
   dropped mid-body and a non-streaming answer abandoned while it was being
   generated all read the same, on every route.
7. A response from a generating route says the token budget its runs got
   (serving/handles.py rule 3): `frink-max-tokens: N` (the largest of its
   runs), and `frink-max-tokens-requested: M` when the client's max_tokens
   was more than the context left room for and was clamped to N.
8. The list of a request's runs is emptied once its line is recorded. Every
   copy of the request's context shares that list -- a timer the request
   scheduled keeps its copy until the timer's due time, even cancelled -- and
   a run holds its generation: a model retired meanwhile stayed resident.
9. What strangers control is bounded: the path in a line is cut to
   MAX_LOGGED_PATH characters (`...(+N)` says how many more), the method to
   MAX_LOGGED_METHOD; and a refusal before authentication (a wrong Host,
   Origin or key: http/security.py marks it) is logged and kept in the ring
   within a LogBudget (http/log_budget.py), the first line after a
   suppression saying `"suppressed": N`. Metrics count every refusal.
"""

from __future__ import annotations

import json
import logging
import re
import time
import uuid
from collections import deque
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..metrics import Metrics, metrics_of
from .log_budget import LogBudget

if TYPE_CHECKING:
    from ..serving.handles import Run

access_log = logging.getLogger("frink_mlx.access")

_VALID_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
UNMATCHED_ROUTE = "<unmatched>"
CLIENT_CLOSED = 499  # rule 6
STATE_FIELDS = ("model", "generation", "prompt_tokens", "completion_tokens", "cached_tokens",
                "ttft_s")
# Rule 5: route templates whose requests the ring leaves out (tests/http pins that they exist).
QUIET_ROUTES = frozenset({"/", "/ui/{name}", "/admin/status", "/health", "/metrics"})
RECENT_CAPACITY = 100
MAX_LOGGED_PATH = 256     # rule 9
MAX_LOGGED_METHOD = 16
PRE_AUTH_REFUSAL = "frink_pre_auth_refusal"  # the state key http/security.py sets (rule 9)


class AccessRecord(msgspec.Struct, frozen=True):
    """One finished request, as the ring keeps it (rule 5). None = not measured."""

    seq: int
    at_unix: float          # when the response ended
    id: str
    method: str
    route: str
    status: int
    model: str | None
    generation: int | None
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    ttft_ms: float | None
    duration_ms: float


class RecentRequests:
    """The last `capacity` non-quiet requests, oldest first (rule 5)."""

    def __init__(self, capacity: int = RECENT_CAPACITY) -> None:
        self._records: deque[AccessRecord] = deque(maxlen=capacity)
        self._seq = 0

    def add(self, line: dict[str, Any]) -> None:
        """Keep `line` (the access-log fields) unless its route is quiet."""
        if line["route"] in QUIET_ROUTES:
            return
        self._seq += 1
        fields = {k: v for k, v in line.items() if k not in ("path", "suppressed")}
        self._records.append(AccessRecord(seq=self._seq, at_unix=time.time(), **fields))

    def snapshot(self) -> list[AccessRecord]:
        return list(self._records)


def recent_requests_of(app: object) -> RecentRequests | None:
    """The app's ring (`app.state.recent_requests`, set by the lifespan), or None before
    start-up."""
    ring = getattr(getattr(app, "state", None), "recent_requests", None)
    return ring if isinstance(ring, RecentRequests) else None


# The Runs started while serving the current request (rule 3); None outside a request.
_request_runs: ContextVar["list[Run] | None"] = ContextVar("frink_request_runs", default=None)


def track_run(run: Run) -> None:
    """Frontend.on_run (serving/frontend.py): the current request's access line reports `run`."""
    runs = _request_runs.get()
    if runs is not None:
        runs.append(run)


def runs_tally(runs: list[Run]) -> dict[str, Any]:
    """Rule 3: the STATE_FIELDS of the runs one request started (each has `tally()`)."""
    if not runs:
        return {}
    tallies = [run.tally() for run in runs]
    ttfts = [t["ttft_s"] for t in tallies if t["ttft_s"] is not None]
    return {"model": tallies[0]["model"], "generation": tallies[0]["generation"],
            **{name: sum(t[name] for t in tallies)
               for name in ("prompt_tokens", "completion_tokens", "cached_tokens")},
            "ttft_s": min(ttfts) if ttfts else None}


def budget_headers(runs: list[Run]) -> list[tuple[bytes, bytes]]:
    """Rule 7: the token budget the request's runs got, and what was asked when clamped."""
    budgets = [b for b in (getattr(r, "max_tokens", None) for r in runs) if isinstance(b, int)]
    if not budgets:
        return []
    headers = [(b"frink-max-tokens", str(max(budgets)).encode())]
    clamped = [asked for r in runs
               if isinstance(asked := getattr(r, "max_tokens_requested", None), int)
               and asked > r.max_tokens]
    if clamped:
        headers.append((b"frink-max-tokens-requested", str(max(clamped)).encode()))
    return headers


def new_request_id() -> str:
    return "req_" + uuid.uuid4().hex[:24]


def incoming_request_id(scope: Scope) -> str | None:
    for name, value in scope.get("headers", ()):
        if name == b"x-request-id":
            text = value.decode("latin-1")
            return text if _VALID_ID.match(text) else None
    return None


def note_generation(request: Request, *, model: str | None = None,
                    generation: int | None = None, prompt_tokens: int | None = None,
                    completion_tokens: int | None = None, cached_tokens: int | None = None,
                    ttft_s: float | None = None) -> None:
    """Record what a generating endpoint knows, for the access log and metrics."""
    values = {"model": model, "generation": generation, "prompt_tokens": prompt_tokens,
              "completion_tokens": completion_tokens, "cached_tokens": cached_tokens,
              "ttft_s": ttft_s}
    for name, value in values.items():
        if value is not None:
            setattr(request.state, name, value)


def route_template(scope: Scope) -> str:
    """The route's path template (a bounded label), or '<unmatched>'.

    Requests refused before routing (421, 401, 413, 503) are matched here
    against the app's routes, so they are counted under the route they asked for.
    """
    route = scope.get("route")
    if route is None:
        router = getattr(scope.get("app"), "router", None)
        for candidate in getattr(router, "routes", ()):
            match, _ = candidate.matches(scope)
            if match is not Match.NONE:
                route = candidate
                break
    path = getattr(route, "path", None)
    return path if isinstance(path, str) and path else UNMATCHED_ROUTE


class AccessLogMiddleware:
    def __init__(self, app: ASGIApp, enabled: bool = True) -> None:
        self.app = app
        self.enabled = enabled
        self.refusals = LogBudget()  # rule 9

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        request_id = incoming_request_id(scope) or new_request_id()
        state: dict[str, Any] = scope.setdefault("state", {})
        state["request_id"] = request_id
        id_headers = [(b"request-id", request_id.encode()), (b"x-request-id", request_id.encode())]
        status = 500  # if the app raises before starting a response
        runs: list[Run] = []
        complete = client_gone = False  # rule 6

        async def receive_noting_disconnect() -> Message:
            nonlocal client_gone
            message = await receive()
            if message["type"] == "http.disconnect" and not complete:
                client_gone = True
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, complete
            if message["type"] == "http.response.start":
                status = int(message["status"])
                kept = [(k, v) for k, v in message.get("headers", [])
                        if k.lower() not in (b"request-id", b"x-request-id")]
                message = dict(message)
                message["headers"] = kept + id_headers + budget_headers(runs)
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                complete = True
            await send(message)

        token = _request_runs.set(runs)
        try:
            await self.app(scope, receive_noting_disconnect, send_with_id)
        finally:
            if client_gone:
                status = CLIENT_CLOSED
            _request_runs.reset(token)
            for name, value in runs_tally(runs).items():
                if value is not None:
                    state[name] = value
            runs.clear()  # rule 8: copies of this request's context outlive it
            self._record(scope, state, request_id, status, time.perf_counter() - started)

    def _record(self, scope: Scope, state: dict[str, Any], request_id: str, status: int,
                duration_s: float) -> None:
        route = route_template(scope)
        method = str(scope.get("method", ""))
        noted = {name: state.get(name) for name in STATE_FIELDS}
        metrics = metrics_of(scope.get("app"))
        if metrics is not None:
            _observe(metrics, route, method, status, duration_s, noted)
        ttft = noted.pop("ttft_s")
        line = {"id": request_id, "method": method[:MAX_LOGGED_METHOD], "route": route,
                "path": _bounded_path(str(scope.get("path", ""))), "status": status, **noted,
                "ttft_ms": None if ttft is None else round(ttft * 1000, 1),
                "duration_ms": round(duration_s * 1000, 1)}
        if state.get(PRE_AUTH_REFUSAL):  # rule 9
            log_it, suppressed = self.refusals.take()
            if not log_it:
                return
            if suppressed:
                line["suppressed"] = suppressed
        ring = recent_requests_of(scope.get("app"))
        if ring is not None:
            ring.add(line)
        if self.enabled and access_log.isEnabledFor(logging.INFO):
            access_log.info(json.dumps(line, separators=(",", ":")))


def _bounded_path(path: str) -> str:
    """Rule 9: the path cut to MAX_LOGGED_PATH characters, `...(+N)` saying how many more."""
    if len(path) <= MAX_LOGGED_PATH:
        return path
    return f"{path[:MAX_LOGGED_PATH]}...(+{len(path) - MAX_LOGGED_PATH})"


def _observe(metrics: Metrics, route: str, method: str, status: int, duration_s: float,
             noted: dict[str, Any]) -> None:
    metrics.observe_request(route, status, duration_s, method=method)
    model = str(noted["model"] or "")
    prompt, completion = noted["prompt_tokens"], noted["completion_tokens"]
    if prompt is not None or completion is not None:
        metrics.observe_tokens(int(prompt or 0), int(completion or 0), model=model)
    ttft = noted["ttft_s"]
    if ttft is not None:
        metrics.observe_ttft(float(ttft), model=model)
        if completion is not None and int(completion) > 1 and duration_s > ttft:
            metrics.observe_token_latency((duration_s - ttft) / (int(completion) - 1), model=model)
