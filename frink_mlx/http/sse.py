"""Streamed responses (SSE, NDJSON), and racing a request against its client's disconnect.

Why not Starlette's StreamingResponse as is: with ASGI spec >= 2.4 servers it
stops listening for `http.disconnect` and only notices a gone client on the
next failed send -- and a decode that is between frames would keep running.
Here the frame pump and a disconnect listener always run side by side:

1. Whichever ends first cancels the other.
2. `on_close` runs exactly once however the response ends (finished,
   disconnected, failed); for a generation it is `run.abort()`, which is a
   no-op after a normal finish and stops the decode within one step otherwise.
3. While the producer is silent for `keepalive_s`, `keepalive_frame` is sent
   (an SSE comment by default), so proxies and clients keep the stream open.
   A framing without a harmless keepalive (NDJSON: every line must be a JSON
   object) passes `keepalive_frame=None` and sends nothing while silent.
4. The media type is the framing's (`text/event-stream` for SSE,
   `application/x-ndjson` for Ollama's NDJSON); the machinery is the same.

`run_until_disconnect` is the same race for non-streaming requests: the
handler awaits the whole answer while a listener watches the socket.
"""

from __future__ import annotations

import inspect
import json
import logging
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import anyio
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

T = TypeVar("T")
log = logging.getLogger("frink_mlx.http")
OnClose = Callable[[], Any]

SSE_HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no", "connection": "keep-alive"}


def sse_frame(data: str, event: str | None = None) -> str:
    """One SSE frame: optional `event:` line, one `data:` line per line of data."""
    head = f"event: {event}\n" if event else ""
    return head + "".join(f"data: {line}\n" for line in data.split("\n")) + "\n"


async def _call(fn: OnClose | None) -> None:
    if fn is None:
        return
    result = fn()
    if inspect.isawaitable(result):
        await result


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


def ndjson_frame(obj: Any) -> str:
    """One NDJSON line: a compact JSON object and a newline (Ollama's stream framing)."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


class StreamResponse(Response):
    """A streamed response that races its frames against disconnect (rules 1-4)."""

    def __init__(self, frames: AsyncIterator[bytes | str], *, on_close: OnClose | None = None,
                 keepalive_s: float | None = 15.0,
                 keepalive_frame: str | None = ": keepalive\n\n",
                 media_type: str = "text/event-stream", status_code: int = 200,
                 headers: dict[str, str] | None = None) -> None:
        self.frames = frames
        self.on_close = on_close
        self.keepalive_s = keepalive_s if keepalive_frame is not None else None
        self.keepalive_frame = (keepalive_frame or "").encode()
        self.media_type = media_type
        self.status_code = status_code
        self.background = None
        self.init_headers({**SSE_HEADERS, **(headers or {})})

    async def _pump(self, send: Send) -> None:
        send_chan, recv_chan = anyio.create_memory_object_stream[bytes](1)

        async def produce() -> None:
            async with send_chan:
                try:
                    async for frame in self.frames:
                        await send_chan.send(frame.encode() if isinstance(frame, str) else frame)
                except Exception as exc:  # frames should end in an error frame; a bug ends here
                    log.error("stream producer failed", exc_info=exc)

        await send({"type": "http.response.start", "status": self.status_code,
                    "headers": self.raw_headers})
        async with anyio.create_task_group() as tg:
            tg.start_soon(produce)
            async with recv_chan:
                while True:
                    with anyio.move_on_after(self.keepalive_s or float("inf")) as scope:
                        try:
                            chunk = await recv_chan.receive()
                        except anyio.EndOfStream:
                            break
                    if scope.cancelled_caught:
                        chunk = self.keepalive_frame
                    await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as tg:

                async def pump_then_stop() -> None:
                    await self._pump(send)
                    tg.cancel_scope.cancel()

                async def listen_then_stop() -> None:
                    await _wait_disconnect(receive)
                    tg.cancel_scope.cancel()

                tg.start_soon(pump_then_stop)
                tg.start_soon(listen_then_stop)
        except OSError:
            pass  # the client went away mid-send
        finally:
            with anyio.CancelScope(shield=True):
                await _call(self.on_close)


def sse_response(frames: AsyncIterator[bytes | str], *, on_close: OnClose | None = None,
                 keepalive_s: float | None = 15.0,
                 keepalive_frame: str = ": keepalive\n\n") -> Response:
    return StreamResponse(frames, on_close=on_close, keepalive_s=keepalive_s,
                          keepalive_frame=keepalive_frame)


class ClientDisconnected(Exception):
    """The client went away before a non-streaming answer was ready."""


async def run_until_disconnect(request: Request, work: Callable[[], Awaitable[T]],
                               on_disconnect: OnClose | None = None) -> T:
    """Await `work()`; if the client disconnects first, cancel it, call
    `on_disconnect` and raise ClientDisconnected. The body must be read already."""
    result: list[T] = []
    failure: list[BaseException] = []
    gone = False

    async with anyio.create_task_group() as tg:

        async def do_work() -> None:
            try:
                result.append(await work())
            except Exception as exc:  # re-raised below, outside the task group
                failure.append(exc)
            tg.cancel_scope.cancel()

        async def listen() -> None:
            nonlocal gone
            await _wait_disconnect(request.receive)
            gone = True
            tg.cancel_scope.cancel()

        tg.start_soon(do_work)
        tg.start_soon(listen)
    if failure:
        raise failure[0]
    if gone or not result:
        with anyio.CancelScope(shield=True):
            await _call(on_disconnect)
        raise ClientDisconnected()
    return result[0]
