"""The one request skeleton every generating route runs, whatever its protocol.

Five protocols (OpenAI chat, completions and Responses, Anthropic messages,
llama.cpp /completion and /infill, Ollama /api/chat and /api/generate) share
one shape; written once here so they cannot drift apart again (they had: a
client that left before a non-streaming answer was a 499 on two routes and a
logged 500 traceback on four). A protocol supplies only what is its own --
its wire struct, a `start` that translates and submits, its frames and its
collected body -- and gets, identically:

1. The body is read (413 past the limit, 408 on a stall), decoded into the
   wire struct (400 naming the field) -- all in the protocol's envelope. A
   client that drops mid-body is a 499, never a 500 (http/errors.py rule 4).
2. `start(request, body)` translates and calls `generate`, which leases,
   renders, validates and admits every prompt before a single byte is sent, so
   template errors, context overflows and bad schemas are real statuses on
   streaming requests too. A large body is decoded, translated (`translated`),
   rendered and tokenized in a worker thread (core/offload.py).
3. Streaming: the protocol's frames go out in its framing (SSE, or NDJSON for
   Ollama) raced against the client's disconnect; every run is aborted when the
   response ends, however it ends -- a gone client's decode stops within one
   engine step and its KV blocks are freed.
4. Non-streaming: the protocol's `collect()` is raced against disconnect the
   same way; a client that leaves is a 499 and its runs are aborted. An error
   the engine reports before anything was sent is a real status in the envelope.
5. Errors: a `FrinkError` leaves in the protocol's envelope with its status;
   anything else is logged once at ERROR and answered 500 (http/errors.py).
6. Accounting: `Frontend.generate` tracks every run for the access line and
   the metrics (http/access.py rule 3), which the access middleware writes
   once per request, with 499 for any answer the client did not wait for
   (rule 6 there). Protocols note nothing themselves.
7. Frames: each protocol's frames.py builds its answer with a `FrameBuilder`
   (start / feed / end / result), and every JSON it writes -- frame or body --
   goes through `dumps` / `json_response` here, one msgspec encoder.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, TypeVar
from typing import Protocol as TypingProtocol

import anyio
import msgspec
from starlette.requests import Request
from starlette.responses import Response

from ..core.events import Event, drain_choice
from ..core.images import OMITTED_HEADER
from ..core.request import GenRequest
from ..http.body import decode_body
from ..http.errors import Envelope, endpoint
from ..http.frontend import frontend
from ..http.sse import StreamResponse, run_until_disconnect

log = logging.getLogger("frink_mlx.adapters")

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectSendStream

    from ..serving.handles import Run

W = TypeVar("W")
T = TypeVar("T")
F = TypeVar("F")
_ENCODE = msgspec.json.Encoder()

SSE_MEDIA_TYPE = "text/event-stream"
NDJSON_MEDIA_TYPE = "application/x-ndjson"


def dumps(obj: Any) -> str:
    """Rule 7: JSON text (msgspec), the one way every adapter writes a frame's JSON."""
    return _ENCODE.encode(obj).decode()


def ndjson_line(obj: Any) -> str:
    """One NDJSON line (Ollama's stream framing): compact JSON and a newline."""
    return dumps(obj) + "\n"


def json_response(obj: Any, status: int = 200, headers: dict[str, str] | None = None
                  ) -> Response:
    """A JSON body (msgspec-encoded), the one way every adapter answers in JSON."""
    return Response(_ENCODE.encode(obj), status_code=status, media_type="application/json",
                    headers=headers)


class FrameBuilder(TypingProtocol[F]):
    """Rule 7: one answer built from its events, what every protocol's frames.py offers.

    `start()` the frames before the first event, `feed(event)` those one event makes,
    `end()` those after the last (each protocol frames them: SSE, NDJSON), and
    `result()` the collected body of a non-streaming answer."""

    def start(self) -> list[F]: ...
    def feed(self, event: Event) -> list[F]: ...
    def end(self) -> list[F]: ...
    def result(self) -> Any: ...


async def collected(run: Run, builder: FrameBuilder[Any]) -> Any:
    """Rule 4's body for a one-choice answer: choice 0's events fed to `builder`, then its
    result (an ErrorEvent raises its own error: nothing has been sent yet)."""
    await drain_choice(run.events(), builder.feed)
    return builder.result()


@dataclass(frozen=True, slots=True)
class Protocol:
    """What differs between protocols at the HTTP edge: the error envelope and
    the stream framing. `keepalive_frame` None = the framing has no harmless
    keepalive (NDJSON), so nothing is sent while the model is silent."""

    name: str
    envelope: Envelope
    media_type: str = SSE_MEDIA_TYPE
    keepalive_frame: str | None = ": keepalive\n\n"
    keepalive_s: float = 15.0


@dataclass(slots=True)
class Answer:
    """What a protocol's `start` returns: the runs it submitted, and how to
    render them -- as a stream of frames, or collected into one JSON body."""

    runs: list["Run"]
    stream: bool
    frames: Callable[[], AsyncIterator[str]]
    collect: Callable[[], Awaitable[Any]]
    headers: dict[str, str] = field(default_factory=dict)

    async def abort(self) -> None:
        """Stop every run (a no-op for runs that already finished)."""
        for run in self.runs:
            await run.abort()


Start = Callable[[Request, W], Awaitable[Answer]]


async def generate(request: Request, reqs: list[GenRequest]) -> list["Run"]:
    """Submit every request (rule 2); if one is refused, abort those already started."""
    front = frontend(request)
    runs: list[Run] = []
    try:
        for req in reqs:
            runs.append(await front.generate(req))
    except BaseException:
        for run in runs:
            await run.abort()
        raise
    if runs and runs[0].images_omitted:
        note_omitted_images(request, reqs[0])
    return runs


async def translated(request: Request, fn: Callable[..., T], *args: Any) -> T:
    """`fn(*args)`, a protocol's translation of its decoded body, in a worker thread when
    the body was large (core/offload.py rule 2): 70,000 messages take a second to walk."""
    size = getattr(request.state, "body_bytes", 0)
    return await frontend(request).offload.run(size, fn, *args)


def note_omitted_images(request: Request, req: GenRequest) -> None:
    """core/images.py rule 2: the count for the header, the parts in the log."""
    paths = [ref.path for ref in req.images]
    request.state.omitted_images = len(paths)
    log.info("%d image part(s) replaced by a placeholder (text-only model): %s",
             len(paths), ", ".join(paths[:8]))


def generating(protocol: Protocol, wire: type[W], start: Start[W]
               ) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint for `protocol`: decode `wire`, `start`, then stream or collect.

    A plain function (Starlette treats any other callable as a raw ASGI app)."""

    @endpoint(protocol.envelope)                                   # rule 5
    async def serve(request: Request) -> Response:
        body = await decode_body(request, wire)                    # rule 1
        answer = await start(request, body)                        # rule 2
        if omitted := getattr(request.state, "omitted_images", 0):
            answer.headers[OMITTED_HEADER] = str(omitted)            # core/images.py rule 2
        if answer.stream:                                          # rule 3
            return StreamResponse(answer.frames(), on_close=answer.abort,
                                  keepalive_s=protocol.keepalive_s,
                                  keepalive_frame=protocol.keepalive_frame,
                                  media_type=protocol.media_type, headers=answer.headers)
        try:                                                       # rule 4
            result = await run_until_disconnect(request, answer.collect, answer.abort)
        finally:
            await answer.abort()
        response = json_response(result)
        response.headers.update(answer.headers)
        return response

    return serve


async def merged(runs: list[Run]) -> AsyncIterator[tuple[int, Event]]:
    """Events of every run as they come, tagged with the run's position."""
    if len(runs) == 1:
        async for event in runs[0].events():
            yield 0, event
        return
    send, recv = anyio.create_memory_object_stream[tuple[int, Event]](64)

    async def pump(k: int, run: Run, out: MemoryObjectSendStream[tuple[int, Event]]) -> None:
        async with out:
            async for event in run.events():
                await out.send((k, event))

    async with anyio.create_task_group() as tg:
        async with send:
            for k, run in enumerate(runs):
                tg.start_soon(pump, k, run, send.clone())
        async with recv:
            async for item in recv:
                yield item
