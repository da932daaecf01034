"""The chat prompt never loses a Ctrl-C (cli/chat/prompt.py).

The race it closes: a SIGINT that lands after readline drew the prompt but before it
waits in select(). It is reproduced deterministically by delivering SIGINT to another
thread of the process while the main thread waits at the prompt: the interpreter's flag is
set and nothing wakes the main thread's select(), which is exactly the state the race
leaves behind. Plain `input()` stays stuck there (the control case, run first); `read_line` turns it
into a KeyboardInterrupt.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from cli_support import Pty

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="a pseudo-terminal")

CHILD = """
import readline, signal, sys, threading, time
from frink_mlx.cli.chat.prompt import read_line
read = {reader}
def poke():
    time.sleep(0.5)   # the main thread waits at the prompt by now
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)   # this thread, not main
threading.Thread(target=poke, daemon=True).start()
try:
    read(">> ")
    print("a line")
except KeyboardInterrupt:
    print("interrupted")
"""


def _run(reader: str) -> tuple[Pty, bool]:
    """The child's terminal, and whether it ended (False: stuck at the prompt, killed)."""
    term = Pty([sys.executable, "-c", CHILD.format(reader=reader)])
    try:
        code = term.proc.wait(5)
    except subprocess.TimeoutExpired:
        term.proc.kill()
        term.proc.wait(5)
        return term, False
    term.expect("\n")
    assert code == 0, term.out
    return term, True


def test_a_ctrl_c_that_missed_the_select_still_interrupts_the_prompt() -> None:
    control, ended = _run("input")
    if ended:   # the reproduction needs an interpreter whose readline misses it
        pytest.skip(f"plain input() saw the pending Ctrl-C here: {control.out!r}")
    term, ended = _run("read_line")
    assert ended, f"the prompt did not see the pending Ctrl-C; got {term.out!r}"
    term.expect("interrupted")
