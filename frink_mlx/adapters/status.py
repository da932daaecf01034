"""GET /admin/status: everything the status page shows, in one JSON object.

Why one endpoint: the page (adapters/page.py) polls every second; one request
per poll keeps it cheap and every number from the same instant. /health stays
the small open probe; this answer names models, sources and recent requests,
so it sits behind the API key like the rest of /admin (http/security.py) and,
like /health, outside the in-flight bound, so a flooded daemon can still say
why it is slow.

Pure translation of what the hub, the engine stats, the access ring and the
backend report (the hub's Backend object); nothing here imports MLX.

Rules:
1. Honest nulls: a number not measured (no model loaded, a counter this MLX
   lacks) is null, never 0.
2. Each registry entry has one `state`:
     resident     the active generation (or the encoder it carries as side-car)
     loading      being loaded now; `loading_s` is how long it has been, `progress`
                  the load's phase and bytes (models/progress.py rule 3: a download
                  has a fraction, other phases only their elapsed time)
     draining     retired, finishing requests it had started
     available    not loaded, its source is there (the next request may load it;
                  `reason` says when it was unloaded for idleness)
     unavailable  its source is missing or its last load failed; `reason` says why
3. Counters (`prompt_tokens_total`, `generated_tokens_total`, ...) are the
   current generation's engine counters: they restart at 0 with each
   generation, so a rate is taken between two polls of the same `generation`.
   `prefix_hit_rate` = prefix-cache hit tokens / prompt tokens, over that
   generation; null before its first prompt.
4. `recent` is the access ring (http/access.py rule 5), oldest first; `seq`
   grows by one per record, so a poller knows which records it has not seen.
5. `kv_disk` is the prefix cache's SSD tier as /health reports it (admin.py
   `disk_report`; null when not configured); `disk_hit_tokens_total` counts
   the current generation's prefix hits read back from it (null without it).
6. Each model's `vision` says whether it reads image parts (the playground
   then takes a pasted or dropped image): `Frontend.model_facts`, null when
   not known until it is loaded.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import __version__
from ..backend.info import DeviceFacts
from ..http.access import AccessRecord, RecentRequests, recent_requests_of
from ..http.errors import endpoint, openai_error
from ..http.frontend import frontend
from .admin import disk_report
from .endpoint import json_response
from .openai.models import context_length_of

if TYPE_CHECKING:  # types only: importing the serving layer would pull in MLX
    from ..engine.types import EngineStats
    from ..registry import ModelSpec, Registry
    from ..serving.frontend import Frontend
    from ..serving.generation import Generation
    from ..serving.hub import Hub


class ModelState(msgspec.Struct):
    name: str
    kind: str
    aliases: list[str]
    default: bool
    state: str                      # rule 2
    reason: str | None = None
    generation: int | None = None
    loading_s: float | None = None
    progress: dict[str, Any] | None = None
    vision: bool | None = None      # rule 6


class Backend(msgspec.Struct):
    name: str                       # "Metal" | "CUDA" | "CPU"
    device: str


class Memory(msgspec.Struct):
    held_bytes: int | None          # MLX allocator: what arrays hold now
    peak_bytes: int | None
    cache_bytes: int | None         # freed buffers MLX keeps for reuse
    budget_bytes: int | None        # the device budget the KV plan started from
    budget_source: str | None       # "override" | "metal" | "ram"
    weights_bytes: int | None
    kv_pool_bytes: int | None


class Kv(msgspec.Struct):
    blocks_total: int
    blocks_used: int
    blocks_cached: int
    block_size: int


class Counters(msgspec.Struct):
    prompt_tokens_total: int
    prefix_hit_tokens_total: int
    generated_tokens_total: int
    steps_total: int
    prefix_hit_rate: float | None
    disk_hit_tokens_total: int | None = None   # rule 5


class Status(msgspec.Struct):
    version: str
    uptime_s: float
    state: str                      # the hub's: ready | loading | idle | unavailable
    backend: Backend
    model: str | None
    generation: int | None
    models: list[ModelState]
    memory: Memory
    context_ceiling: int | None
    kv: Kv | None
    running: int | None
    queued: int | None
    counters: Counters | None
    recent: list[AccessRecord]
    kv_disk: dict[str, Any] | None = None     # rule 5


def model_states(hub: Hub, registry: Registry, now: float) -> list[ModelState]:
    """Rule 2 for every registry entry, in registry order."""
    return [ModelState(name=spec.name, kind=spec.kind, aliases=list(spec.aliases),
                       default=spec.name == registry.default,
                       **_state_of(hub, registry, spec, now))
            for spec in registry.entries.values()]


def _state_of(hub: Hub, registry: Registry, spec: ModelSpec, now: float) -> dict[str, Any]:
    for gen in hub.resident:  # several models may be resident (serving/residency.py)
        if gen.spec.name == spec.name:
            return {"state": "resident", "generation": gen.number}
    for gen in hub.resident:
        if gen.embedder is not None and gen.spec.embeddings == spec.name:
            return {"state": "resident", "generation": gen.number,
                    "reason": f"side-car encoder of {gen.spec.name}"}
    if hub.loading == spec.name:
        since = hub.loading_since
        progress = hub.load_progress.snapshot() if hub.load_progress is not None else None
        return {"state": "loading", "loading_s": None if since is None else round(now - since, 1),
                "progress": progress}
    draining = [g.number for g in hub.retired if g.spec.name == spec.name]
    if draining:
        return {"state": "draining", "generation": draining[-1]}
    failed = hub.last_error
    if failed is not None and failed.get("model") == spec.name:
        return {"state": "unavailable", "reason": f"last load failed: {failed.get('message')}"}
    problem = registry.problem(spec)  # registry rule 5, as /v1/models and requests see it
    if problem is not None:
        return {"state": "unavailable", "reason": problem}
    if hub.sleeping is not None and hub.sleeping.name == spec.name:
        return {"state": "available", "reason": "unloaded after idling; the next request loads it"}
    return {"state": "available"}


def _memory(gen: Generation | None, facts: DeviceFacts) -> Memory:
    plan = gen.plan if gen is not None else None
    return Memory(held_bytes=facts.active_bytes, peak_bytes=facts.peak_bytes,
                  cache_bytes=facts.cache_bytes,
                  budget_bytes=plan.budget_bytes if plan is not None else None,
                  budget_source=plan.budget_source if plan is not None else None,
                  weights_bytes=plan.weights_bytes if plan is not None else None,
                  kv_pool_bytes=plan.pool_bytes if plan is not None else None)


def _counters(stats: EngineStats) -> Counters:
    prompt = int(stats.prompt_tokens_total)
    hits = int(stats.prefix_hit_tokens_total)
    disk = stats.extra.get("disk_hit_tokens_total")
    return Counters(prompt_tokens_total=prompt, prefix_hit_tokens_total=hits,
                    generated_tokens_total=int(stats.generated_tokens_total),
                    steps_total=int(stats.steps_total),
                    prefix_hit_rate=round(hits / prompt, 4) if prompt else None,
                    disk_hit_tokens_total=int(disk) if disk is not None else None)


def collect(front: Frontend, recent: RecentRequests | None) -> Status:
    """The whole status (rules 1-4) of one Frontend and the app's request ring, read now."""
    hub, gen = front.hub, front.hub.current
    stats = front.engine_stats()
    device = hub.backend.device_facts()
    kv = None if stats is None else Kv(
        blocks_total=stats.num_blocks_total, blocks_used=stats.num_blocks_used,
        blocks_cached=stats.num_blocks_cached, block_size=stats.block_size)
    return Status(
        version=__version__, uptime_s=round(front.uptime_s, 3), state=hub.state,
        backend=Backend(name=device.name, device=device.device),
        model=gen.spec.name if gen else None, generation=gen.number if gen else None,
        models=[msgspec.structs.replace(m, vision=front.model_facts(m.name)["vision"])
                for m in model_states(hub, front.registry, time.monotonic())],
        memory=_memory(gen, device),
        context_ceiling=context_length_of(gen), kv=kv,
        running=stats.num_running if stats else None,
        queued=stats.num_waiting if stats else None,
        counters=_counters(stats) if stats is not None else None,
        recent=recent.snapshot() if recent is not None else [],
        kv_disk=disk_report(front.disk_stats()))


@endpoint(openai_error)
async def status(request: Request) -> Response:
    body = collect(frontend(request), recent_requests_of(request.app))
    return json_response(body, headers={"Cache-Control": "no-store"})


routes: list[BaseRoute] = [Route("/admin/status", status, methods=["GET"])]
