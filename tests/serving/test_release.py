"""serving/release.py: a retired generation's memory goes back once it is really gone.

A fake generation whose model is a weakly referenceable object in a reference
cycle (as an engine's is: only a garbage collection frees it) stands in for a
loaded model; a recording backend says when memory was handed back and
whether the model was gone by then.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import logging
import threading
import time
import weakref
from types import SimpleNamespace
from typing import Any

import pytest

from frink_mlx.backend import select_backend
from frink_mlx.http.access import AccessLogMiddleware, _request_runs, track_run
from frink_mlx.registry import ModelSpec, Registry
from frink_mlx.serving import release
from frink_mlx.serving.hub import Generation, Hub
from frink_mlx.settings import Settings


class CyclicModel:
    """Holds itself: freed by a collection only, never by reference counting alone."""

    def __init__(self) -> None:
        self.me = self


class LateEngine:
    """Its shutdown leaves the model referenced for `hold_s` more from another thread,
    the way an executor's finished work item does (release.py's Why)."""

    def __init__(self, model: CyclicModel, hold_s: float) -> None:
        self.model: CyclicModel | None = model
        self.hold_s = hold_s

    def shutdown(self, timeout_s: float) -> None:
        held, self.model = [self.model], None
        threading.Thread(target=_hold, args=(held, self.hold_s), daemon=True).start()
        del held


def _hold(held: list[Any], hold_s: float) -> None:
    time.sleep(hold_s)
    held.clear()


class RecordingBackend:
    def __init__(self, tracers: dict[int, Any]) -> None:
        self.tracers = tracers
        self.released: list[list[int]] = []  # per call: numbers of the models still alive

    def release_freed_memory(self) -> None:
        gc.collect()
        self.released.append(sorted(n for n, t in self.tracers.items() if t() is not None))


def make_hub(hold_s: float, **settings: Any) -> tuple[Hub, dict[int, Any], RecordingBackend]:
    tracers: dict[int, Any] = {}
    entries = {name: ModelSpec(name=name, source=f"/{name}") for name in ("a", "b")}

    def factory(spec, config, number, gate, backend):
        model = CyclicModel()
        tracers[number] = weakref.ref(model)
        return Generation(number, spec, SimpleNamespace(model=model),
                          LateEngine(model, hold_s), None, time.monotonic(), nbytes=1000)

    s = Settings.load(**{"min_generation_s": 0.0, "max_resident_models": 1, **settings})
    hub = Hub(s.hub_config(), Registry(entries=entries, default="a", path="<test>"),
              backend=select_backend(s.backend_config()), factory=factory,
              gate=threading.Lock())
    recorder = RecordingBackend(tracers)
    hub.releases.backend = recorder  # type: ignore[assignment]
    return hub, tracers, recorder


def test_memory_goes_back_only_after_a_late_reference_drops() -> None:
    async def main() -> None:
        hub, tracers, recorder = make_hub(hold_s=0.2)
        async with hub.lease("a"):
            pass
        async with hub.lease("b"):  # the count cap retires generation 1
            pass
        assert hub.releasing == 0 or hub.retired
        await hub.wait_freed()
        assert tracers[1]() is None and tracers[2]() is not None
        assert recorder.released == [[2]]  # handed back once, after generation 1 was gone
        assert hub.releasing == 0 and hub.lingering == [] and hub.retired == []
    asyncio.run(main())


def test_a_model_held_past_the_wait_lingers_then_goes_back_when_let_go(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(release, "GONE_WAIT_S", 0.05)

    async def main() -> None:
        hub, tracers, recorder = make_hub(hold_s=0.0)
        async with hub.lease("a") as gen:
            kept = gen.loaded.model  # a reference nothing in the hub knows about
        del gen
        async with hub.lease("b"):
            pass
        with caplog.at_level(logging.WARNING, logger="frink_mlx.hub"):
            await hub.wait_freed()
        assert hub.lingering == [1] and hub.releasing == 0
        assert "generation 1 is still referenced" in caplog.text and "coroutine" in caplog.text
        assert len(recorder.released) == 1
        del kept
        gc.collect()  # the weak reference's callback asks the loop for a release
        for _ in range(5):
            await asyncio.sleep(0)
        await hub.wait_freed()
        assert hub.lingering == [] and hub.releasing == 0
        assert recorder.released[-1] == [2] and len(recorder.released) == 2
    asyncio.run(main())


def test_the_idle_reaper_keeps_nothing_it_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its loop sleeps between looks; a loop variable would hold the last one evicted."""
    monkeypatch.setattr(release, "GONE_WAIT_S", 0.2)

    async def main() -> None:
        hub, tracers, recorder = make_hub(hold_s=0.0, keep_alive_s=0.05)
        async with hub.lease("a"):
            pass
        reaper = asyncio.get_running_loop().create_task(hub.reap_idle())
        while hub.resident:
            await asyncio.sleep(0.01)
        await hub.wait_freed()
        reaper.cancel()
        assert tracers[1]() is None and hub.lingering == [] and recorder.released == [[]]
    asyncio.run(main())


def test_a_context_copied_during_a_request_keeps_none_of_its_runs() -> None:
    """http/access.py rule 8: a timer the request scheduled keeps a copy of its context."""
    copies: list[contextvars.Context] = []

    async def app(scope: Any, receive: Any, send: Any) -> None:
        track_run(SimpleNamespace(tally=lambda: {
            "model": "a", "generation": 1, "prompt_tokens": 1, "cached_tokens": 0,
            "completion_tokens": 1, "ttft_s": None}, max_tokens=1))
        copies.append(contextvars.copy_context())
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b""}

    async def send(message: Any) -> None:
        pass

    scope = {"type": "http", "method": "POST", "path": "/x", "headers": []}
    asyncio.run(AccessLogMiddleware(app, enabled=False)(scope, receive, send))
    assert copies[0][_request_runs] == []
    assert scope["state"]["generation"] == 1  # the line was recorded first
