"""engine/hub.py: leases pin a generation, swaps publish, FIFO, min lifetime, 409s, failures.

A fake generation factory stands in for model loading here (the hub's logic
is about pointers and counts); the live-HTTP tests exercise real models.
"""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from frink_mlx.backend import select_backend
from frink_mlx.errors import Conflict, EngineFailure, ModelNotFound, NoModelLoaded
from frink_mlx.registry import ModelSpec, Registry
from frink_mlx.serving.hub import Generation, Hub
from frink_mlx.settings import Settings


class FakeEngine:
    def __init__(self) -> None:
        self.shut = threading.Event()

    def shutdown(self, timeout_s: float) -> None:
        self.shut.set()


def registry() -> Registry:
    entries = {
        "a": ModelSpec(name="a", source="/a", aliases=("alpha",)),
        "b": ModelSpec(name="b", source="/b", aliases=("beta",)),
        "c": ModelSpec(name="c", source="/c"),
        "broken": ModelSpec(name="broken", source="/nowhere"),
    }
    return Registry(entries=entries, default="a", path="<test>")


def make_hub(load_s: float = 0.0, **settings) -> tuple[Hub, list[str]]:
    loads: list[str] = []

    def factory(spec, settings_, number, gate, backend):
        time.sleep(load_s)
        if spec.name == "broken":
            raise RuntimeError("no such checkpoint")
        loads.append(spec.name)
        return Generation(number, spec, object(), FakeEngine(), None, time.monotonic())

    s = Settings.load(**{"min_generation_s": 0.0, **settings})
    return Hub(s.hub_config(), registry(), backend=select_backend(s.backend_config()), factory=factory,
               gate=threading.Lock()), loads


def run(coro):
    return asyncio.run(coro)


def test_resolution_and_lease_counts():
    async def main():
        hub, loads = make_hub()
        with pytest.raises(NoModelLoaded):
            await hub.acquire(None)
        g1 = await hub.load(None)
        for name in (None, "default", "a", "alpha"):
            async with hub.lease(name) as gen:
                assert gen is g1 and hub.num_leases(g1) == 1
        assert hub.num_leases(g1) == 0
        with pytest.raises(ModelNotFound):
            await hub.acquire("zzz")
        assert loads == ["a"] and hub.state == "ready"
    run(main())


def test_swap_pins_old_generation_until_last_lease_then_frees_it():
    async def main():
        hub, _ = make_hub()
        g1 = await hub.load("a")
        held = await hub.acquire("a")
        async with hub.lease("beta") as g2:   # just-in-time swap
            assert g2.spec.name == "b" and g2.number == g1.number + 1
            assert hub.current is g2
        assert held.generation is g1 and g1 in hub.retired
        assert not g1.engine.shut.is_set()
        held.release()
        await hub.wait_freed()
        assert g1.engine.shut.is_set() and hub.retired == []
    run(main())


def test_swap_waiters_are_served_in_arrival_order():
    async def main():
        hub, loads = make_hub(load_s=0.05)
        await hub.load("a")
        order: list[str] = []

        async def ask(name: str) -> None:
            async with hub.lease(name) as gen:
                order.append(f"{name}:{gen.spec.name}")

        await asyncio.gather(ask("b"), ask("c"), ask("b"))
        assert order == ["b:b", "c:c", "b:b"]
        assert loads == ["a", "b", "c", "b"]
    run(main())


def test_min_generation_lifetime_delays_a_swap():
    async def main():
        hub, _ = make_hub(min_generation_s=0.4)
        await hub.load("a")
        started = time.monotonic()
        async with hub.lease("b"):
            pass
        assert time.monotonic() - started >= 0.35
    run(main())


def test_no_auto_swap_is_409():
    async def main():
        hub, _ = make_hub(auto_swap=False)
        await hub.load("a")
        with pytest.raises(Conflict):
            await hub.acquire("b")
        async with hub.lease("alpha"):  # the active model's aliases still resolve
            pass
    run(main())


def test_second_concurrent_load_is_409_and_failed_load_keeps_old_model():
    async def main():
        hub, _ = make_hub(load_s=0.1)
        g1 = await hub.load("a")
        task = hub.begin_load("b")
        with pytest.raises(Conflict):
            hub.begin_load("c")
        g2 = await task
        assert hub.current is g2
        with pytest.raises(EngineFailure):
            await hub.load("broken")
        assert hub.current is g2 and hub.last_error["model"] == "broken"
        assert "no such checkpoint" in hub.last_error["message"]
        assert g1.number < g2.number
    run(main())


def test_unload_parks_the_hub_until_a_load():
    async def main():
        hub, _ = make_hub()
        g1 = await hub.load("a")
        await hub.unload()
        await hub.wait_freed()
        assert g1.engine.shut.is_set() and hub.state == "unavailable"
        for name in (None, "a", "b"):
            with pytest.raises(NoModelLoaded) as info:
                await hub.acquire(name)
            assert info.value.retry_after_s and info.value.status == 503
        await hub.load("b")
        async with hub.lease("b"):
            pass
    run(main())


def test_idle_generation_is_unloaded_and_wakes_on_demand():
    async def main():
        hub, loads = make_hub(keep_alive_s=0.2, auto_swap=False)
        g1 = await hub.load("b")
        reaper = asyncio.get_running_loop().create_task(hub.reap_idle())
        held = await hub.acquire("b")
        await asyncio.sleep(0.4)
        assert hub.current is g1                 # a leased generation is never reaped
        held.release()
        for _ in range(50):
            await asyncio.sleep(0.05)
            if hub.current is None:
                break
        assert hub.state == "idle" and hub.sleeping.name == "b"
        await hub.wait_freed()
        assert g1.engine.shut.is_set()
        async with hub.lease("default") as gen:   # wakes the same model, auto-swap off
            assert gen.spec.name == "b" and gen.number == g1.number + 1
        reaper.cancel()
        assert loads == ["b", "b"]
    run(main())


def test_turn_memory_reports_where_a_continuation_diverges():
    from frink_mlx.serving.handles import TurnMemory

    memory = TurnMemory()
    memory.remember([1, 2, 3], [7, 8, 9])
    assert memory.divergence([1, 2, 3, 7, 8, 9, 4, 5]) is None     # exact continuation
    assert memory.divergence([1, 2, 3, 7, 6, 9, 4]) == 4           # the answer re-tokenized
    assert memory.divergence([1, 2, 4]) is None                    # another conversation
    assert memory.divergence([1, 2]) is None
