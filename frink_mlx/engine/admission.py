"""When an idle engine should hold its first prefill step for more arrivals.

Why: every step streams all the weights once, so a burst of requests that
the HTTP side parses, renders and tokenizes one after another (a few ms
apart) is cheaper as one prefill step than as a small step followed by a
large one. The engine therefore holds an *admission window* when it was
idle (loop.py `_drain_inbox`). But a window is pure latency for a request
that nobody follows, such as the next turn of a lone chat, whose short
turn-2 prefill makes a 25 ms wait a noticeable share of its TTFT.

Most bursts are closed loops: N clients that each send their next request
as soon as their previous one finished. So the clients that finished
recently predict the arrivals still to come:

    finished = requests that ended within the last `horizon_s`
    arrived  = requests that arrived since the oldest of those ended
    wait for more   iff   finished == 0       (no history: a cold burst may be
                                               starting, keep the window)
                     or   arrived < finished  (some of them have not come back yet)

A lone conversation (1 ended, its next turn is the 1 arrival) starts at
once; 8 clients that ended together hold the window until all 8 are in and
not a window longer. Plain Python, no mlx (engine accounting code).
"""

from __future__ import annotations

import threading
from collections import deque


class ArrivalForecast:
    """Counts recent finishes and arrivals; see the module docstring."""

    def __init__(self, horizon_s: float = 1.0) -> None:
        self.horizon_s = horizon_s
        self._finished: deque[float] = deque()
        self._arrived: deque[float] = deque()

    def finished(self, now: float) -> None:
        """A request ended (any reason) at monotonic time `now`."""
        self._finished.append(now)

    def arrived(self, now: float) -> None:
        """A request reached the engine at monotonic time `now`."""
        self._arrived.append(now)

    def expecting_more(self, now: float) -> bool:
        """Should an idle engine keep its admission window open?"""
        while self._finished and self._finished[0] < now - self.horizon_s:
            self._finished.popleft()
        since = self._finished[0] if self._finished else now - self.horizon_s
        while self._arrived and self._arrived[0] < since:
            self._arrived.popleft()
        return not self._finished or len(self._arrived) < len(self._finished)


class QueueDepth:
    """Requests not yet running: submitted but not yet seen by the MLX thread
    (the inbox) plus never-started ones in the scheduler's waiting queue.

    `try_enter` runs on any thread (Engine.submit); the MLX thread calls
    `taken` as it admits a submission and `set_waiting` after each change to
    the scheduler's queue. One lock keeps the check-and-count atomic.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._num_inbox = 0
        self._num_waiting = 0

    @property
    def total(self) -> int:
        return self._num_inbox + self._num_waiting

    def try_enter(self, limit: int) -> int | None:
        """Count one more submission unless `limit` are already waiting:
        None when counted, else the depth that refused it."""
        with self._lock:
            depth = self._num_inbox + self._num_waiting
            if depth >= limit:
                return depth
            self._num_inbox += 1
            return None

    def taken(self) -> None:
        """The MLX thread took one submission out of the inbox."""
        with self._lock:
            self._num_inbox -= 1

    def set_waiting(self, num_waiting: int) -> None:
        self._num_waiting = num_waiting
