"""engine/gate.py: re-entrant, FIFO turns between threads, `contended` (rules 3-5)."""

from __future__ import annotations

import threading
import time

from frink_mlx.engine.gate import DecodeGate


def test_reentrant_and_not_contended_alone() -> None:
    gate = DecodeGate()
    with gate:
        with gate:
            assert not gate.contended()
    assert not gate.contended()


def test_turns_alternate_fifo_between_two_threads() -> None:
    """Two threads that release and re-take the gate in a loop alternate (rule 4): a
    plain lock lets the releasing thread take it again before the waiter wakes."""
    gate, order = DecodeGate(), []
    start = threading.Barrier(2)

    def work(name: str) -> None:
        start.wait()
        for _ in range(50):
            with gate:
                order.append(name)
                time.sleep(0.0005)

    threads = [threading.Thread(target=work, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert len(order) == 100
    middle = order[10:90]  # both threads are running by now
    runs = sum(1 for x, y in zip(middle, middle[1:]) if x == y)
    assert runs <= 4, "".join(order)


def test_contended_sees_another_thread_holding_or_recently_asking() -> None:
    gate = DecodeGate()
    held, release = threading.Event(), threading.Event()

    def other() -> None:
        with gate:
            held.set()
            release.wait(10)

    thread = threading.Thread(target=other)
    thread.start()
    held.wait(10)
    assert gate.contended()                  # held by another thread right now
    release.set()
    thread.join(10)
    assert gate.contended(window_s=5.0)      # asked within the window
    assert not gate.contended(window_s=0.0)
