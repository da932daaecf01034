"""StepMachine: the feed / finish loop both tool-call stream parsers run.

Why: the markup parser (stream.py) and Harmony's (harmony.py) are each a state
machine over a text buffer, and only their modes and steps differ. The loop is
one piece here:

1. `feed(text)` appends to the buffer and runs the current mode's step (mode
   `m` is the subclass's method `_step_m`) until it returns False (it needs
   more text); a step may switch the mode and return True to go on in the new
   one. The step is looked up by name, not kept in a table of bound methods:
   such a table would tie every parser to itself in a reference cycle, one
   more object per request left for the cyclic collector.
2. `finish()` runs the same with `final` set: there is no more text, so each
   step flushes what it held back (their rules say as what) and returns False
   once the buffer is spent.
3. Which calls go out, and their indexes, is the call book's (calls.py rule 3);
   `saw_tool_call` is its answer.
"""

from __future__ import annotations

from ..events import Event
from ..request import GenRequest
from .calls import CallBook


class StepMachine:
    """Base of the two parsers: subclasses set `_mode` and define `_step_<mode>(out, final)`."""

    _mode: str

    def __init__(self, request: GenRequest, index: int) -> None:
        self.index = index
        self._book = CallBook(request, index)
        self._buf = ""

    @property
    def saw_tool_call(self) -> bool:
        return self._book.saw_tool_call   # rule 3

    def feed(self, text: str) -> list[Event]:
        self._buf += text
        return self._drain(final=False)   # rule 1

    def finish(self) -> list[Event]:
        return self._drain(final=True)    # rule 2

    def _drain(self, final: bool) -> list[Event]:
        out: list[Event] = []
        while getattr(self, "_step_" + self._mode)(out, final):   # rule 1
            pass
        return out
