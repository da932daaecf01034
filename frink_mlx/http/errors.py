"""FrinkError -> each protocol's error envelope, and the one endpoint wrapper.

Nothing below the adapters knows about HTTP: errors carry a status, a code, a
param and maybe `retry_after_s` (errors.py). This module is the only place
that turns them into responses, so every route answers the same way:

1. A `FrinkError` becomes its status and the protocol's envelope.
2. Anything else is a bug: logged with its traceback and answered as a 500
   `internal_error` envelope -- never a hung request, never an HTML page.
3. `retry_after_s` becomes a `Retry-After` header (whole seconds, at least 1).
4. A client that went away -- mid-body (Starlette's `ClientDisconnect`) or
   before a non-streaming answer was ready (`ClientDisconnected`) -- is not an
   error of ours: an empty 499 (nobody reads it; the access line records it),
   nothing logged at ERROR.

Envelopes:
    OpenAI     {"error": {"message", "type", "param", "code"}}; a context overflow adds
               `n_prompt_tokens` and `n_ctx`, and on llama-server's un-prefixed alias
               (`/chat/completions`) its type is llama-server's `exceed_context_size_error`
               (the code stays OpenAI's `context_length_exceeded`)
    Anthropic  {"type": "error", "error": {"type", "message"}}; a context overflow's message
               is Anthropic's own words, `prompt is too long: N tokens > M maximum` (Claude
               Code compacts its context only when it reads that)
    llama.cpp  {"error": {"code": <status>, "message", "type"}} with llama-server's types by
               status (invalid_request_error, authentication_error, permission_error,
               not_found_error, not_supported_error, unavailable_error, server_error); a
               context overflow is `exceed_context_size_error` with `n_prompt_tokens`, `n_ctx`
    Ollama     {"error": "<message>"}
"""

from __future__ import annotations

import functools
import logging
import math
from typing import Any, Awaitable, Callable

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from ..errors import ContextLengthExceeded, FrinkError
from .access import CLIENT_CLOSED
from .sse import ClientDisconnected

log = logging.getLogger("frink_mlx.http")

Envelope = Callable[[FrinkError], JSONResponse]
Handler = Callable[[Request], Awaitable[Response]]

_ANTHROPIC_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 409: "invalid_request_error", 413: "request_too_large",
    421: "permission_error", 429: "rate_limit_error", 501: "api_error", 503: "overloaded_error",
}


def _headers(exc: FrinkError) -> dict[str, str] | None:
    if exc.retry_after_s is None:
        return None
    return {"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))}


def openai_error(exc: FrinkError) -> JSONResponse:
    return JSONResponse(error_body(exc), status_code=exc.status, headers=_headers(exc))


def llama_server_openai_error(exc: FrinkError) -> JSONResponse:
    """OpenAI's envelope as llama-server's un-prefixed OpenAI routes answer it."""
    body = error_body(exc)
    if isinstance(exc, ContextLengthExceeded):
        body["error"]["type"] = "exceed_context_size_error"
    return JSONResponse(body, status_code=exc.status, headers=_headers(exc))


def anthropic_error(exc: FrinkError) -> JSONResponse:
    kind = _ANTHROPIC_TYPES.get(exc.status, "api_error")
    message = exc.message
    if isinstance(exc, ContextLengthExceeded):
        message = f"prompt is too long: {exc.num_tokens} tokens > {exc.limit} maximum"
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return JSONResponse(body, status_code=exc.status, headers=_headers(exc))


_LLAMACPP_TYPES = {
    400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
    404: "not_found_error", 501: "not_supported_error", 503: "unavailable_error",
}


def llamacpp_error(exc: FrinkError) -> JSONResponse:
    kind = _LLAMACPP_TYPES.get(exc.status, "invalid_request_error" if exc.status < 500
                               else "server_error")
    error: dict[str, Any] = {"code": exc.status, "message": exc.message, "type": kind}
    if isinstance(exc, ContextLengthExceeded):
        error.update(type="exceed_context_size_error", n_prompt_tokens=exc.num_tokens,
                     n_ctx=exc.limit)
    body = {"error": error}
    return JSONResponse(body, status_code=exc.status, headers=_headers(exc))


def ollama_error(exc: FrinkError) -> JSONResponse:
    return JSONResponse({"error": exc.message}, status_code=exc.status, headers=_headers(exc))


def as_frink_error(exc: BaseException) -> FrinkError:
    """`exc` itself when it is a FrinkError, else a 500 that hides internals."""
    if isinstance(exc, FrinkError):
        return exc
    log.error("unhandled error", exc_info=exc)
    return FrinkError(f"Internal server error ({type(exc).__name__}).")


def endpoint(envelope: Envelope) -> Callable[[Handler], Handler]:
    """Decorate a Starlette endpoint so every error leaves in `envelope`'s shape."""

    def wrap(handler: Handler) -> Handler:
        @functools.wraps(handler)
        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except (ClientDisconnect, ClientDisconnected):  # rule 4
                return Response(status_code=CLIENT_CLOSED)
            except Exception as exc:  # noqa: BLE001 - rule 2 above
                return envelope(as_frink_error(exc))

        return run

    return wrap


def error_body(exc: FrinkError) -> dict[str, Any]:
    """The OpenAI-shaped error object (also for errors sent inside an open stream)."""
    error: dict[str, Any] = {"message": exc.message, "type": exc.type, "param": exc.param,
                             "code": exc.code}
    if isinstance(exc, ContextLengthExceeded):
        error.update(n_prompt_tokens=exc.num_tokens, n_ctx=exc.limit)
    return {"error": error}
