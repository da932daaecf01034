"""Connection timeouts below the ASGI app: idle keep-alive and slow request headers.

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
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

log = logging.getLogger("frink_mlx.http")

TIMEOUT_RESPONSE = (b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
                    b"connection: close\r\ncontent-length: 36\r\n\r\n"
                    b"request headers not complete in time")


def guarded_protocol(header_timeout_s: float) -> type[H11Protocol]:
    """The H11 protocol class for uvicorn's `http=` with rule 1's timer set to `header_timeout_s`."""

    class Guarded(GuardedH11Protocol):
        HEADER_TIMEOUT_S = header_timeout_s

    return Guarded


class GuardedH11Protocol(H11Protocol):
    """uvicorn's H11Protocol with rule 1's header deadline."""

    HEADER_TIMEOUT_S = 30.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None
        self._bytes_this_request = 0

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_header_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
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


def _peer(client: tuple[str, int] | None) -> str:
    return f"{client[0]}:{client[1]}" if client else "a client"
