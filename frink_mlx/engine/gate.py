"""The decode gate: one process-wide lock around every piece of MLX work.

Why: MLX (and Metal command buffers in particular) is not safe to drive from
several threads at once. Each engine owns one MLX thread, but encoders
(embeddings) and a second engine during a model swap run on other threads,
so every step takes this lock; with batching off it is also what serialises
requests.

Rules:
1. Engines hold the gate while they build and dispatch a step and while
   they read the previous step back (`with gate:`); a step dispatched with
   `mx.async_eval` may still run on the device after the engine lets go.
2. Anyone else (encoders, one-off evaluations) uses `with gate.exclusive():`,
   which also waits for every stream's queued work (`mx.synchronize()`), so
   their arrays are never evaluated interleaved with an engine step.
3. The lock is re-entrant, so a helper called under the gate may take it.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator


class DecodeGate:
    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.acquisitions = 0
        self.wait_s_total = 0.0

    def __enter__(self) -> "DecodeGate":
        start = time.perf_counter()
        self._lock.acquire()
        self.acquisitions += 1
        self.wait_s_total += time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    @contextmanager
    def exclusive(self) -> Iterator["DecodeGate"]:
        """Rule 2: the gate plus a drained device queue."""
        with self:
            import mlx.core as mx

            mx.synchronize()
            yield self
