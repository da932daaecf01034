"""Test-only helpers for the CLI tests: the real CLI in a subprocess, behind a pseudo-terminal.

`Pty` makes the terminal the child's controlling terminal (a new session), so
writing Ctrl-C (0x03) to it raises SIGINT in the child the way a keypress does.
`make_long_talker` writes a tiny checkpoint whose greedy answers never end on
EOS (the special tokens' output rows are zero, so some ordinary token always
scores higher): an answer runs to max_tokens, long enough to interrupt or to
lose its daemon mid-way.
"""

from __future__ import annotations

import json
import logging
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "\n>> "   # the chat REPL's prompt at the start of a line


def cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "frink_mlx.cli", *args]


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "FRINK_MLX_LOG_LEVEL": "warning",
            "COLUMNS": "200", **extra}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def alnum(text: str) -> str:
    """Letters and digits only: a random model's bytes may render differently on a tty."""
    return "".join(ch for ch in text if ch.isascii() and ch.isalnum())


# Run in the child (a new session): take stdin, the pty, as the controlling terminal, put
# SIGINT and SIGQUIT back to their defaults, then exec the command. A wrapper instead of
# preexec_fn, which is unsafe beside threads. The defaults are what a shell gives the job in
# a user's terminal; a suite started in the background by a non-interactive shell (`make
# test &`) inherits both as ignored (POSIX, for asynchronous lists), exec keeps an ignored
# signal ignored, and every Ctrl-C these tests type would then do nothing.
_CTTY_EXEC = ("import fcntl, os, signal, sys, termios; fcntl.ioctl(0, termios.TIOCSCTTY, 0); "
              "signal.signal(signal.SIGINT, signal.SIG_DFL); "
              "signal.signal(signal.SIGQUIT, signal.SIG_DFL); "
              "os.execv(sys.argv[1], sys.argv[1:])")


class Pty:
    def __init__(self, argv: list[str], **extra_env: str) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen([sys.executable, "-c", _CTTY_EXEC, *argv], stdin=slave,
                                     stdout=slave, stderr=slave, env=env(**extra_env), cwd=ROOT,
                                     close_fds=True, start_new_session=True)
        os.close(slave)
        self.out = ""

    def _read(self, timeout_s: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout_s)
        if not ready:
            return True
        try:
            chunk = os.read(self.master, 4096)
        except OSError:
            return False
        self.out += chunk.decode(errors="replace")
        return bool(chunk)

    def expect(self, marker: str, timeout_s: float = 120.0) -> str:
        deadline = time.monotonic() + timeout_s
        while marker not in self.out:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {marker!r}; got {self.out!r}"
            if not self._read(left):
                break
        assert marker in self.out, f"the terminal closed before {marker!r}; got {self.out!r}"
        return self.out

    def expect_prompt_after(self, marker: str, timeout_s: float = 120.0) -> str:
        """Wait for `marker`, then for the REPL's prompt after it: the REPL reads again.

        Send the next line only then: a line typed while the REPL is busy is echoed by the
        terminal and again by readline, and an earlier prompt would end a wait too soon."""
        self.expect(marker, timeout_s)
        start = self.out.rindex(marker) + len(marker)
        deadline = time.monotonic() + timeout_s
        while PROMPT not in self.out[start:]:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for a prompt after {marker!r}; got {self.out!r}"
            if not self._read(left):
                break
        assert PROMPT in self.out[start:], f"the terminal closed; got {self.out!r}"
        return self.out

    def turn(self, line: str, timeout_s: float = 120.0) -> str:
        """At the prompt: send `line`, return what came back up to the next prompt."""
        self.out = ""
        self.send(line)
        return self.expect_prompt_after(line + "\r\n", timeout_s)

    def expect_chars(self, count: int, timeout_s: float = 120.0) -> str:
        """Wait until at least `count` characters arrived since the last reset of `out`."""
        deadline = time.monotonic() + timeout_s
        while len(self.out) < count:
            left = deadline - time.monotonic()
            assert left > 0, f"timed out waiting for {count} characters; got {self.out!r}"
            if not self._read(left):
                break
        return self.out

    def send(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def ctrl_c(self) -> None:
        os.write(self.master, b"\x03")

    def close(self, timeout_s: float = 60.0) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.send_signal(signal.SIGKILL)
            raise
        while self._read(0.1):
            if not select.select([self.master], [], [], 0)[0]:
                break
        os.close(self.master)
        return code


class AccessLines(logging.Handler):
    """The daemon's JSON access-log lines (http/access.py rule 4), as dicts."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[dict] = []
        self.saved_level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(json.loads(record.getMessage()))

    def attach(self) -> AccessLines:
        logger = logging.getLogger("frink_mlx.access")
        self.saved_level = logger.level
        logger.addHandler(self)
        logger.setLevel(logging.INFO)
        return self

    def detach(self) -> None:
        logger = logging.getLogger("frink_mlx.access")
        logger.removeHandler(self)
        logger.setLevel(self.saved_level)

    def posts(self, route: str, at_least: int = 0, timeout_s: float = 15.0) -> list[dict]:
        """The POSTs to `route` logged so far, waiting until there are `at_least` of them
        (a line is written when the response has ended, a moment after the client saw it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = [line for line in self.lines
                     if line["method"] == "POST" and line["route"] == route]
            if len(found) >= at_least or time.monotonic() > deadline:
                return found
            time.sleep(0.05)


def make_long_talker(path: Path, seed: int = 3) -> Path:
    """A tiny checkpoint that never emits a special token under greedy decoding."""
    import mlx.core as mx
    from conftest import make_tiny_llama

    path = make_tiny_llama(path, seed=seed, tie_word_embeddings=False,
                           max_position_embeddings=8192)
    weights = mx.load(str(path / "model.safetensors"))
    head = weights["lm_head.weight"]
    weights["lm_head.weight"] = mx.concatenate([mx.zeros((3, head.shape[1])), head[3:]])
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path
