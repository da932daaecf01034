"""The decode gate: one process-wide, fair lock around every piece of MLX work.

Why: MLX (and Metal command buffers in particular) is not safe to drive from
several threads at once. Each engine owns one MLX thread, and several
engines run at once when several models are resident (serving/residency.py);
encoders (embeddings) run on other threads too. So every step takes this
lock, and it must be fair: one model's long prefill must not starve another
model's decode steps.

Rules:
1. Engines hold the gate while they build and dispatch a step and while
   they read the previous step back (`with gate:`); a step dispatched with
   `mx.async_eval` may still run on the device after the engine lets go.
2. Anyone else (encoders, one-off evaluations) uses `with gate.exclusive():`,
   which also waits for every stream's queued work (`mx.synchronize()`), so
   their arrays are never evaluated interleaved with an engine step.
3. The lock is re-entrant, so a helper called under the gate may take it.
4. Turns are handed out FIFO (a ticket lock): a thread that lets go and asks
   again queues behind everyone already waiting, so two engines alternate
   steps instead of one re-taking the lock it just released.
5. `contended(window_s)`: another thread held or asked for the gate within
   the window. An engine's scheduler then bounds its prefill chunk to
   `shared_prefill_tokens`, even in a step that decodes nothing of its own
   (scheduler rule 2), so a 2,000-token prompt on model B costs model A's
   streams one bounded chunk per step, not one long one.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

CONTENDED_WINDOW_S = 0.25


class DecodeGate:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._next_ticket = 0
        self._serving = 0
        self._seen: dict[int, float] = {}  # thread id -> last time it asked (rule 5)
        self.acquisitions = 0
        self.wait_s_total = 0.0

    def __enter__(self) -> "DecodeGate":
        me = threading.get_ident()
        start = time.perf_counter()
        with self._cond:
            self._seen[me] = time.monotonic()
            if self._owner == me:  # rule 3
                self._depth += 1
                return self
            ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
            while self._owner is not None or self._serving != ticket:  # rule 4
                self._cond.wait()
            self._owner, self._depth = me, 1
            self.acquisitions += 1
            self.wait_s_total += time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._owner = None
                self._serving += 1
                self._cond.notify_all()

    def contended(self, window_s: float = CONTENDED_WINDOW_S) -> bool:
        """Rule 5, asked by the thread about to plan a step."""
        me, now = threading.get_ident(), time.monotonic()
        with self._cond:
            others = self._next_ticket - self._serving - (1 if self._owner == me else 0)
            if others > 0:  # holding or queued right now
                return True
            stale = [t for t, at in self._seen.items() if now - at > 60.0]
            for t in stale:
                del self._seen[t]
            return any(t != me and now - at <= window_s for t, at in self._seen.items())

    @contextmanager
    def exclusive(self) -> Iterator["DecodeGate"]:
        """Rule 2: the gate plus a drained device queue."""
        with self:
            import mlx.core as mx

            mx.synchronize()
            yield self
