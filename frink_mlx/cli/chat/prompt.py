"""Reading a line at the chat prompt without losing a Ctrl-C.

Why: CPython's readline draws the prompt, then waits in select() on the
terminal. A SIGINT that lands between the two only sets the interpreter's
flag; nothing wakes the select(), so the prompt sits there until a key is
pressed and a second Ctrl-C "to quit" does nothing. A real user rarely hits
that window; a loaded machine (or a script driving the terminal) does.

Rule: while the main thread waits at the prompt, a helper thread sends it a
no-op SIGALRM every `TICK_S`. select() is never restarted after a signal, so
it returns EINTR, readline lets the interpreter run its pending handlers, and
a Ctrl-C that arrived early becomes the KeyboardInterrupt it should be.
SIGALRM is set to restart other system calls (siginterrupt False), so the
terminal writes the prompt makes are not cut short.
"""

from __future__ import annotations

import signal
import threading

TICK_S = 0.1


def read_line(prompt: str) -> str:
    """`input(prompt)` that always sees a Ctrl-C (the rule above)."""
    if threading.current_thread() is not threading.main_thread():
        return input(prompt)
    previous = signal.signal(signal.SIGALRM, _ignore)
    signal.siginterrupt(signal.SIGALRM, False)
    done = threading.Event()
    main = threading.get_ident()

    def tick() -> None:
        while not done.wait(TICK_S):
            signal.pthread_kill(main, signal.SIGALRM)

    ticker = threading.Thread(target=tick, name="prompt-ticker", daemon=True)
    ticker.start()
    try:
        return input(prompt)
    finally:
        done.set()
        ticker.join()
        signal.signal(signal.SIGALRM, previous)


def _ignore(signum: int, frame: object) -> None:
    """A handler, not SIG_IGN: an ignored signal would not interrupt select()."""
