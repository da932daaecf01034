"""Connection guards below the ASGI app: slow headers, idle keep-alive, stuck sends, a cap.

Why here: a daemon that lives on a laptop for months must not keep sockets
for clients that connect and say nothing, or that trickle their headers a byte
at a time (slowloris). uvicorn only times out a connection once it has
answered a request (`timeout_keep_alive`); a fresh connection, or one whose
headers never complete, is never an ASGI request at all, so no middleware can
see it. `GuardedH11Protocol` is uvicorn's h11 protocol with one more timer.

Rules:
1. Headers: from the moment a connection opens, and again whenever it is
   ready for its next request, the request line and headers must complete
   within `header_timeout_s` -- in total, not per byte, so a byte a second
   does not extend it. A connection that sent nothing is closed silently (it
   is just idle); one that sent part of a request gets a bare
   `408 Request Timeout` (`connection: close`) and is closed. Neither is
   logged above INFO: both are the client's doing.
2. Idle keep-alive: after a response, uvicorn closes a connection that sends
   nothing for `idle_timeout_s` (its `timeout_keep_alive`); rule 1's timer
   runs alongside and is the longer bound.
3. Bodies are the ASGI side's: http/security.py's body deadline answers a
   body that is not complete within `body_timeout_s` with a 408 in the
   protocol's envelope.
4. Nothing here touches a request once its headers are in: long streams are
   never cut by these timers.
5. A request answered before its body was all in (rule 3's 408) leaves the
   connection unusable: whatever else of that body arrives is read and
   dropped, and the connection is closed `header_timeout_s` after the answer.
   (uvicorn's keep-alive timer does not cover it: any byte that arrives after
   the answer cancels that timer for good, and such a connection stayed open.)
6. Sends: a client that stops reading fills the socket buffers, asyncio pauses
   writing, and uvicorn's `send` waits -- a stream's pump never returns, its
   run (engine rows, model lease, generation pin) would stay held for as long
   as the socket stays open. So while writing is paused the write buffer is
   sampled every `SEND_POLL_S` (at most a quarter of `send_timeout_s`); any
   drop in it is progress. With no progress for `send_timeout_s` the
   connection is aborted (logged at INFO): uvicorn then reports
   `http.disconnect`, the stream's `on_close` aborts its runs within one
   engine step (http/sse.py rule 2), and the access line says 499
   (http/access.py rule 6). A client that reads slowly but steadily drains
   the buffer and is never cut; nothing runs while writing is not paused.
   Writing pauses only once the kernel's send buffer is full, and the OS
   grows that buffer to megabytes (Linux autotunes to 4 MiB): a stalled n=8
   stream fit whole in it on a slow model, kept generating and its lease,
   and ended 200 to a client that read nothing. So the listening socket caps
   it at `send_buffer_bytes` (256 KiB; accepted connections inherit it,
   server.py `bind_socket`): a stalled reader is noticed after that much.
7. Connections: past `max_connections` open at once, a new one is answered
   as soon as it is accepted -- before a byte of it is read -- with a bare
   `503 Service Unavailable` (`retry-after: 1`, `connection: close`); what it
   sends is dropped, and it is closed once the client closes or after
   REFUSED_LINGER_S. (uvicorn's `limit_concurrency` answers the same 503 only
   after reading and parsing a request's headers, and keeps the connection.)
   Refusals are logged within a LogBudget (http/log_budget.py), so a flood
   of them is a few lines and a count. The file-descriptor limit is raised to
   fit the cap at start-up (cli/serve.py rule 9).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .log_budget import LogBudget

log = logging.getLogger("frink_mlx.http")

TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    b"connection: close\r\ncontent-length: 36\r\n\r\n"
                    b"request headers not complete in time")
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: text/plain; charset=utf-8\r\n"
                 b"retry-after: 1\r\nconnection: close\r\ncontent-length: 26\r\n\r\n"
                 b"too many open connections")
REFUSED_LINGER_S = 2.0


def guarded_protocol(header_timeout_s: float, send_timeout_s: float = 60.0,
                     max_connections: int | None = None) -> type[H11Protocol]:
    """The H11 protocol class for uvicorn's `http=` with rule 1's and rule 6's timers and
    rule 7's cap (None: no cap), each class with its own refusal LogBudget."""

    class Guarded(GuardedH11Protocol):
        HEADER_TIMEOUT_S = header_timeout_s
        SEND_TIMEOUT_S = send_timeout_s
        MAX_CONNECTIONS = max_connections
        REFUSALS = LogBudget()

    return Guarded


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with rule 1's header deadline, rule 6's send watch and rule 7's cap."""

    HEADER_TIMEOUT_S = 30.0
    SEND_TIMEOUT_S = 60.0
    SEND_POLL_S = 1.0
    MAX_CONNECTIONS: int | None = None
    REFUSALS = LogBudget()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._bytes_this_request = 0
        self._send_timer: asyncio.TimerHandle | None = None
        self._send_progress_at = 0.0
        self._send_buffered = 0
        self._refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if self.MAX_CONNECTIONS is not None and len(self.connections) > self.MAX_CONNECTIONS:
            self._refuse_connection()
            return
        self._arm_header_timer()

    def _refuse_connection(self) -> None:
        """Rule 7: a bare 503 before a byte of the connection is read, then close it."""
        self._refused = True
        log_it, suppressed = self.REFUSALS.take()
        if log_it:
            log.warning("refusing a connection from %s: %d open (max_connections %d)%s",
                        _peer(self.client), len(self.connections) - 1, self.MAX_CONNECTIONS,
                        f"; {suppressed} more refused since the last line" if suppressed else "")
        try:
            self.transport.write(BUSY_RESPONSE)
            if self.transport.can_write_eof():
                self.transport.write_eof()
        except OSError:  # the client is gone already
            self.transport.abort()
            return
        self.loop.call_later(REFUSED_LINGER_S, self.transport.close)

    def eof_received(self) -> None:
        if self._refused:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        self._stop_send_watch()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        super().pause_writing()
        if self._send_timer is None:  # rule 6
            self._send_progress_at = self.loop.time()
            self._send_buffered = self.transport.get_write_buffer_size()
            self._send_timer = self.loop.call_later(self._send_poll_s(), self._check_send)

    def resume_writing(self) -> None:
        self._stop_send_watch()
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return  # rule 7: nothing of it is read
        if self._header_timer is not None:
            self._bytes_this_request += len(data)
        super().data_received(data)
        if (self._header_timer is not None and self.conn.their_state is not h11.IDLE
                and not self._answered()):
            self._disarm_header_timer()  # rule 4: the headers are in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing():
            self._arm_header_timer()  # rule 1: the next request's headers (or rule 5)

    def _answered(self) -> bool:
        """The current request got its response while its body was still coming (rule 5)."""
        return self.cycle is not None and self.cycle.response_complete

    def _arm_header_timer(self) -> None:
        self._disarm_header_timer()
        self._bytes_this_request = 0
        self._header_timer = self.loop.call_later(self.HEADER_TIMEOUT_S, self._header_timeout)

    def _disarm_header_timer(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing():
            return
        if self.conn.their_state is not h11.IDLE:
            if self._answered():  # rule 5: the rest of an abandoned body never came
                self.transport.close()
            return
        if self.cycle is not None and not self.cycle.response_complete:
            return  # a pipelined request waits behind a running response
        if self._bytes_this_request:
            log.info("closing %s: request headers incomplete after %.0f s", _peer(self.client),
                     self.HEADER_TIMEOUT_S)
            self.transport.write(TIMEOUT_RESPONSE)
        self.transport.close()


    def _send_poll_s(self) -> float:
        return min(self.SEND_POLL_S, self.SEND_TIMEOUT_S / 4)

    def _stop_send_watch(self) -> None:
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None

    def _check_send(self) -> None:
        """Rule 6: one sample of the paused write buffer."""
        self._send_timer = None
        if self.transport.is_closing() or not self.flow.write_paused:
            return
        now, buffered = self.loop.time(), self.transport.get_write_buffer_size()
        if buffered < self._send_buffered:
            self._send_progress_at = now
        self._send_buffered = buffered
        if now - self._send_progress_at >= self.SEND_TIMEOUT_S:
            log.info("closing %s: the client read nothing for %.0f s (send_timeout_s)",
                     _peer(self.client), self.SEND_TIMEOUT_S)
            self.transport.abort()
            return
        self._send_timer = self.loop.call_later(self._send_poll_s(), self._check_send)


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
