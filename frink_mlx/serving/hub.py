"""Model generations: a resident set of immutable generations, leases, no splicing.

Several models stay loaded at once (the resident set, residency.py, priced
against memory), each an immutable `Generation` (checkpoint, tokenizer,
engine with its KV pool, context plan, number). A request leases one
generation and keeps that lease to its last byte, so an eviction can never
splice two checkpoints into one answer:

    request A ── lease(chat g1) ─────────────────────────── release
    request B ── lease(fim g2) ── release   (g2 idle, LRU)
    request C    (agent: no room) evict g2 ── load g3 ── lease(g3)
                                    └─ g2 freed: engine shut down, memory handed back

Rules:
1. Resolution: a resident model's name or alias -> that generation, at once
   (never behind another model's load). None / "default" -> `current`, the
   one loaded (or admin-loaded) last. A registry entry not resident -> loaded
   just in time next to the others when `config.auto_swap` (else 409). Names
   in no entry -> 404; an entry whose source is missing -> ModelUnavailable
   404 (registry rule 5). Nothing resident -> NoModelLoaded 503 (+
   Retry-After) for "default" and while the first model loads.
2. Loads are serialised on one FIFO lock (arrival order; one that finds its
   model resident after the wait just leases it). Room is made first
   (rule 9: LRU idle evictions, 503 or 507 with the numbers). With
   max_resident_models the count is enforced after the load publishes: the
   LRU generation is retired even with leases, which finish on it (1 = the
   classic single-model swap, min_generation_s apart).
3. Loads run in a worker thread. An admin load while another load runs is
   Conflict 409. A failed load keeps the resident set serving (minus what was
   evicted to make room) and is kept in `last_error`. While one runs,
   `load_progress` (a models.progress.Progress the worker reports into:
   phase, bytes of a download or GGUF import) says how far it is (/health,
   /admin/models and /admin/status show it) and the log gets a line every
   LOAD_LOG_INTERVAL_S.
4. A retired generation's engine is shut down and memory released when its
   last lease ends. Nothing in flight migrates. Memory goes back to the OS
   once the generation is really gone, not merely dropped by the hub
   (release.py: traced by a weak reference; `releasing` until then,
   `lingering` if something still holds it; backend/memory.py). So nothing
   here keeps a retired generation in a frame that awaits: loops that
   retire run in frames of their own.
5. `unload()` retires every resident generation and parks the hub: every
   request gets 503 until an admin load. `unload(name)` retires one model;
   the hub stays open and may load it again on demand.
6. Idle eviction (residency.py rule 6, `reap_idle`): a resident idle past its
   keep-alive is retired; when it was the last one the hub sleeps ("idle")
   and the next request for it (or for "default") loads it again, even with
   auto-swap off. `keep_alive(gen, s)` sets a request's keep-alive (Ollama's).
7. Drain (`begin_drain`, at SIGTERM): every new lease and load is refused
   with 503 + Retry-After; leases already held run on.
8. The hub owns the daemon's SSD tier (`disk`, engine/kv/disk.py; None when
   config.disk is): every generation's engine spills its prefix cache there,
   so a model evicted and loaded again, or swapped back, reads its blocks
   back. `shutdown` closes it after the engines, whose last idle blocks it
   writes first (up to `drain_timeout_s`).
9. Making room (`_make_room`, under the load lock, before a load): refuse a
   model that cannot fit alone (507, residency rule 4; a factory with
   `shards` -- a distributed group's, serving/distributed.py -- holds
   1/shards of it per rank); evict the LRU idle victims at once and wait for
   their memory to be handed back; if no set of idle ones frees enough, poll
   every ROOM_POLL_S until leases end, for at most `evict_wait_s`, then 503
   + Retry-After naming what holds the memory.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from typing import Any, AsyncIterator, Callable, Literal

import anyio
import msgspec

from ..backend import Backend
from ..config import HubConfig
from ..engine.gate import DecodeGate
from ..engine.kv.disk import DiskTier
from ..errors import Conflict, EngineFailure, FrinkError, InsufficientMemory, NoModelLoaded, Unavailable
from ..models.progress import Progress, reporting
from ..registry import ModelSpec, Registry
from .generation import (
    Gate,
    Generation,
    GenerationFactory,
    attach_embedder,
    build_generation,
    free_generation,
    takes_disk,
)
from .release import Releases
from .residency import Residency, estimate_nbytes, keep_alive_of, memory_budget

log = logging.getLogger("frink_mlx.hub")

HubState = Literal["ready", "loading", "idle", "unavailable", "draining"]
LOAD_LOG_INTERVAL_S = 5.0
DRAIN_RETRY_AFTER_S = 5.0
ROOM_POLL_S = 0.05
ROOM_RETRY_AFTER_S = 5.0


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
    """Owns the resident set and the leases on it (see module rules)."""

    def __init__(self, config: HubConfig, registry: Registry, *, backend: Backend,
                 factory: GenerationFactory = build_generation, gate: Gate | None = None,
                 on_load: Callable[[Generation], None] | None = None) -> None:
        self.config, self.registry, self.factory = config, registry, factory
        self.backend = backend  # chosen once at start-up (backend/select.py)
        self.gate: Gate = gate if gate is not None else DecodeGate()
        self.on_load = on_load
        self.residency = Residency(memory_budget(config, backend), config.max_resident_models)
        self.loading: str | None = None
        self.loading_since: float | None = None  # time.monotonic() of the load's start
        self.load_progress: Progress | None = None
        self.draining = False
        self.releases = Releases(backend, config.drain_timeout_s)  # rule 4
        self.disk = DiskTier(config.disk.directory, config.disk.budget_bytes) \
            if config.disk is not None else None  # rule 8
        self.last_error: dict[str, Any] | None = None
        self.parked = False
        self.sleeping: ModelSpec | None = None   # rule 6: idle-unloaded, wakes on demand
        self.last_used = time.monotonic()
        self._numbers = 0
        self._leases: dict[int, int] = {}
        self._retired: dict[int, Generation] = {}
        self._swap_lock = anyio.Lock()
        self._tasks: set[asyncio.Task[Generation]] = set()

    # --- state -----------------------------------------------------------------
    @property
    def current(self) -> Generation | None:
        """Rule 1's "default": the resident generation loaded (or admin-loaded) last."""
        return self.residency.active()

    @property
    def resident(self) -> list[Generation]:
        """Every resident generation, least recently used first."""
        return self.residency.generations()

    @property
    def state(self) -> HubState:
        if self.draining:
            return "draining"
        if self.residency.residents:
            return "ready"
        if self.loading is not None:
            return "loading"
        return "idle" if self.sleeping is not None else "unavailable"

    def num_leases(self, gen: Generation | None = None) -> int:
        gen = gen or self.current
        return 0 if gen is None else self._leases.get(gen.number, 0)

    def busy(self, gen: Generation) -> bool:
        return self._leases.get(gen.number, 0) > 0

    @property
    def retired(self) -> list[Generation]:
        return list(self._retired.values())

    # --- leases ----------------------------------------------------------------
    async def acquire(self, name: str | None) -> Lease:
        """Lease the generation that serves `name` (rules 1-2, 7; registry rule 8 first)."""
        self._refuse_while_draining()
        name = self.registry.route(name)
        gen = self._resident_for(name)
        if gen is not None:
            return self._pin(gen)
        wake = self._wakes(name)
        spec = self.sleeping if wake and self.sleeping else self.registry.available(name)
        return await self._load_for(spec, wake=wake)

    def begin_drain(self) -> None:
        """Rule 7: from now on every lease and load is refused; held leases run on."""
        self.draining = True

    def _refuse_while_draining(self) -> None:
        if self.draining:
            raise Unavailable("The daemon is shutting down; retry when it is back.",
                              code="shutting_down", retry_after_s=DRAIN_RETRY_AFTER_S)

    def _pin(self, gen: Generation) -> Lease:
        """Count a lease; never separated from the resolution by an await."""
        self._leases[gen.number] = self._leases.get(gen.number, 0) + 1
        self.last_used = time.monotonic()
        self.residency.touch(gen)
        return Lease(self, gen)

    def _wakes(self, name: str | None) -> bool:
        sleeping = self.sleeping
        if sleeping is None or self.parked:
            return False
        if name in (None, "default"):
            return not self.residency.residents
        return name == sleeping.name or name in sleeping.aliases

    @asynccontextmanager
    async def lease(self, name: str | None) -> AsyncIterator[Generation]:
        held = await self.acquire(name)
        try:
            yield held.generation
        finally:
            held.release()

    def _resident_for(self, name: str | None) -> Generation | None:
        default = name is None or name == "default"
        gen = self.current if default else self.residency.find(name)
        if gen is not None:
            return gen
        if self._wakes(name):
            return None
        if self.residency.residents:
            return None
        if self.loading is not None or self.parked or default or not self.config.auto_swap:
            self.registry.resolve(name)  # unknown names stay 404 even now
            raise self._unavailable()
        return None

    def _unavailable(self) -> NoModelLoaded:
        if self.loading is not None:
            return NoModelLoaded(f"The model '{self.loading}' is loading.", retry_after_s=2.0)
        return NoModelLoaded("No model is loaded; POST /admin/models/load to load one.",
                             retry_after_s=10.0)

    async def _load_for(self, spec: ModelSpec, wake: bool = False) -> Lease:
        if not self.config.auto_swap and not wake:
            names = ", ".join(f"'{g.name}'" for g in self.resident) or "none"
            raise Conflict(f"The model '{spec.name}' is not loaded (resident: {names}) and "
                           "automatic swapping is off; POST /admin/models/load first.",
                           param="model")
        async with self._swap_lock:  # pinned inside the lock: no load can evict it first
            gen = self.residency.find(spec.name)
            if gen is not None:
                return self._pin(gen)
            if self.parked:
                raise self._unavailable()
            return self._pin(await self._load_locked(spec))

    def _release(self, gen: Generation) -> None:
        count = self._leases.get(gen.number, 0) - 1
        if count > 0:
            self._leases[gen.number] = count
            return
        self._leases.pop(gen.number, None)
        self.last_used = time.monotonic()
        if gen.number in self._retired:
            self._schedule_free(gen)
            return
        resident = self.residency.get(gen)
        if resident is not None and resident.keep_alive_s == 0:  # residency rule 6
            self._retire(gen)

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
                gen = self.residency.find(spec.name)
                if gen is not None:
                    self.residency.activate(gen)
                    return gen
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
        try:
            await self._make_room(spec)
            self.load_progress = progress = Progress(spec.name, initial_phase="loading")
            ticker = asyncio.get_running_loop().create_task(_log_progress(progress))
            try:
                gen = await anyio.to_thread.run_sync(
                    self._build, spec, number, progress, abandon_on_cancel=False)
            finally:
                ticker.cancel()
        except Exception as exc:  # rule 3: keep the others, remember why
            self.last_error = {"model": spec.name, "message": str(getattr(exc, "message", exc)),
                               "type": type(exc).__name__, "at": time.time()}
            log.error("loading %s failed: %s", spec.name, exc)
            if isinstance(exc, FrinkError) and exc.status < 500 or \
                    isinstance(exc, (Unavailable, InsufficientMemory)):
                raise
            raise EngineFailure(f"Loading the model '{spec.name}' failed: {exc}") from exc
        finally:
            self.loading, self.load_progress = None, None
        self._numbers = number
        log.info("generation %d: %s loaded in %.2fs", number, spec.name, time.monotonic() - started)
        self._publish(gen)
        if self.on_load is not None:
            self.on_load(gen)
        return gen

    async def _make_room(self, spec: ModelSpec) -> None:
        """Rule 9: evict LRU idle generations until `spec` fits, or raise."""
        residency, config = self.residency, self.config
        need = estimate_nbytes(spec, self.registry) // max(1, int(getattr(self.factory, "shards", 1)))
        residency.check_fits_alone(spec, need)
        wait_s = residency.min_lifetime_left_s(config.min_generation_s)
        if wait_s > 0:
            await anyio.sleep(wait_s)
        deadline = time.monotonic() + config.evict_wait_s
        while (victims := residency.victims(need, self.busy, config.min_generation_s)) is None:
            if time.monotonic() >= deadline:
                raise Unavailable(
                    f"No room to load '{spec.name}': it needs about {need} bytes, "
                    f"{residency.free_bytes()} of {residency.budget_bytes} are free, and the "
                    f"memory is held by {residency.blockers(self.busy)}; retry when one is idle.",
                    code="insufficient_memory", retry_after_s=ROOM_RETRY_AFTER_S)
            await anyio.sleep(ROOM_POLL_S)
        if self._evict(victims):
            await self.wait_freed()

    def _evict(self, victims: list[Generation]) -> int:
        """Retire `victims`, emptying the list, so the waiting caller holds none of them
        (rule 4)."""
        count = len(victims)
        while victims:
            self._retire(victims.pop(0))
        return count

    def _build(self, spec: ModelSpec, number: int, progress: Progress) -> Generation:
        """The factory (with the entry's draft model, registry rule 10) + the embedder
        (generation.py rule 1), its KV pool planned against what the resident models hold
        (residency rule 2). Blocking: run in a worker thread (rule 3), whose loaders
        report into `progress`."""
        config = self.config
        budget = msgspec.structs.replace(config.budget, reserved_bytes=self.residency.held_bytes())
        with reporting(progress):
            extra: dict[str, Any] = {"draft": self.registry.resolve(spec.draft)} if spec.draft else {}
            if self.disk is not None and takes_disk(self.factory):
                extra["disk"] = self.disk
            gen = self.factory(spec, msgspec.structs.replace(config, budget=budget), number,
                               self.gate, self.backend, **extra)
            try:
                return attach_embedder(gen, self.registry, config.load, self.backend)
            except BaseException:
                free_generation(gen, config.drain_timeout_s)
                raise

    def _publish(self, gen: Generation) -> None:
        """Rule 2: join the resident set; then the count cap retires the LRU ones, and so
        does a newcomer that turned out larger than its estimate (residency rule 8)."""
        self.sleeping = None
        self.residency.add(gen, keep_alive_of(gen.spec, self.config))
        for old in self.residency.over_count(gen) + self.residency.over_budget(gen, self.busy):
            self._retire(old)

    def _retire(self, gen: Generation) -> None:
        """Out of the resident set; freed now, or when its last lease ends (rule 4)."""
        if not self.residency.remove(gen):
            return
        self._retired[gen.number] = gen
        if self._leases.get(gen.number, 0) == 0:
            self._schedule_free(gen)

    def keep_alive(self, gen: Generation, keep_alive_s: float | None) -> None:
        """A request's keep-alive for `gen` (rule 6, Ollama's `keep_alive`): seconds idle
        before eviction, 0 = as soon as it is idle, negative = pinned; None = back to the
        entry's (residency rule 6)."""
        resident = self.residency.get(gen)
        if resident is not None:
            resident.keep_alive_s = (keep_alive_s if keep_alive_s is not None
                                     else keep_alive_of(gen.spec, self.config))

    async def unload(self, name: str | None = None) -> Generation | None:
        """Rule 5: one model by name, or every resident one (and park the hub)."""
        async with self._swap_lock:
            if name is not None:
                gen = self.residency.find(self.registry.resolve(name).name)
                if gen is not None:
                    self._retire(gen)
                return gen
            old = self.current
            self.parked, self.sleeping = True, None
            for gen in self.resident:
                self._retire(gen)
            return old

    async def reap_idle(self) -> None:
        """Rule 6, run for the app's lifetime: retire residents idle past their keep-alive;
        when the last one goes the hub sleeps (its next request, or "default", loads it
        again)."""
        while True:
            await anyio.sleep(self.residency.reap_interval_s(self.config.keep_alive_s))
            if not self._swap_lock.locked():
                self._reap_once()

    def _reap_once(self) -> None:
        """One look, in a frame of its own: no loop variable keeps a retired generation
        alive across the reaper's sleep (rule 4)."""
        for gen in self.residency.expired(self.busy):
            log.info("generation %d: %s idle past its keep-alive, unloading", gen.number,
                     gen.name)
            self._retire(gen)
            if not self.residency.residents:
                self.sleeping = gen.spec

    # --- freeing ---------------------------------------------------------------
    def _schedule_free(self, gen: Generation) -> None:
        """Rule 4 (release.py): the engine stops, the hub lets go, the memory goes back."""
        self.releases.schedule(gen, lambda number: self._retired.pop(number, None))

    @property
    def releasing(self) -> int:
        """Retired generations whose memory is not handed back yet (release.py)."""
        return self.releases.releasing

    @property
    def lingering(self) -> list[int]:
        """Freed generations something still references (release.py rule 3)."""
        return sorted(self.releases.lingering)

    async def wait_freed(self) -> None:
        """Wait for every scheduled free (tests, shutdown)."""
        await self.releases.wait()

    async def shutdown(self) -> None:
        """Retire everything; engines finish their in-flight rows first."""
        for task in list(self._tasks):
            task.cancel()
        self._free_all()
        await self.wait_freed()
        if self.disk is not None:  # rule 8
            await anyio.to_thread.run_sync(self.disk.close, self.config.drain_timeout_s)

    def _free_all(self) -> None:
        """Shutdown's frees, in a frame of their own: no loop variable outlives them."""
        for gen in self.resident:
            self._retire(gen)
        for gen in list(self._retired.values()):
            if self._leases.pop(gen.number, 0) > 0:
                self._schedule_free(gen)
