"""Freeing a retired generation: its engine stops, then its memory goes back once it is gone.

Why: handing memory back (Backend.release_freed_memory: gc, MLX's buffer
cache, glibc's free heap) only helps after the generation's last reference
is dropped, and "the hub let go" is not "nothing holds it". An engine holds
reference cycles (so only a garbage collection frees it), and a reference
can outlive the hub's by a moment: the executor thread that ran the free
still holds its arguments after it reports done, and a copy of a request's
context (a timer that request scheduled) can hold the request's runs. A
collection that ran a moment too early left the weights resident until the
next swap's -- RSS one model higher in some samples, not others. So the
model is traced by a weak reference, and the memory is handed back once the
trace says it is gone.

Rules:
1. `schedule(gen)`: the engine shuts down in a worker thread (its rows may
   finish for drain_timeout_s); the generation travels there in a list the
   worker empties, so no argument tuple keeps it past the call. Then the
   hub drops its own reference (`on_stopped`) and `releasing` counts the
   generation until its memory is back.
2. `hand_back`: collect garbage until the traced model is gone, backing off
   from RELEASE_POLL_S, for at most GONE_WAIT_S; then release the memory.
   A frozen heap (cli/serve.py rule 12 freezes the start-up heap, the default
   model's generation in it) is unfrozen before each of these collections and
   frozen again after: the collector never walks frozen objects, so a
   generation frozen with the start-up heap would otherwise be held for good
   once retired, its weights with it.
3. A model still referenced after that is `lingering` (/admin/models lists
   its generation number) and logged once with the kinds of its referrers;
   when its last reference goes, the weak reference's callback hands the
   memory back then.
4. A stand-in model that takes no weak reference (test factories) reads as
   gone at once.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import weakref
from typing import Any, Callable

from ..backend import Backend
from .generation import Generation, free_generation

log = logging.getLogger("frink_mlx.hub")

GONE_WAIT_S = 5.0
RELEASE_POLL_S = 0.01
Tracer = Callable[[], object]


def trace(gen: Generation, on_gone: Callable[[], None]) -> Tracer:
    """Rule 4: a weak reference to the model holding the weights; None once it is gone."""
    model = getattr(gen.loaded, "model", None)
    try:
        return weakref.ref(model, lambda _ref: on_gone())
    except TypeError:
        return lambda: None


def free_held(held: list[Generation], timeout_s: float) -> None:
    """Rule 1: stop the engine of the one generation in `held`, leaving nothing behind."""
    free_generation(held.pop(), timeout_s)


def wait_gone(tracer: Tracer, wait_s: float) -> bool:
    """Rule 2: collect until `tracer` reads None; False if it still does not after wait_s."""
    deadline, pause = time.monotonic() + wait_s, RELEASE_POLL_S
    frozen = gc.get_freeze_count() > 0
    try:
        while True:
            gc.unfreeze()  # rule 2: the retired generation may be in the frozen heap
            gc.collect()
            if tracer() is None:
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
    finally:
        if frozen:
            gc.freeze()


def holders(tracer: Tracer) -> str:
    """Rule 3: the kinds of whatever still references the model, for the log."""
    model = tracer()
    kinds = sorted({type(r).__name__ for r in gc.get_referrers(model)} if model is not None else ())
    return ", ".join(kinds) or "nothing"


class Releases:
    """The hub's frees in flight (rules 1-3)."""

    def __init__(self, backend: Backend, drain_timeout_s: float) -> None:
        self.backend, self.drain_timeout_s = backend, drain_timeout_s
        self.releasing = 0                       # generations whose memory is not back yet
        self.lingering: dict[int, Tracer] = {}   # rule 3
        self._frees: list[asyncio.Future[Any]] = []

    def schedule(self, gen: Generation, on_stopped: Callable[[int], object]) -> None:
        """Rule 1; `on_stopped(number)` drops the caller's reference once the engine stopped."""
        loop = asyncio.get_running_loop()
        number = gen.number
        tracer = trace(gen, lambda: _call_soon(loop, self._gone, number))
        stopped = loop.run_in_executor(None, free_held, [gen], self.drain_timeout_s)
        del gen  # neither callback below may keep it alive

        def release(_f: object) -> None:
            on_stopped(number)
            self.releasing += 1
            handed = loop.run_in_executor(None, self._hand_back, tracer)
            handed.add_done_callback(lambda f: self._handed_back(number, tracer, f))
            self._frees.append(handed)

        stopped.add_done_callback(release)
        self._frees.append(stopped)

    def _hand_back(self, tracer: Tracer) -> str | None:
        """Rule 2 (a worker thread): None once gone, else what still holds the model."""
        held_by = None if wait_gone(tracer, GONE_WAIT_S) else holders(tracer)
        self.backend.release_freed_memory()  # collects first: what it freed is handed back
        return held_by if tracer() is not None else None

    def _handed_back(self, number: int, tracer: Tracer, handed: asyncio.Future[str | None]) -> None:
        self.releasing -= 1
        if handed.cancelled() or handed.exception() is not None or handed.result() is None:
            return
        if tracer() is None:  # went between the last collection and now
            self._gone(number, force=True)
            return
        self.lingering[number] = tracer
        log.warning("generation %d is still referenced %g s after it was freed (by %s); its "
                    "memory goes back when that reference does", number, GONE_WAIT_S,
                    handed.result())

    def _gone(self, number: int, force: bool = False) -> None:
        """Rule 3: a lingering model went; hand its memory back now."""
        if self.lingering.pop(number, None) is None and not force:
            return
        self.releasing += 1
        handed = asyncio.get_running_loop().run_in_executor(None, self.backend.release_freed_memory)
        handed.add_done_callback(lambda _f: setattr(self, "releasing", self.releasing - 1))
        self._frees.append(handed)

    async def wait(self) -> None:
        """Every scheduled free and hand-back (tests, making room, shutdown)."""
        while self._frees:
            pending, self._frees = self._frees, []
            await asyncio.gather(*pending, return_exceptions=True)


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[int], None], number: int) -> None:
    """From whichever thread dropped the model's last reference (rule 3)."""
    try:
        loop.call_soon_threadsafe(callback, number)
    except RuntimeError:  # the loop has closed: the process is ending
        pass
