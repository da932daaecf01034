"""The hub's side of residency: the budget, keep-alives, and making room for a load.

Why a module of its own: the resident-set policy (residency.py) is plain
numbers; the hub (hub.py) owns leases and loads. What joins them -- waiting,
with a bound, for a busy model to go idle before evicting it, and the
figures each needs from the config -- lives here so neither grows past a
readable size.

Rules:
1. The budget is the device budget (the `kv_budget_bytes` override, else
   `Backend.memory_budget()`) less `memory_headroom_fraction` of it: the same
   arithmetic as models/budget.py, so the resident set and each KV plan agree.
2. `make_room` (called under the hub's load lock, before a load): refuse a
   model that cannot fit alone (507; a factory with `shards` -- a distributed
   group's, serving/distributed.py -- holds 1/shards of it per rank); evict the LRU idle victims at once and
   wait for their memory to be handed back; if no set of idle ones frees
   enough, poll every ROOM_POLL_S until leases end, for at most
   `evict_wait_s`, then 503 + Retry-After naming what holds the memory.
3. keep-alive: the entry's `keep_alive` (models.toml), else the daemon's
   `keep_alive_s`; None = never idle-evicted.
4. After a load publishes, a newcomer that measured larger than its estimate
   (`over_budget`) pushes out LRU idle generations until the sum fits again;
   when only busy or pinned ones are left, the set stays over budget (a
   warning) rather than cut a stream.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from ..backend import Backend
from ..config import HubConfig
from ..errors import Unavailable
from ..models.progress import Progress, reporting
from ..registry import ModelSpec
from .embeddings import attach_embedder
from .generation import Generation, free_generation, takes_disk
from .residency import Residency, estimate_nbytes

if TYPE_CHECKING:
    from .hub import Hub

log = logging.getLogger("frink_mlx.hub")

ROOM_POLL_S = 0.05
ROOM_RETRY_AFTER_S = 5.0


def memory_budget(config: HubConfig, backend: Backend) -> int:
    """Rule 1, in bytes."""
    budget = config.budget
    total = budget.kv_budget_bytes or backend.memory_budget().nbytes
    return int(total - budget.memory_headroom_fraction * total)


def keep_alive_of(spec: ModelSpec, config: HubConfig) -> float | None:
    """Rule 3."""
    return spec.keep_alive if spec.keep_alive is not None else config.keep_alive_s


def over_count(residency: Residency, newcomer: Generation) -> list[Generation]:
    """residency rule 5 / hub rule 2: the LRU generations beyond max_resident_models
    (never the newcomer, never a pinned one), retired whether or not they are busy."""
    if not residency.max_models:
        return []
    extra = len(residency.residents) - residency.max_models
    old = [r.gen for r in residency.residents.values()
           if r.gen is not newcomer and not r.pinned]
    return old[:max(0, extra)]


async def _wait_min_lifetime(residency: Residency, min_generation_s: float) -> None:
    """Hub rule 2: the generations the count cap will replace live min_generation_s."""
    if not residency.max_models:
        return
    extra = len(residency.residents) + 1 - residency.max_models
    doomed = [r.gen for r in residency.residents.values() if not r.pinned][:max(0, extra)]
    left = max((g.created_at + min_generation_s - time.monotonic() for g in doomed), default=0)
    if left > 0:
        await anyio.sleep(left)


def over_budget(hub: "Hub", newcomer: Generation) -> list[Generation]:
    """Rule 4: idle LRU generations to retire so the resident set fits its budget again."""
    residency = hub.residency
    if residency.free_bytes() >= 0:
        return []
    victims = residency.victims(0, lambda g: g is newcomer or hub.busy(g))
    if victims is None:
        log.warning("resident models hold %d bytes, over the budget of %d: %s",
                    residency.held_bytes(), residency.budget_bytes, residency.blockers(hub.busy))
        return []
    return victims


def reap_interval_s(residency: Residency, config: HubConfig) -> float:
    """How often the idle reaper looks: a quarter of the shortest keep-alive, in [0.05,
    0.25] (a model loaded later may bring a shorter one)."""
    alives = [r.keep_alive_s for r in residency.residents.values()
              if r.keep_alive_s is not None and r.keep_alive_s > 0]
    if config.keep_alive_s:
        alives.append(config.keep_alive_s)
    return max(0.05, min([0.25, *(k / 4 for k in alives)]))


async def make_room(hub: "Hub", spec: ModelSpec) -> None:
    """Rule 2: evict LRU idle generations until `spec` fits, or raise."""
    residency, config = hub.residency, hub.config
    need = estimate_nbytes(spec, hub.registry) // max(1, int(getattr(hub.factory, "shards", 1)))
    residency.check_fits_alone(spec, need)
    await _wait_min_lifetime(residency, config.min_generation_s)
    deadline = time.monotonic() + config.evict_wait_s
    while True:
        victims = residency.victims(need, hub.busy, config.min_generation_s)
        if victims is not None:
            break
        if time.monotonic() >= deadline:
            raise Unavailable(
                f"No room to load '{spec.name}': it needs about {need} bytes, "
                f"{residency.free_bytes()} of {residency.budget_bytes} are free, and the "
                f"memory is held by {residency.blockers(hub.busy)}; retry when one is idle.",
                code="insufficient_memory", retry_after_s=ROOM_RETRY_AFTER_S)
        await anyio.sleep(ROOM_POLL_S)
    if _evict(hub, victims):
        await hub.wait_freed()


def _evict(hub: "Hub", victims: list[Generation]) -> int:
    """Retire `victims`, emptying the list, so the waiting caller holds none of them
    (serving/release.py waits until each is gone)."""
    count = len(victims)
    while victims:
        hub._retire(victims.pop(0))
    return count


def build_resident(hub: "Hub", spec: ModelSpec, number: int, progress: Progress) -> Generation:
    """The hub's factory (with the entry's draft model, registry rule 10) + the embedder
    serving /v1/embeddings (side-car, self or the encoder), its KV pool planned against
    what the resident models hold (residency.py rule 2). Blocking: the hub runs it in a
    worker thread."""
    config = hub.config
    budget = msgspec.structs.replace(config.budget, reserved_bytes=hub.residency.held_bytes())
    with reporting(progress):  # hub rule 3: the loaders report into it from this thread
        extra: dict[str, Any] = {"draft": hub.registry.resolve(spec.draft)} if spec.draft else {}
        if hub.disk is not None and takes_disk(hub.factory):
            extra["disk"] = hub.disk
        gen = hub.factory(spec, msgspec.structs.replace(config, budget=budget), number, hub.gate,
                          hub.backend, **extra)
        try:
            return attach_embedder(gen, hub.registry, config.load, hub.backend)
        except BaseException:
            free_generation(gen, config.drain_timeout_s)
            raise


def set_keep_alive(hub: "Hub", gen: Generation, keep_alive_s: float | None) -> None:
    """A request's keep-alive for `gen`: seconds idle before eviction, 0 = as soon as it
    is idle, negative = pinned; None = back to the entry's (rule 3)."""
    resident = hub.residency.get(gen)
    if resident is not None:
        resident.keep_alive_s = (keep_alive_s if keep_alive_s is not None
                                 else keep_alive_of(gen.spec, hub.config))


async def reap_idle(hub: "Hub") -> None:
    """Hub rule 6: retire residents idle past their keep-alive; when the last one goes the
    hub sleeps (its next request, or "default", loads it again)."""
    while True:
        await anyio.sleep(reap_interval_s(hub.residency, hub.config))
        if not hub._swap_lock.locked():
            _reap_once(hub)


def _reap_once(hub: "Hub") -> None:
    """One look, in a frame of its own: no loop variable keeps a retired generation
    alive across the reaper's sleep (serving/release.py)."""
    for gen in hub.residency.expired(hub.busy):
        log.info("generation %d: %s idle past its keep-alive, unloading", gen.number, gen.name)
        hub._retire(gen)
        if not hub.residency.residents:
            hub.sleeping = gen.spec


def model_states(hub: "Hub") -> dict[str, dict[str, Any]]:
    """For /health, /v1/models and /admin/models: each registry entry's residency.

    state: resident | loading | available | unavailable (its source is missing);
    bytes held, KV blocks (reserved, in use), last used (unix s), leases, keep-alive
    -- null where the model is not resident (honest nulls: not measured)."""
    states: dict[str, dict[str, Any]] = {}
    now_unix, now = time.time(), time.monotonic()
    for spec in hub.registry.entries.values():
        resident = next((r for r in hub.residency.residents.values()
                         if r.gen.spec.name == spec.name), None)
        problem = hub.registry.problem(spec)
        state = ("resident" if resident is not None else
                 "loading" if hub.loading == spec.name else
                 "unavailable" if problem is not None else "available")
        entry: dict[str, Any] = {"state": state, "bytes": None, "kv_blocks": None,
                                 "kv_blocks_used": None, "last_used": None, "leases": 0,
                                 "keep_alive_s": keep_alive_of(spec, hub.config),
                                 "pinned": (keep_alive_of(spec, hub.config) or 0) < 0,
                                 "generation": None}
        if resident is not None:
            gen = resident.gen
            engine = gen.engine
            stats = engine.stats() if engine is not None and hasattr(engine, "stats") else None
            entry.update(bytes=resident.nbytes, generation=gen.number,
                         kv_blocks=gen.plan.num_blocks if gen.plan is not None else None,
                         kv_blocks_used=getattr(stats, "num_blocks_used", None),
                         last_used=round(now_unix - (now - resident.last_used), 3),
                         leases=hub.num_leases(gen), keep_alive_s=resident.keep_alive_s,
                         pinned=resident.pinned)
        states[spec.name] = entry
    return states


def memory_report(hub: "Hub") -> dict[str, int]:
    """The resident set's totals: budget, held (the sum of each generation's bytes), free."""
    residency = hub.residency
    return {"budget_bytes": residency.budget_bytes, "held_bytes": residency.held_bytes(),
            "free_bytes": residency.free_bytes(), "num_resident": len(residency.residents)}
