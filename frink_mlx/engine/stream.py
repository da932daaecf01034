"""SeqStream: one request's StepOutputs, from the engine thread to a consumer.

Why a separate object per request: the engine thread must never block on a
slow client, so it only appends to the stream's queue (through
`loop.call_soon_threadsafe` when the consumer is an event loop); the
consumer pulls at its own pace. A batch of outputs per engine step is one
wake-up, not one per row.

Rules:
1. Admission is a signal of its own: the engine marks the stream admitted
   when the request's first prefill chunk is planned (it holds KV blocks and
   can no longer time out in the queue). `await admitted()` returns then (or
   at the first outputs), or raises the error that ended the request before
   it started (`Overloaded` after `queue_timeout_s`, a duplicate id), so the
   daemon can answer with that error's real status before sending a header.
2. `abort(index)` ends one row (a choice that matched a stop string); its
   blocks are freed within one step, the other rows go on. `abort()` ends all.
"""

from __future__ import annotations

import asyncio
import queue
from typing import Any, AsyncIterator, Callable, Iterator

from .types import StepOutput

_ADMITTED = object()  # rule 1: the request left the waiting queue


class SeqStream:
    """The StepOutputs of one request, consumed on the event loop (or a thread).

    Async iteration needs the stream to be created on a running event loop
    (the daemon's case); created elsewhere, it is a plain blocking iterator
    (tests, benchmarks). Iteration ends when every row has finished; it
    raises the error the engine pushed instead of outputs (e.g. `Overloaded`
    when the request timed out in the queue).
    """

    def __init__(self, request_id: str, num_rows: int,
                 on_abort: Callable[[str, int | None], None]) -> None:
        self._on_abort = on_abort
        self.request_id = request_id
        self._rows_open = num_rows
        try:
            self._loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._aqueue: asyncio.Queue[Any] | None = asyncio.Queue() if self._loop else None
        self._squeue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.closed = False
        self.admission_sent = False   # engine side: the _ADMITTED marker was pushed
        self._admitted = False        # consumer side: admission was observed
        self._early: list[Any] = []   # outputs that arrived while awaiting admission

    # -- engine side ---------------------------------------------------------
    def _push(self, item: list[StepOutput] | BaseException) -> None:
        if self._loop is None:
            self._squeue.put(item)
            return
        try:
            self._loop.call_soon_threadsafe(self._aqueue.put_nowait, item)  # type: ignore[union-attr]
        except RuntimeError:  # the loop is gone: nobody is listening any more
            self._on_abort(self.request_id, None)

    def _mark_admitted(self) -> None:
        """Rule 1 (engine thread): once per stream."""
        if not self.admission_sent:
            self.admission_sent = True
            self._push(_ADMITTED)  # type: ignore[arg-type]

    # -- consumer side ---------------------------------------------------------
    def abort(self, index: int | None = None) -> None:
        """Thread-safe; the engine frees the blocks of row `index` (None: every row)
        within one step."""
        if not self.closed:
            self._on_abort(self.request_id, index)

    async def admitted(self) -> None:
        """Rule 1: wait until the request runs; raise the error that ended it before."""
        if self._aqueue is None:
            raise RuntimeError("this SeqStream was created outside an event loop")
        while not self._admitted and not self.closed:
            item = await self._aqueue.get()
            if item is _ADMITTED:
                self._admitted = True
            elif isinstance(item, BaseException):
                self._take(item)  # raises
            else:
                self._early.append(item)
                self._admitted = True

    def _take(self, item: Any) -> list[StepOutput]:
        if item is _ADMITTED:
            return []
        if isinstance(item, BaseException):
            self.closed = True
            raise item
        for out in item:
            if out.finish is not None:
                self._rows_open -= 1
        if self._rows_open <= 0:
            self.closed = True
        return item

    async def __aiter__(self) -> AsyncIterator[StepOutput]:
        if self._aqueue is None:
            raise RuntimeError("this SeqStream was created outside an event loop; iterate it with `for`")
        while self._early:
            for out in self._take(self._early.pop(0)):
                yield out
        while not self.closed:
            for out in self._take(await self._aqueue.get()):
                yield out

    def __iter__(self) -> Iterator[StepOutput]:
        while not self.closed:
            for out in self._take(self._squeue.get()):
                yield out
