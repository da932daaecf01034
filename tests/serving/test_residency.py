"""serving/residency.py through the hub: several resident models priced against
memory, LRU eviction of idle ones only, pinning, the sum, 507 / 503 with the numbers.

A fake generation factory stands in for model loading (each generation reports the
size of its source file as its bytes, which is also what the estimate reads); the
real-model, real-HTTP test is test_residency_http.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from frink_mlx.backend import select_backend
from frink_mlx.errors import InsufficientMemory, Unavailable
from frink_mlx.registry import ModelSpec, Registry
from frink_mlx.serving.hub import Generation, Hub
from frink_mlx.serving.residency import ESTIMATE_MARGIN, files_nbytes
from frink_mlx.settings import Settings

MODEL_BYTES = 300
BUDGET = 1000  # three 300-byte models fit (estimate 330 each), a fourth does not


class FakeEngine:
    def __init__(self) -> None:
        self.shut = threading.Event()

    def shutdown(self, timeout_s: float) -> None:
        self.shut.set()


def make_hub(tmp: Path, *, sizes: dict[str, int] | None = None,
             keep_alive: dict[str, float] | None = None, **settings: object
             ) -> tuple[Hub, list[str]]:
    sizes = {"a": MODEL_BYTES, "b": MODEL_BYTES, "c": MODEL_BYTES, "d": MODEL_BYTES,
             **(sizes or {})}
    entries = {}
    for name, size in sizes.items():
        (tmp / f"{name}.gguf").write_bytes(b"\0" * size)
        entries[name] = ModelSpec(name=name, source=str(tmp / f"{name}.gguf"),
                                  keep_alive=(keep_alive or {}).get(name))
    registry = Registry(entries=entries, default="a", path="<test>")
    loads: list[str] = []

    def factory(spec, config, number, gate, backend):
        loads.append(spec.name)
        loaded = SimpleNamespace(load_time_s=0.0, context_length=64)
        return Generation(number, spec, loaded, FakeEngine(), None, time.monotonic(),
                          nbytes=files_nbytes(spec))

    s = Settings.load(**{"min_generation_s": 0.0, "kv_budget_bytes": BUDGET,
                         "memory_headroom_fraction": 0.0, "evict_wait_s": 0.3, **settings})
    hub = Hub(s.hub_config(), registry, backend=select_backend(s.backend_config()),
              factory=factory, gate=threading.Lock())
    return hub, loads


def names(hub: Hub) -> list[str]:
    return [g.name for g in hub.resident]


def test_three_resident_then_the_lru_idle_one_is_evicted(tmp_path: Path) -> None:
    async def main() -> None:
        hub, loads = make_hub(tmp_path)
        for name in ("a", "b", "c"):
            async with hub.lease(name):
                pass
        assert names(hub) == ["a", "b", "c"] and loads == ["a", "b", "c"]
        async with hub.lease("a"):  # a is now the most recently used; b the least
            pass
        async with hub.lease("b"), hub.lease("c"):  # no reloads while resident
            pass
        assert loads == ["a", "b", "c"]
        async with hub.lease("a"):
            pass
        # LRU order now b, c, a; b is idle -> evicted for d
        async with hub.lease("d") as d:
            assert d.name == "d"
            assert names(hub) == ["c", "a", "d"]
        await hub.wait_freed()
        assert [g.name for g in hub.retired] == []
        await hub.shutdown()

    asyncio.run(main())


def test_a_leased_model_is_never_evicted(tmp_path: Path) -> None:
    async def main() -> None:
        hub, loads = make_hub(tmp_path)
        held_a = await hub.acquire("a")          # a live stream on the LRU model
        for name in ("b", "c"):
            async with hub.lease(name):
                pass
        async with hub.lease("d"):               # b is the LRU idle one, not a
            assert names(hub) == ["a", "c", "d"]
            assert not held_a.generation.engine.shut.is_set()
        held_a.release()
        await hub.shutdown()

    asyncio.run(main())


def test_busy_models_give_503_with_the_reason_after_the_wait(tmp_path: Path) -> None:
    async def main() -> None:
        hub, _ = make_hub(tmp_path)
        held = [await hub.acquire(n) for n in ("a", "b", "c")]
        started = time.monotonic()
        with pytest.raises(Unavailable) as info:
            await hub.acquire("d")
        assert time.monotonic() - started >= 0.25        # waited evict_wait_s for leases
        err = info.value
        assert err.status == 503 and err.retry_after_s and err.code == "insufficient_memory"
        assert "'a'" in err.message and "in use" in err.message and "1000" in err.message
        held[1].release()                                # b idle now: d loads in its place
        async with hub.lease("d"):
            assert names(hub) == ["a", "c", "d"]
        for lease in (held[0], held[2]):
            lease.release()
        await hub.shutdown()

    asyncio.run(main())


def test_a_pinned_model_is_never_evicted(tmp_path: Path) -> None:
    async def main() -> None:
        hub, _ = make_hub(tmp_path, keep_alive={"a": -1})
        for name in ("a", "b", "c", "d", "b", "c"):
            async with hub.lease(name):
                pass
        assert "a" in names(hub)                     # LRU every time, never evicted
        states = [r.pinned for r in hub.residency.residents.values() if r.gen.name == "a"]
        assert states == [True]
        await hub.shutdown()

    asyncio.run(main())


def test_memory_accounting_is_the_sum_of_each_generation(tmp_path: Path) -> None:
    async def main() -> None:
        hub, _ = make_hub(tmp_path, sizes={"a": 100, "b": 200, "c": 350})
        for name in ("a", "b", "c"):
            async with hub.lease(name):
                pass
        assert hub.residency.held_bytes() == sum(g.nbytes for g in hub.resident) == 650
        assert hub.residency.free_bytes() == BUDGET - 650
        await hub.shutdown()

    asyncio.run(main())


def test_a_model_that_cannot_fit_alone_is_507_with_the_numbers(tmp_path: Path) -> None:
    async def main() -> None:
        hub, loads = make_hub(tmp_path, sizes={"huge": 2000})
        async with hub.lease("a"):
            pass
        with pytest.raises(InsufficientMemory) as info:
            await hub.acquire("huge")
        err = info.value
        assert err.status == 507 and err.code == "model_too_large" and err.param == "model"
        assert str(int(2000 * ESTIMATE_MARGIN)) in err.message and "1000" in err.message
        assert names(hub) == ["a"] and loads == ["a"]   # nothing evicted for it
        await hub.shutdown()

    asyncio.run(main())


def test_keep_alive_zero_evicts_when_idle_and_request_keep_alive_overrides(
        tmp_path: Path) -> None:
    async def main() -> None:
        hub, _ = make_hub(tmp_path, keep_alive={"b": 0})
        async with hub.lease("a"):
            pass
        async with hub.lease("b"):
            assert names(hub) == ["a", "b"]
        assert names(hub) == ["a"]                  # keep_alive 0: gone with its last lease
        async with hub.lease("b") as b:
            hub.keep_alive(b, -1)                   # a request's keep_alive pins it
        assert names(hub) == ["a", "b"]
        await hub.unload("b")                       # by name; the hub stays open
        assert names(hub) == ["a"] and not hub.parked
        await hub.shutdown()

    asyncio.run(main())


def test_idle_reaper_honours_each_entrys_keep_alive(tmp_path: Path) -> None:
    async def main() -> None:
        hub, _ = make_hub(tmp_path, keep_alive={"b": 0.2})
        reaper = asyncio.get_running_loop().create_task(hub.reap_idle())
        for name in ("a", "b"):
            async with hub.lease(name):
                pass
        await asyncio.sleep(0.6)
        assert names(hub) == ["a"]                  # a has no keep-alive: stays
        reaper.cancel()
        await hub.shutdown()

    asyncio.run(main())


def test_preload_entries_load_at_start_next_to_the_default(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from frink_mlx.app import create_app

    hub, loads = make_hub(tmp_path)  # for its registry and factory
    entries = dict(hub.registry.entries)
    entries["c"] = ModelSpec(name="c", source=entries["c"].source, preload=True, keep_alive=-1)
    registry = Registry(entries=entries, default="a", path="<test>")
    settings = Settings.load(min_generation_s=0.0, kv_budget_bytes=BUDGET,
                             memory_headroom_fraction=0.0, access_log=False)
    app = create_app(settings, registry=registry, factory=hub.factory)
    with TestClient(app, base_url="http://127.0.0.1") as client:
        r = client.get("/admin/models")
        assert r.status_code == 200, r.text
        body = r.json()
        states = {m["name"]: m["residency"] for m in body["models"]}
        assert states["a"]["state"] == states["c"]["state"] == "resident"
        assert states["c"]["pinned"] is True and states["b"]["state"] == "available"
        assert body["memory"]["held_bytes"] == 2 * MODEL_BYTES
    assert loads == ["a", "c"]
