"""Long-lived MLX threads that engines borrow, so loading models does not pile up threads.

Why: every MLX stream owns a worker thread in MLX's scheduler, and MLX (0.32) ends
none while the process runs: `mx.clear_streams` forgets the calling thread's streams,
their workers stay. A thread-local stream (`mx.new_thread_local_stream`, mlx-lm's
`generation_stream` kind) makes one underlying stream in each thread that uses it. An
engine thread of its own per generation therefore left two or three OS threads behind
per model load; an always-on daemon that loads and evicts models for weeks would keep
them all. Engines run on threads of this pool instead, each using its device's one
thread-local `stream_for(device)`: the process holds as many MLX streams as engines
ever ran at once, however many generations came and went.

Rules:
1. `start(fn, name)` runs `fn` on an idle pool thread (a new one when none is idle) and
   returns a `Job` to join with a timeout, as one would a `threading.Thread`.
2. A pool thread parks once `fn` returns or raises (logged); it takes the next job. It is
   a daemon thread: a job that never returns (a collective parked for good, channel.py
   rule 2) keeps its thread, as an own thread would have been kept.
3. At interpreter exit, parked threads clear their streams and end before MLX's own
   globals are torn down (an engine thread used to do so as it ended; tearing a thread's
   streams down after MLX's globals can abort the process).
"""

from __future__ import annotations

import atexit
import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import mlx.core as mx

log = logging.getLogger("frink_mlx.engine")

_idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
_all: list[_Worker] = []
_lock = threading.Lock()
_streams: dict[str, Any] = {}


def stream_for(device: Any) -> Any:
    """The thread-local stream engines use on `device` (one per pool thread that uses it)."""
    with _lock:
        key = str(device)
        if key not in _streams:
            _streams[key] = mx.new_thread_local_stream(device)
        return _streams[key]


class Job:
    """One `fn` run on a pool thread (rule 1)."""

    def __init__(self, fn: Callable[[], None], name: str) -> None:
        self.fn, self.name = fn, name
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


class _Worker:
    def __init__(self) -> None:
        self.jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._main, name="frink-engine", daemon=True)
        self.thread.start()

    def _main(self) -> None:
        try:
            while (job := self.jobs.get()) is not None:
                self.thread.name = job.name
                try:
                    job.fn()
                except BaseException:  # rule 2: logged, the thread goes on serving
                    log.exception("%s: the engine thread's run raised", job.name)
                finally:
                    job.fn = _nothing  # the finished run keeps nothing alive (its engine)
                    job._done.set()
                    self.thread.name = "frink-engine (idle)"
                    _idle.put(self)
        finally:
            mx.clear_streams()  # rule 3


def start(fn: Callable[[], None], name: str = "frink-engine") -> Job:
    """Run `fn` on a pool thread (rule 1)."""
    try:
        worker = _idle.get_nowait()
    except queue.Empty:
        worker = _Worker()
        with _lock:
            _all.append(worker)
    job = Job(fn, name)
    worker.jobs.put(job)
    return job


def num_threads() -> int:
    """Pool threads started so far (parked or running)."""
    with _lock:
        return len(_all)


def _nothing() -> None:
    return None


@atexit.register
def _end_parked() -> None:
    """Rule 3: parked threads end; a thread still running a job is left as it is."""
    parked: list[_Worker] = []
    while True:
        try:
            parked.append(_idle.get_nowait())
        except queue.Empty:
            break
    for worker in parked:
        worker.jobs.put(None)
    for worker in parked:
        worker.thread.join(timeout=5.0)
