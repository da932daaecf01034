"""A budget of log lines for what strangers can make the daemon log.

Why: a refusal before authentication (a wrong Host, a wrong key, a connection
past the cap) costs a stranger one request and the daemon one log line; a
flood of them would fill the disk of a laptop that keeps its logs for months.

Rules:
1. At most `burst` lines per window of `window_s`; the rest of that window
   are counted, not logged.
2. The first line allowed after a window that dropped some says how many
   (`suppressed`), so the log still tells that a flood happened and how big.
3. One budget per kind of line, held by whoever logs it (built by the
   composition root): no module-level state.
"""

from __future__ import annotations

import threading
import time
from typing import Callable


class LogBudget:
    """Rules 1-2. `take()` -> (log this line?, lines suppressed since the last one logged)."""

    def __init__(self, burst: int = 20, window_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.burst, self.window_s, self._clock = burst, window_s, clock
        self._window_start = -window_s
        self._used = 0
        self._suppressed = 0
        self._lock = threading.Lock()

    def take(self) -> tuple[bool, int]:
        with self._lock:
            now = self._clock()
            if now - self._window_start >= self.window_s:
                self._window_start, self._used = now, 0
            if self._used >= self.burst:
                self._suppressed += 1
                return False, 0
            self._used += 1
            suppressed, self._suppressed = self._suppressed, 0
            return True, suppressed
