"""Anthropic Messages API: POST /v1/messages and POST /v1/messages/count_tokens.

The routes only translate (translate.py) and frame; adapters/endpoint.py runs
the request skeleton and the daemon's Frontend does the work. Quirks kept on purpose:
1. Every error -- malformed JSON included -- leaves in Anthropic's envelope
   `{"type": "error", "error": {"type", "message"}}` with the error's status.
2. The prompt is rendered and admitted before the SSE header is sent, so a
   template error or an over-long prompt is a real 400, not an `error` event.
3. Streams send `ping` right after `message_start` (as Anthropic does) and as
   the keepalive while the model is silent; an engine failure mid-stream is an
   `error` event, after which the stream ends.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, AsyncIterator

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from ...core.events import choice_events
from ...http.body import decode_body
from ...http.errors import anthropic_error, endpoint
from ...http.frontend import frontend
from ...http.sse import sse_frame
from ..endpoint import Answer, Protocol, collected, dumps, generate, generating, translated
from . import wire
from .frames import Frame, MessageBuilder
from .translate import thinking_shown, to_gen_request

if TYPE_CHECKING:
    from ...serving.handles import Run

PING_FRAME = sse_frame(dumps({"type": "ping"}), event="ping")
ANTHROPIC = Protocol("anthropic", anthropic_error, keepalive_frame=PING_FRAME)


def _message_id(run: Run) -> str:
    run_id = str(getattr(run, "id", "") or uuid.uuid4().hex)
    return run_id if run_id.startswith("msg_") else f"msg_{run_id.split('-')[-1]}"


def _encode(frames: list[Frame]) -> str:
    return "".join(sse_frame(dumps(payload), event=name)
                   for name, payload in frames)


async def _stream(run: Run, builder: MessageBuilder) -> AsyncIterator[str]:
    yield _encode(builder.start())
    async for event in choice_events(run.events()):
        frames = builder.feed(event)
        if frames:
            yield _encode(frames)


async def start_message(request: Request, body: wire.MessagesRequest) -> Answer:
    (run,) = await generate(request, [await translated(request, to_gen_request, body)])
    builder = MessageBuilder(id=_message_id(run), model=run.model,
                             prompt_tokens=run.prompt_tokens, show_thinking=thinking_shown(body))
    return Answer([run], body.stream, lambda: _stream(run, builder),
                  lambda: collected(run, builder))


create_message = generating(ANTHROPIC, wire.MessagesRequest, start_message)


@endpoint(anthropic_error)
async def count_tokens(request: Request) -> Response:
    body = await decode_body(request, wire.CountTokensRequest)
    num_tokens = await frontend(request).count_tokens(
        await translated(request, to_gen_request, body))
    return JSONResponse({"input_tokens": num_tokens})


routes: list[BaseRoute] = [
    Route("/v1/messages", create_message, methods=["POST"]),
    Route("/v1/messages/count_tokens", count_tokens, methods=["POST"]),
]
