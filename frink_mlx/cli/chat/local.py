"""A model loaded in this process, for `chat --local`, `generate --local` and no daemon.

It goes through the same decode handles, engine and output pipeline as the
daemon, so what you see here is what the server sends. Rules:
1. Each answer runs on a private event loop as one task; text is emitted as
   the events arrive (streamed, not collected).
2. Ctrl-C during an answer cancels that task (a SIGINT handler on the loop,
   not a KeyboardInterrupt thrown into whatever frame is running), so the
   Run's `finally` aborts the engine rows and frees their blocks; then
   KeyboardInterrupt is raised to the caller (common.py rule 1).
3. `switch_model` loads the other entry first and only then shuts the old
   engine down, so a name that fails to load leaves the session as it was.
4. Ctrl-C must reach the main thread. A process-wide SIGINT may be taken by
   any thread that does not block it; taken by the engine thread or an MLX
   worker, it trips Python's flag but leaves the main thread blocked in
   `input()` (readline's select is not interrupted), so a Ctrl-C at the
   prompt was lost now and then. Threads started while a model loads (the
   engine's, MLX's stream workers, which the engine's own threads beget)
   inherit a mask that blocks SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ...backend import Backend
from ...core.request import GenRequest
from ...settings import Settings
from .common import ChatParams, Emit, Messages, Note, Stats

if TYPE_CHECKING:  # loaded only when a model is: it imports MLX
    from ...serving.generation import Generation


def _build(settings: Settings, device: Backend, name: str | None) -> Generation:
    from ...engine.gate import DecodeGate
    from ...registry import load_registry
    from ...serving.generation import build_generation

    spec = load_registry(settings).resolve(name)
    with _sigint_for_the_main_thread():
        return build_generation(spec, settings.hub_config(), 1, DecodeGate(), device)


@contextlib.contextmanager
def _sigint_for_the_main_thread() -> Iterator[None]:
    """Rule 4: threads started inside inherit SIGINT blocked; the main thread gets it back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def _shutdown(generation: Generation | None) -> None:
    if generation is not None and generation.engine is not None:
        generation.engine.shutdown(1.0)


@dataclass
class LocalModel:
    """common.ChatModel in process."""

    settings: Settings
    device: Backend                # the device backend (backend/), chosen once by command.py
    note: Note
    generation: Generation | None = None
    loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    label: str = "in process"

    @property
    def model(self) -> str:
        return str(self.generation.spec.name) if self.generation is not None else "?"

    def load(self, name: str | None) -> LocalModel:
        started = time.perf_counter()
        self.note(f"[loading {name or 'the default model'} in process]")
        self.generation = _build(self.settings, self.device, name)
        self.note(f"[loaded {self.model} in {time.perf_counter() - started:.1f} s]")
        return self

    def switch_model(self, name: str) -> str:
        """Rule 3: load the other entry first, then shut the old engine down."""
        started = time.perf_counter()
        self.note(f"[loading {name} in process]")
        new = _build(self.settings, self.device, name)
        old, self.generation = self.generation, new
        _shutdown(old)
        self.note(f"[loaded {self.model} in {time.perf_counter() - started:.1f} s]")
        return self.model

    def answer(self, messages: Messages, params: ChatParams, emit: Emit) -> Stats:
        from ...core.request import Message

        req = self._request(params)
        req.messages = [Message(m["role"], m["content"]) for m in messages]  # type: ignore[arg-type]
        return self._run(req, emit)

    def complete(self, prompt: str, params: ChatParams, emit: Emit) -> Stats:
        req = self._request(params)
        req.prompt = prompt
        return self._run(req, emit)

    def close(self) -> None:
        _shutdown(self.generation)
        self.generation = None
        self.loop.close()

    def _request(self, params: ChatParams) -> GenRequest:
        from ...core.request import SamplingParams

        sampling, sent = SamplingParams(seed=params.seed), set()
        if params.temperature is not None:
            sampling.temperature = params.temperature
            sent.add("temperature")
        if params.top_p is not None:
            sampling.top_p = params.top_p
            sent.add("top_p")
        if params.seed is not None:
            sent.add("seed")
        return GenRequest(model=self.model, max_tokens=params.max_tokens, sampling=sampling,
                          sampling_sent=frozenset(sent))  # the rest: the model's defaults

    def _run(self, req: GenRequest, emit: Emit) -> Stats:
        """Rules 1 and 2: one answer as a task on a private loop, streamed; Ctrl-C cancels it."""
        task = self.loop.create_task(self._generate(req, emit))
        handled = threading.current_thread() is threading.main_thread()
        if handled:
            self.loop.add_signal_handler(signal.SIGINT, task.cancel)
        try:
            return self.loop.run_until_complete(task)
        except asyncio.CancelledError:
            raise KeyboardInterrupt from None
        finally:
            if handled:
                self.loop.remove_signal_handler(signal.SIGINT)

    async def _generate(self, req: GenRequest, emit: Emit) -> Stats:
        from ...core.events import Done, ErrorEvent, TextDelta
        from ...errors import EngineFailure
        from ...serving.handles import DecodeHandles

        if self.generation is None:  # closed: the REPL loads before the first answer
            raise EngineFailure("no model is loaded in this process")
        started = time.perf_counter()
        run = DecodeHandles.take(self.generation).start(req)
        stats, first = Stats(prompt_tokens=run.prompt_tokens), None
        async for event in run.events():
            if first is None and isinstance(event, (TextDelta, Done)):
                first = time.perf_counter()
            if isinstance(event, TextDelta):
                emit(event.text)
            elif isinstance(event, ErrorEvent):
                raise EngineFailure(event.message)
            elif isinstance(event, Done):
                stats.completion_tokens = event.usage.completion_tokens
                stats.cached_tokens = event.usage.cached_tokens
        end = time.perf_counter()
        stats.prompt_s, stats.decode_s = (first or end) - started, end - (first or end)
        stats.peak_memory_gb = _peak_memory_gb()
        return stats


def _peak_memory_gb() -> float | None:
    try:
        import mlx.core as mx

        return float(mx.get_peak_memory()) / 1e9
    except (ImportError, AttributeError):
        return None
