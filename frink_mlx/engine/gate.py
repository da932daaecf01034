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
6. `yield_step(timeout_s)`: if another thread is queued, the holder lets go
   until another thread ends a step (`note_step`, rule 7) or the timeout
   passes, then queues and holds again at the same depth; if nobody is
   queued it keeps the gate. A sliced prefill step between layers
   (engine/turns.py) so gets one turn per step of the engines it shares
   with, even though each of their steps takes the gate twice (dispatch,
   read), and never waits for an engine that has nothing to do.
7. Step cost: the gate times each thread's holds; `note_step()`, called once
   per engine step, folds the time held since the last note into that
   thread's running mean, and `peer_step_s()` is the cheapest such step of
   the other threads still stepping (asked within `ACTIVE_STEPS` of their
   steps): what a sliced turn is sized against (engine/turns.py rule 2).
   Holds, not waits, so it does not grow with contention; an engine that
   went idle stops counting within a few of its steps, not the window.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

CONTENDED_WINDOW_S = 0.25
STEP_MEAN_WEIGHT = 0.2  # rule 7: the newest step's weight in a thread's running mean
ACTIVE_STEPS = 3.0      # rule 7: a thread that asked this many of its steps ago is stepping
ACTIVE_SLACK_S = 0.01   # ... plus this (host work between its steps)


class DecodeGate:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._owner: int | None = None
        self._depth = 0
        self._next_ticket = 0
        self._serving = 0
        self._seen: dict[int, float] = {}  # thread id -> last time it asked (rule 5)
        self._held_since = 0.0
        self._held: dict[int, float] = {}      # thread id -> seconds held since its last note
        self._step_s: dict[int, float] = {}    # thread id -> running mean step (rule 7)
        self._steps: dict[int, int] = {}       # thread id -> steps noted (rules 6 and 7)
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
            self._hold(me, 1)
            self.acquisitions += 1
            self.wait_s_total += time.perf_counter() - start
        return self

    def __exit__(self, *exc: object) -> None:
        with self._cond:
            self._depth -= 1
            if self._depth == 0:
                self._let_go()

    def _hold(self, me: int, depth: int) -> None:
        """Queue (rule 4: FIFO tickets), wait for this ticket's turn, hold at `depth`."""
        ticket, self._next_ticket = self._next_ticket, self._next_ticket + 1
        while self._owner is not None or self._serving != ticket:
            self._cond.wait()
        self._held_since = time.perf_counter()
        self._owner, self._depth = me, depth

    def _let_go(self) -> None:
        me = self._owner
        assert me is not None
        self._held[me] = self._held.get(me, 0.0) + time.perf_counter() - self._held_since
        self._owner = None
        self._serving += 1
        self._cond.notify_all()

    def yield_step(self, timeout_s: float) -> bool:
        """Rule 6, called by the holder: if anyone is queued, let go until another thread
        ends a step; whether it let go."""
        me = threading.get_ident()
        with self._cond:
            if self._owner != me:
                raise RuntimeError("yield_step() by a thread that does not hold the gate")
            if self._next_ticket - self._serving <= 1:
                return False
            depth, steps = self._depth, self._steps_of_others(me)
            self._let_go()
            deadline = time.monotonic() + timeout_s
            while self._steps_of_others(me) == steps:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            self._seen[me] = time.monotonic()
            self._hold(me, depth)
            return True

    def _steps_of_others(self, me: int) -> int:
        return sum(n for t, n in self._steps.items() if t != me)

    def note_step(self) -> None:
        """Rule 7: the calling thread ended a step; fold its held time into its mean."""
        me = threading.get_ident()
        with self._cond:
            held = self._held.pop(me, 0.0)
            self._steps[me] = self._steps.get(me, 0) + 1
            self._cond.notify_all()
            if held > 0.0:
                mean = self._step_s.get(me)
                self._step_s[me] = held if mean is None else (
                    mean + STEP_MEAN_WEIGHT * (held - mean))

    def peer_step_s(self) -> float | None:
        """Rule 7: the cheapest mean step of the other threads still stepping."""
        me, now = threading.get_ident(), time.monotonic()
        with self._cond:
            steps = [s for t, s in self._step_s.items() if t != me and now - self._seen.get(
                t, -1e9) <= ACTIVE_STEPS * s + ACTIVE_SLACK_S]
            return min(steps) if steps else None

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
                self._step_s.pop(t, None)
                self._steps.pop(t, None)
                self._held.pop(t, None)
            return any(t != me and now - at <= window_s for t, at in self._seen.items())

    @contextmanager
    def exclusive(self) -> Iterator["DecodeGate"]:
        """Rule 2: the gate plus a drained device queue."""
        with self:
            import mlx.core as mx

            mx.synchronize()
            yield self
