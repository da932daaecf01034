"""The uvicorn server `frink-mlx serve` runs: it drains on SIGTERM/SIGINT (serve.py rule 4).

Why a module of its own: importing uvicorn costs a few tenths of a second, so serve.py
imports this only after the backend is selected (serve.py rule 1: the CPU backend may
re-execute the process first, and would pay for the import twice).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from collections.abc import Awaitable, Callable, Iterator
from types import FrameType

import uvicorn

log = logging.getLogger("frink_mlx.server")

Drain = Callable[[], Awaitable[None]]


class DaemonServer(uvicorn.Server):
    """uvicorn.Server that drains on a signal and does not re-raise it."""

    drain: Drain | None = None       # set by serve.py before serving
    drain_timeout_s: float = 0.0
    draining = False                 # a signal came: the drain runs, a second one stops at once
    refusal: str | None = None       # serve.py rule 3's one error line, when the load failed

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        sigs = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in sigs}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        drain = self.drain
        if self.draining or drain is None or not self.started:
            if self.should_exit and sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            return
        log.info("signal %d: draining (new work gets 503; up to %.0f s for streams)",
                 sig, self.drain_timeout_s)
        self.draining = True  # a second signal now stops at once
        loop = asyncio.get_event_loop()
        loop.call_soon_threadsafe(lambda: loop.create_task(self._drain_then_exit(drain)))

    async def _drain_then_exit(self, drain: Drain) -> None:
        try:
            await drain()
        finally:
            self.should_exit = True
