"""Model generations: one immutable pointer, leases, and swaps that never splice.

The active model is a pointer to an immutable `Generation` (checkpoint,
tokenizer, engine with its KV pool, context plan, number). A request leases
the generation once and keeps that lease to its last byte, so a swap can
never splice two checkpoints into one answer:

    request A ── lease(g1) ──────────────────────────── release ─┐
    swap               load g2 (worker thread) ── publish g2     │
    request B                                    lease(g2) ──...  └─ g1 freed
                                                                    (engine shut down,
                                                                     mx.clear_cache())

Rules:
1. Resolution: None / "default" / the active model's name or aliases -> the
   active generation, immediately. Another registry entry -> a just-in-time
   swap when `config.auto_swap` (else Conflict 409). Names in no entry ->
   ModelNotFound 404; an entry whose source is missing -> ModelUnavailable 404
   with the reason (registry rule 5), checked before any swap or admin load.
   Nothing active -> NoModelLoaded 503 (+ Retry-After); so is every request
   while the first model loads (start-up), whatever it names.
2. Swaps are serialised on one FIFO lock: waiting requests are answered in
   arrival order, and one that finds its model already active after the wait
   just leases it. A generation lives at least `config.min_generation_s`
   before a swap may replace it (no thrashing).
3. Loads run in a worker thread. An admin load while another load runs is
   Conflict 409. A failed load keeps the old generation serving and is kept
   in `last_error` for /admin/models. While one runs, `load_progress` (a
   models.progress.Progress the worker reports into: phase, bytes of a
   download or GGUF import) says how far it is (`snapshot()`; /health,
   /admin/models and /admin/status show it) and the log gets a line every
   LOAD_LOG_INTERVAL_S.
4. A replaced (or unloaded) generation is retired: its engine is shut down
   and memory released when its last lease ends. Nothing in flight migrates.
   Memory goes back to the OS only after the hub's last reference is dropped
   (backend/memory.py: MLX's cache, then glibc's free heap); whoever else
   keeps a Generation (a finished Run, a start-up task's result) keeps its
   weights, so nothing does.
5. After an explicit unload the hub is parked: every request gets 503 until
   an admin load; just-in-time swaps do not wake it.
6. Idle unload (`config.keep_alive_s`): a generation with no lease for that
   long is retired and the hub goes to sleep ("idle"); the next request for it
   (or for "default") loads it again, even with auto-swap off.
7. Drain (`begin_drain`, at SIGTERM): every new lease and load is refused
   with 503 + Retry-After; leases already held run on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Literal

import anyio

from ..backend import Backend
from ..config import HubConfig
from ..engine.gate import DecodeGate
from ..errors import Conflict, EngineFailure, FrinkError, NoModelLoaded, Unavailable
from ..models.progress import Progress, reporting
from ..registry import ModelSpec, Registry
from .embeddings import attach_embedder
from .generation import Gate, Generation, GenerationFactory, build_generation, free_generation

log = logging.getLogger("frink_mlx.hub")

HubState = Literal["ready", "loading", "idle", "unavailable", "draining"]
LOAD_LOG_INTERVAL_S = 5.0
DRAIN_RETRY_AFTER_S = 5.0


async def _log_progress(progress: Progress) -> None:
    """Rule 3: a log line every LOAD_LOG_INTERVAL_S while a load runs."""
    log.info("loading %s", progress.model)
    while True:
        await asyncio.sleep(LOAD_LOG_INTERVAL_S)
        log.info("still loading %s (%s, %.0f s)", progress.model, progress.phase_name,
                 progress.elapsed_s)


class Lease:
    """One request's hold on one generation; release() is idempotent."""

    def __init__(self, hub: "Hub", gen: Generation) -> None:
        self.hub, self.generation, self._held = hub, gen, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.hub._release(self.generation)


class Hub:
    """Owns the active generation pointer (see module rules)."""

    def __init__(self, config: HubConfig, registry: Registry, *, backend: Backend,
                 factory: GenerationFactory = build_generation, gate: Gate | None = None,
                 on_load: Callable[[Generation], None] | None = None) -> None:
        self.config, self.registry, self.factory = config, registry, factory
        self.backend = backend  # chosen once at start-up (backend/select.py)
        self.gate: Gate = gate if gate is not None else DecodeGate()
        self.on_load = on_load
        self.current: Generation | None = None
        self.loading: str | None = None
        self.loading_since: float | None = None  # time.monotonic() of the load's start
        self.load_progress: Progress | None = None
        self.draining = False
        self.releasing = 0  # rule 4: freed generations whose memory is still being handed back
        self.last_error: dict[str, Any] | None = None
        self.parked = False
        self.sleeping: ModelSpec | None = None   # rule 6: idle-unloaded, wakes on demand
        self.last_used = time.monotonic()
        self._numbers = 0
        self._leases: dict[int, int] = {}
        self._retired: dict[int, Generation] = {}
        self._swap_lock = anyio.Lock()
        self._frees: list[asyncio.Future[None]] = []
        self._tasks: set[asyncio.Task[Generation]] = set()

    # --- state -----------------------------------------------------------------
    @property
    def state(self) -> HubState:
        if self.draining:
            return "draining"
        if self.current is not None:
            return "ready"
        if self.loading is not None:
            return "loading"
        return "idle" if self.sleeping is not None else "unavailable"

    def num_leases(self, gen: Generation | None = None) -> int:
        gen = gen or self.current
        return 0 if gen is None else self._leases.get(gen.number, 0)

    @property
    def retired(self) -> list[Generation]:
        return list(self._retired.values())

    # --- leases ----------------------------------------------------------------
    async def acquire(self, name: str | None) -> Lease:
        """Lease the generation that serves `name` (rules 1-2, 7; registry rule 8 first)."""
        self._refuse_while_draining()
        name = self.registry.route(name)
        gen = self._active_for(name)
        if gen is not None:
            return self._pin(gen)
        wake = self._wakes(name)
        spec = self.sleeping if wake and self.sleeping else self.registry.available(name)
        return await self._swap_for(spec, wake=wake)

    def begin_drain(self) -> None:
        """Rule 7: from now on every lease and load is refused; held leases run on."""
        self.draining = True

    def _refuse_while_draining(self) -> None:
        if self.draining:
            raise Unavailable("The daemon is shutting down; retry when it is back.",
                              code="shutting_down", retry_after_s=DRAIN_RETRY_AFTER_S)

    def _pin(self, gen: Generation) -> Lease:
        """Count a lease; never separated from the pointer read by an await."""
        self._leases[gen.number] = self._leases.get(gen.number, 0) + 1
        self.last_used = time.monotonic()
        return Lease(self, gen)

    def _wakes(self, name: str | None) -> bool:
        sleeping = self.sleeping
        return sleeping is not None and self.current is None and not self.parked and \
            (name in (None, "default", sleeping.name) or name in sleeping.aliases)

    @asynccontextmanager
    async def lease(self, name: str | None) -> AsyncIterator[Generation]:
        held = await self.acquire(name)
        try:
            yield held.generation
        finally:
            held.release()

    def _active_for(self, name: str | None) -> Generation | None:
        gen = self.current
        if gen is not None and gen.answers_to(name):
            return gen
        if self._wakes(name):
            return None
        if gen is None and self.loading is not None:  # rule 1: the first load runs
            self.registry.resolve(name)
            raise self._unavailable()
        if gen is None and (self.parked or name is None or name == "default"
                            or not self.config.auto_swap):
            self.registry.resolve(name)  # unknown names stay 404 even now
            raise self._unavailable()
        return None

    def _unavailable(self) -> NoModelLoaded:
        if self.loading is not None:
            return NoModelLoaded(f"The model '{self.loading}' is loading.", retry_after_s=2.0)
        return NoModelLoaded("No model is loaded; POST /admin/models/load to load one.",
                             retry_after_s=10.0)

    async def _swap_for(self, spec: ModelSpec, wake: bool = False) -> Lease:
        if not self.config.auto_swap and not wake:
            active = self.current.name if self.current else "none"
            raise Conflict(f"The model '{spec.name}' is not loaded (active: '{active}') and "
                           "automatic swapping is off; POST /admin/models/load first.",
                           param="model")
        async with self._swap_lock:  # pinned inside the lock: no swap can retire it first
            if self.current is not None and self.current.spec.name == spec.name:
                return self._pin(self.current)
            if self.parked:
                raise self._unavailable()
            await self._wait_min_lifetime()
            return self._pin(await self._load_locked(spec))

    async def _wait_min_lifetime(self) -> None:
        if self.current is None:
            return
        left = self.current.created_at + self.config.min_generation_s - time.monotonic()
        if left > 0:
            await anyio.sleep(left)

    def _release(self, gen: Generation) -> None:
        count = self._leases.get(gen.number, 0) - 1
        if count > 0:
            self._leases[gen.number] = count
            return
        self._leases.pop(gen.number, None)
        self.last_used = time.monotonic()
        if gen.number in self._retired:
            self._schedule_free(gen)

    # --- load / unload ---------------------------------------------------------
    def begin_load(self, name: str | None) -> "asyncio.Task[Generation]":
        """Admin load in the background (rule 3): 409 if a load is running.

        The reservation is taken synchronously, so two requests can never both
        pass the check."""
        self._refuse_while_draining()
        spec = self.registry.available(name)
        if self.loading is not None or self._swap_lock.locked():
            raise Conflict(f"The model '{self.loading or '?'}' is already loading; "
                           "try again when it finishes.", param="model")
        self.loading, self.loading_since = spec.name, time.monotonic()
        task = asyncio.get_running_loop().create_task(self._reserved_load(spec))
        self._tasks.add(task)
        task.add_done_callback(self._load_done)
        return task

    def _load_done(self, task: "asyncio.Task[Generation]") -> None:
        self._tasks.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: failures live in last_error

    async def load(self, name: str | None) -> Generation:
        """Admin load, waited for."""
        return await asyncio.shield(self.begin_load(name))

    async def _reserved_load(self, spec: ModelSpec) -> Generation:
        try:
            async with self._swap_lock:
                self.parked, self.sleeping = False, None
                if self.current is not None and self.current.spec.name == spec.name:
                    return self.current
                return await self._load_locked(spec)
        finally:
            if self.loading == spec.name:
                self.loading = None

    async def _load_locked(self, spec: ModelSpec) -> Generation:
        number = self._numbers + 1
        started = time.monotonic()
        if self.loading != spec.name:  # a swap; an admin load keeps its reservation's start
            self.loading_since = started
        self.loading = spec.name
        self.load_progress = progress = Progress(spec.name, initial_phase="loading")
        ticker = asyncio.get_running_loop().create_task(_log_progress(progress))
        try:
            gen = await anyio.to_thread.run_sync(
                self._build, spec, number, progress, abandon_on_cancel=False)
        except Exception as exc:  # rule 3: keep the old model, remember why
            self.last_error = {"model": spec.name, "message": str(getattr(exc, "message", exc)),
                               "type": type(exc).__name__, "at": time.time()}
            log.error("loading %s failed: %s", spec.name, exc)
            if isinstance(exc, FrinkError) and exc.status < 500:
                raise
            raise EngineFailure(f"Loading the model '{spec.name}' failed: {exc}") from exc
        finally:
            ticker.cancel()
            self.loading, self.load_progress = None, None
        self._numbers = number
        log.info("generation %d: %s loaded in %.2fs", number, spec.name, time.monotonic() - started)
        self._publish(gen)
        if self.on_load is not None:
            self.on_load(gen)
        return gen

    def _build(self, spec: ModelSpec, number: int, progress: Progress) -> Generation:
        """factory + the embedder serving /v1/embeddings (side-car, self or the encoder)."""
        with reporting(progress):  # rule 3: the loaders report into it from this thread
            draft = {"draft": self.registry.resolve(spec.draft)} if spec.draft else {}
            gen = self.factory(spec, self.config, number, self.gate, self.backend, **draft)
            try:
                return attach_embedder(gen, self.registry, self.config.load, self.backend)
            except BaseException:
                free_generation(gen, self.config.drain_timeout_s)
                raise

    def _publish(self, gen: Generation | None) -> None:
        old, self.current = self.current, gen
        if gen is not None:
            self.sleeping = None
        if old is not None:
            self._retired[old.number] = old
            if self._leases.get(old.number, 0) == 0:
                self._schedule_free(old)

    async def unload(self) -> Generation | None:
        """Retire the active generation; park the hub (rule 5)."""
        async with self._swap_lock:
            old = self.current
            self.parked, self.sleeping = True, None
            self._publish(None)
            return old

    async def reap_idle(self) -> None:
        """Rule 6, run for the app's lifetime when keep_alive_s is set."""
        keep_alive_s = self.config.keep_alive_s
        if not keep_alive_s:
            return
        while True:
            await anyio.sleep(min(1.0, keep_alive_s / 4))
            gen = self.current
            if gen is None or self.num_leases(gen) or self._swap_lock.locked():
                continue
            if time.monotonic() - max(self.last_used, gen.created_at) >= keep_alive_s:
                async with self._swap_lock:
                    if self.current is gen and not self.num_leases(gen):
                        log.info("generation %d: %s idle for %.0fs, unloading", gen.number,
                                 gen.name, keep_alive_s)
                        self._publish(None)
                        self.sleeping = gen.spec

    # --- freeing ---------------------------------------------------------------
    def _schedule_free(self, gen: Generation) -> None:
        """Rule 4: shut the engine down, drop the hub's reference, then hand the memory
        back -- only once nothing here holds the generation (Backend.release_freed_memory)."""
        loop = asyncio.get_running_loop()
        number = gen.number
        future = loop.run_in_executor(None, free_generation, gen, self.config.drain_timeout_s)
        del gen  # the callback below must not keep it alive

        def forget(_f: object) -> None:
            self._retired.pop(number, None)
            self.releasing += 1
            release = loop.run_in_executor(None, self.backend.release_freed_memory)
            release.add_done_callback(lambda _r: setattr(self, "releasing", self.releasing - 1))
            self._frees.append(release)

        future.add_done_callback(forget)
        self._frees.append(future)

    async def wait_freed(self) -> None:
        """Wait for every scheduled free (tests, shutdown)."""
        while self._frees:
            pending, self._frees = self._frees, []
            await asyncio.gather(*pending, return_exceptions=True)

    async def shutdown(self) -> None:
        """Retire everything; engines finish their in-flight rows first."""
        for task in list(self._tasks):
            task.cancel()
        self._publish(None)
        for gen in list(self._retired.values()):
            if self._leases.get(gen.number, 0) > 0:
                self._leases.pop(gen.number, None)
                self._schedule_free(gen)
        await self.wait_freed()
