"""Security by default for a daemon that lives on a laptop for months.

Local daemons have been attacked from web pages through DNS rebinding and
permissive CORS. Every HTTP request therefore passes these gates, in order,
inside one pure ASGI middleware (BaseHTTPMiddleware would break streaming
and disconnect detection):

1. Host allow-list. `Host` must be localhost, 127.0.0.1, [::1], the bound
   address (when it is a specific one) or a name in `settings.allowed_hosts`;
   anything else gets 421 Misdirected Request. This defeats DNS rebinding,
   where evil.example resolves to 127.0.0.1 but the browser still sends
   `Host: evil.example`.
2. Origin / CORS. Allowed origins are exact strings from
   `settings.cors_origins` (none by default; `*` is never emitted).
   A preflight (OPTIONS + Origin + Access-Control-Request-Method) is answered
   here, before auth, since browsers never attach credentials to it: an
   allowed origin gets its exact origin echoed, any other gets 403 and no
   allow headers. A non-preflight request carrying a foreign `Origin` is
   refused with 403 too (a page cannot make the daemon do work, e.g. an admin
   load via a "simple" form POST, even though it could not read the answer).
   Same-origin requests (Origin's host:port == Host) pass.
3. Body size. A `Content-Length` above `settings.max_body_bytes` gets 413
   before a byte of the body is read (http/body.py enforces the limit again
   on chunked bodies).
4. API key, when one is configured (`resolve_api_key`): `Authorization:
   Bearer KEY` or `x-api-key: KEY`, compared with `hmac.compare_digest`.
   `/health` and the status page's shell (`/`, `/ui/*`: static files that
   hold no data) stay open; everything else (admin, status, metrics) is
   gated, so the page shows nothing until it is given the key.
5. Body deadline. The whole body must arrive within `settings.body_timeout_s`
   of the request's start -- a total, not a per-read stall limit, so a client
   sending a byte a second cannot hold a slot forever; past it, the body read
   raises `RequestTimeout` (408 in the protocol's envelope). (Header and idle
   timeouts live below ASGI: http/timeouts.py.)
6. Concurrency bound. At most `settings.max_batch + settings.max_queue`
   requests are in flight (running + queued); beyond that, 503 with
   `Retry-After`. `/health`, `/metrics`, `/admin/status` and the page's
   shell are exempt so a flooded daemon still answers them (and can show why).
7. WebSocket upgrades are refused (closed before accept: 403) ahead of every
   gate above; no route speaks WebSocket, and none of the gates would see one.

Refusals are rendered in the protocol's own envelope, chosen by path:
Anthropic for /v1/messages*, llama.cpp for its native routes, Ollama for
/api/*, OpenAI for the rest (see http/errors.py).

Keys and what the daemon may bind to: http/binding.py.
"""

from __future__ import annotations

import hmac
import logging
import re

import anyio
from starlette.datastructures import Headers
from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from ..errors import (
    AuthenticationFailed,
    FrinkError,
    InvalidRequest,
    MisdirectedRequest,
    Overloaded,
    PayloadTooLarge,
    PermissionDenied,
    RequestTimeout,
)
from ..metrics import metrics_of
from ..settings import Settings
from .access import PRE_AUTH_REFUSAL, AccessLogMiddleware
from .binding import LOOPBACK_NAMES, check_cors_origins, resolve_api_key
from .errors import Envelope, anthropic_error, llamacpp_error, ollama_error, openai_error

log = logging.getLogger("frink_mlx.http")

OPEN_PATHS = frozenset({"/health", "/v1/health", "/"})  # no key needed
OPEN_PREFIXES = ("/ui/",)                           # the page's static assets (no data)
# cheap; must answer during a flood
UNBOUNDED_PATHS = frozenset({"/health", "/v1/health", "/metrics", "/admin/status", "/"})
# llama.cpp's native routes answer in its envelope; /v1/messages* in Anthropic's.
LLAMACPP_PATHS = frozenset({
    "/completion", "/completions", "/tokenize", "/detokenize", "/infill", "/embedding",
    "/props", "/slots", "/apply-template",
})
CORS_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_EXPOSE = ("request-id, x-request-id, retry-after, frink-max-tokens, "
               "frink-max-tokens-requested, x-frink-ignored-fields")
CORS_MAX_AGE_S = 600
_TOKEN_LIST = re.compile(r"^[A-Za-z0-9!#$%&'*+.^_`|~-]+(\s*,\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+)*$")


def envelope_for_path(path: str) -> Envelope:
    """The error envelope a client of `path` expects."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return anthropic_error
    if path in LLAMACPP_PATHS:
        return llamacpp_error
    if path.startswith("/api/"):
        return ollama_error
    return openai_error


# --- request checks --------------------------------------------------------

def _host_name(host_header: str) -> str:
    """`example.com:8177` -> `example.com`; `[::1]:8177` -> `::1`."""
    value = host_header.strip().lower()
    if value.startswith("["):
        end = value.find("]")
        return value[1:end] if end > 0 else value
    if value.count(":") == 1:
        return value.split(":", 1)[0]
    return value


def allowed_host_names(settings: Settings) -> frozenset[str]:
    names = set(LOOPBACK_NAMES)
    names.update(h.strip().strip("[]").lower() for h in settings.allowed_hosts if h.strip())
    bound = settings.host.strip().strip("[]").lower()
    if bound not in ("0.0.0.0", "::", ""):
        names.add(bound)
    return frozenset(names)


def _origin_netloc(origin: str) -> str | None:
    match = re.match(r"^[a-z][a-z0-9+.-]*://([^/?#]+)$", origin.strip().lower())
    return match.group(1) if match else None


def _presented_key(headers: Headers) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, value = auth.partition(" ")
        if scheme.lower() == "bearer" and value.strip():
            return value.strip()
    return headers.get("x-api-key") or None


class SecurityMiddleware:
    """Gates 1-7 of the module docstring. State lives on the instance (one per app)."""

    def __init__(self, app: ASGIApp, settings: Settings, api_key: str | None) -> None:
        self.app = app
        check_cors_origins(settings.cors_origins)
        self.api_key = api_key.encode() if api_key else None
        self.hosts = allowed_host_names(settings)
        self.origins = frozenset(o.strip() for o in settings.cors_origins if o.strip())
        self.max_body_bytes = settings.max_body_bytes
        self.body_timeout_s = settings.body_timeout_s
        self.max_in_flight = max(1, settings.max_batch + settings.max_queue)
        self.in_flight = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # no route speaks it: refused before any gate
            await _refuse_websocket(scope, receive, send)
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        path: str = scope.get("path", "")
        origin = headers.get("origin")
        refusal = self._check_host(headers) or self._check_origin(headers, origin)
        if refusal is None and _is_preflight(scope, headers):
            await self._preflight(headers, origin or "", send)
            return
        refusal = refusal or self._check_size(headers) or self._check_key(path, headers)
        if refusal is not None:
            await self._refuse(scope, path, refusal, origin, receive, send)
            return
        if path in UNBOUNDED_PATHS or path.startswith(OPEN_PREFIXES):
            await self.app(scope, receive, self._with_cors(origin, send))
            return
        if self.in_flight >= self.max_in_flight:
            busy = Overloaded(f"the daemon has {self.in_flight} requests in flight "
                              f"(limit {self.max_in_flight}); retry shortly", retry_after_s=1.0)
            await self._refuse(scope, path, busy, origin, receive, send)
            return
        self.in_flight += 1
        metrics = metrics_of(scope.get("app"))
        if metrics is not None:
            metrics.in_flight.set(self.in_flight)
        try:
            await self.app(scope, self._with_deadline(receive), self._with_cors(origin, send))
        finally:
            self.in_flight -= 1
            if metrics is not None:
                metrics.in_flight.set(self.in_flight)

    # Each check returns the error to answer with, or None to go on.
    def _check_host(self, headers: Headers) -> FrinkError | None:
        host = headers.get("host")
        if host is None or _host_name(host) not in self.hosts:
            shown = (host or "")[:100]
            return MisdirectedRequest(
                f"Host '{shown}' is not served here; allowed: localhost, 127.0.0.1, [::1] "
                "and names given with --allowed-host", param="Host")
        return None

    def _check_origin(self, headers: Headers, origin: str | None) -> FrinkError | None:
        if origin is None or origin in self.origins:
            return None
        if _origin_netloc(origin) == (headers.get("host") or "").strip().lower():
            return None  # same origin
        return PermissionDenied(
            f"Origin '{origin[:100]}' is not allowed; add it with --cors-origin", param="Origin")

    def _check_size(self, headers: Headers) -> FrinkError | None:
        raw = headers.get("content-length")
        if raw is None:
            return None
        if not raw.strip().isdigit():
            return InvalidRequest("Content-Length is not a number", param="Content-Length")
        if int(raw) > self.max_body_bytes:
            return PayloadTooLarge(
                f"request body of {int(raw)} bytes exceeds the limit of "
                f"{self.max_body_bytes} bytes", param="Content-Length")
        return None

    def _check_key(self, path: str, headers: Headers) -> FrinkError | None:
        if self.api_key is None or path in OPEN_PATHS or path.startswith(OPEN_PREFIXES):
            return None
        presented = _presented_key(headers)
        if presented is None:
            return AuthenticationFailed(
                "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'")
        if not hmac.compare_digest(presented.encode(), self.api_key):
            return AuthenticationFailed("invalid API key")
        return None

    def _with_deadline(self, receive: Receive) -> Receive:
        body_done = False
        deadline = anyio.current_time() + self.body_timeout_s  # gate 5: the whole body

        async def receive_with_deadline() -> Message:
            nonlocal body_done
            if body_done:  # later receives wait for http.disconnect: no deadline
                return await receive()
            with anyio.move_on_after(max(0.0, deadline - anyio.current_time())):
                message = await receive()
                if message["type"] != "http.request" or not message.get("more_body", False):
                    body_done = True
                return message
            raise RequestTimeout(f"the request body stalled: it was not complete within "
                                 f"{self.body_timeout_s:g} s", param="body")
        return receive_with_deadline

    async def _preflight(self, headers: Headers, origin: str, send: Send) -> None:
        response_headers = self._cors_headers(origin)
        response_headers["access-control-allow-methods"] = CORS_METHODS
        requested = headers.get("access-control-request-headers", "")
        if requested and _TOKEN_LIST.match(requested.strip()):
            response_headers["access-control-allow-headers"] = requested.strip()
        response_headers["access-control-max-age"] = str(CORS_MAX_AGE_S)
        await send({"type": "http.response.start", "status": 204,
                    "headers": [(k.encode(), v.encode()) for k, v in response_headers.items()]})
        await send({"type": "http.response.body", "body": b""})

    def _cors_headers(self, origin: str | None) -> dict[str, str]:
        if origin is None or origin not in self.origins:
            return {}
        return {"access-control-allow-origin": origin, "vary": "Origin",
                "access-control-expose-headers": CORS_EXPOSE}

    def _with_cors(self, origin: str | None, send: Send) -> Send:
        extra = self._cors_headers(origin)
        if not extra:
            return send

        async def send_with_cors(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = dict(message)
                message["headers"] = list(message.get("headers", [])) + [
                    (k.encode(), v.encode()) for k, v in extra.items()]
            await send(message)
        return send_with_cors

    async def _refuse(self, scope: Scope, path: str, exc: FrinkError, origin: str | None,
                      receive: Receive, send: Send) -> None:
        metrics = metrics_of(scope.get("app"))
        if metrics is not None:
            metrics.observe_rejection(_REASONS.get(type(exc), exc.code))
        if isinstance(exc, _PRE_AUTH):  # its access line is rate-limited (http/access.py rule 9)
            scope.setdefault("state", {})[PRE_AUTH_REFUSAL] = True
        response = envelope_for_path(path)(exc)
        await response(scope, receive, self._with_cors(origin, send))


_REASONS: dict[type, str] = {
    MisdirectedRequest: "host", PermissionDenied: "origin", PayloadTooLarge: "size",
    InvalidRequest: "size", AuthenticationFailed: "auth", Overloaded: "overloaded",
}


async def _refuse_websocket(scope: Scope, receive: Receive, send: Send) -> None:
    """A WebSocket upgrade is closed before it is accepted (the server answers 403):
    none of gates 1-6 would otherwise see it."""
    metrics = metrics_of(scope.get("app"))
    if metrics is not None:
        metrics.observe_rejection("websocket")
    message = await receive()
    if message["type"] == "websocket.connect":
        await send({"type": "websocket.close", "code": 1008})


_PRE_AUTH = (MisdirectedRequest, PermissionDenied, AuthenticationFailed)


def _is_preflight(scope: Scope, headers: Headers) -> bool:
    return (scope.get("method") == "OPTIONS" and "origin" in headers
            and "access-control-request-method" in headers)


def build_middleware(settings: Settings) -> list[Middleware]:
    """The daemon's middleware, outermost first: access log + request id, then security.

    Resolves the API key once (a bad key file raises ConfigError at app build).
    """
    key = resolve_api_key(settings)
    return [
        Middleware(AccessLogMiddleware, enabled=settings.access_log),
        Middleware(SecurityMiddleware, settings=settings, api_key=key),
    ]


__all__ = [
    "OPEN_PATHS", "OPEN_PREFIXES", "SecurityMiddleware", "build_middleware", "envelope_for_path",
]
