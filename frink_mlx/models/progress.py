"""Progress of long model work (download, convert, dequantize, load, warm-up).

Why: a first load of a Hub model can download gigabytes and a GGUF import can
take minutes; a user must see that something moves. The same numbers reach
three readers: a terminal (the CLI's bars and lines), the log (the daemon),
and `/health` / `/admin/models` while the hub loads a model.

Rules:
1. The worker reports into the `Progress` current in its context:
   `reporting(progress)` sets it, `current()` reads it (a fresh log-only one
   when none is set). A context variable rather than a parameter because the
   work runs several calls below the hub's generation factory, whose
   signature test factories implement too; the hub sets it in the worker
   thread that runs the factory.
2. One phase at a time: `phase(name, detail)` starts it (logged), `advance`
   / `set_total` move a byte count (downloads), and the phase's end is
   logged with its time. Byte phases log at most every `LOG_INTERVAL_S`.
3. `snapshot()` is what the HTTP side reports: model, phase, detail,
   done/total bytes (honest nulls: None = not measured), fraction, seconds
   since the load began and since the phase began.
4. Bars: downloads go through huggingface_hub's own tqdm (`hf_tqdm_class`),
   which draws on a terminal and stays quiet elsewhere; the other phases are
   one line each on `echo` (the CLI passes stderr) as well as in the log.
5. Updates come from several download threads at once: one lock guards
   the counters.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("frink_mlx.models")

LOG_INTERVAL_S = 5.0
_current: contextvars.ContextVar[Progress | None] = contextvars.ContextVar(
    "frink_mlx_progress", default=None)


class Progress:
    """Rule 2's phases and byte counts for one model's load (thread-safe)."""

    def __init__(self, model: str, echo: Callable[[str], None] | None = None,
                 initial_phase: str | None = None) -> None:
        """`initial_phase`: a phase in force from the start, unlogged (the hub's "loading",
        so /health has a snapshot before the worker names its first phase)."""
        self.model = model
        self.echo = echo
        self._lock = threading.Lock()
        self._phase: str | None = initial_phase
        self._detail = ""
        self._done = 0
        self._total: int | None = None
        self.started = self._phase_started = self._last_log = time.monotonic()

    @property
    def phase_name(self) -> str | None:
        return self._phase

    @property
    def elapsed_s(self) -> float:
        """Seconds since this progress (the whole load) began."""
        return time.monotonic() - self.started

    def phase(self, name: str, detail: str = "") -> None:
        """End the running phase (logged with its time) and start `name`."""
        with self._lock:
            self._end_locked()
            self._phase, self._detail = name, detail
            self._done, self._total = 0, None
            self._phase_started = self._last_log = time.monotonic()
        self._say(f"{self.model}: {name} {detail}".rstrip())

    def done(self) -> None:
        with self._lock:
            self._end_locked()
            self._phase = None

    def set_total(self, total_bytes: int | None) -> None:
        with self._lock:
            self._total = total_bytes

    def advance(self, num_bytes: int) -> None:
        with self._lock:
            self._done += num_bytes
            now = time.monotonic()
            due = now - self._last_log >= LOG_INTERVAL_S
            if due:
                self._last_log = now
            line = self._bytes_line() if due else None
        if line:
            log.info("%s", line)

    def track(self, phase: str, done_bytes: int, total_bytes: int | None) -> None:
        """Absolute counts from a worker that reports its own (a GGUF import's callback):
        a new phase name starts that phase (rule 2), then the counts are set."""
        if phase != self._phase:
            self.phase(phase, self._detail)
        with self._lock:
            self._total = total_bytes
            delta = done_bytes - self._done
        if delta:
            self.advance(delta)

    def snapshot(self) -> dict[str, Any] | None:
        """Rule 3; None when no phase runs."""
        with self._lock:
            if self._phase is None:
                return None
            total = self._total
            now = time.monotonic()
            return {"model": self.model, "phase": self._phase, "detail": self._detail,
                    "done_bytes": self._done if total is not None or self._done else None,
                    "total_bytes": total,
                    "fraction": round(min(1.0, self._done / total), 4) if total else None,
                    "elapsed_s": round(now - self.started, 3),
                    "phase_elapsed_s": round(now - self._phase_started, 3)}

    def _end_locked(self) -> None:
        if self._phase is None:
            return
        took = time.monotonic() - self._phase_started
        size = f", {self._done / 1e6:.1f} MB" if self._done else ""
        line = f"{self.model}: {self._phase} done in {took:.2f}s{size}"
        log.info("%s", line)
        if self.echo is not None:
            self.echo(line)

    def _bytes_line(self) -> str:
        total = f"/{self._total / 1e6:.1f}" if self._total else ""
        pct = f" ({100 * self._done / self._total:.0f}%)" if self._total else ""
        return f"{self.model}: {self._phase} {self._detail}: {self._done / 1e6:.1f}{total} MB{pct}"

    def _say(self, line: str) -> None:
        log.info("%s", line)
        if self.echo is not None:
            self.echo(line)


@contextlib.contextmanager
def reporting(progress: Progress) -> Iterator[Progress]:
    """Make `progress` current for the work in this block (rule 1)."""
    token = _current.set(progress)
    try:
        yield progress
    finally:
        progress.done()
        _current.reset(token)


@contextlib.contextmanager
def ensure(model: str) -> Iterator[Progress]:
    """The progress in force, or a log-only one for `model` made current for this block."""
    existing = _current.get()
    if existing is not None:
        yield existing
        return
    with reporting(Progress(model)) as progress:
        yield progress


def current(model: str = "") -> Progress:
    """The progress in force (rule 1), or a log-only one for `model`."""
    return _current.get() or Progress(model)


def hf_tqdm_class(progress: Progress) -> type:
    """A huggingface_hub tqdm class that also feeds `progress` (rule 4).

    snapshot_download aggregates every file's bytes into one bar named
    `huggingface_hub.snapshot_download` (its total grows as files start);
    only that bar is counted, so bytes are not counted twice by the transfer
    bar or the per-file bars.
    """
    from huggingface_hub.utils import tqdm as hf_tqdm

    class ProgressTqdm(hf_tqdm):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            self._frink_counts = kwargs.get("name") == "huggingface_hub.snapshot_download"
            if not kwargs.get("disable") and not sys.stderr.isatty():
                kwargs["disable"] = True  # bars on a terminal only; the log gets lines
            super().__init__(*args, **kwargs)

        def __setattr__(self, key: str, value: Any) -> None:
            super().__setattr__(key, value)
            if key == "total" and getattr(self, "_frink_counts", False):
                progress.set_total(int(value) if value else None)

        def update(self, n: float | None = 1) -> bool | None:
            if self._frink_counts and n:
                progress.advance(int(n))
            return super().update(n)

    return ProgressTqdm
