"""GET /health and the model admin routes.

    GET  /health               state ready/loading/idle/unavailable/draining, model,
                               generation, uptime, context ceiling, KV blocks, queue, the
                               running load's `progress`, the SSD tier (`kv_disk`: on,
                               bytes, files, hits, reads, writes; null when not
                               configured); 503 + Retry-After when nothing is
                               loaded and no request would load one (idle -> 200), while the
                               first model loads, while draining, and when the distributed
                               group is lost (`reason` says why; `ranks` is the group size on
                               rank 0 of a group). Answers at once, even while a model loads
                               (the load runs in a worker thread).
    GET  /admin/models         resident generations, the default one (`active`), load in
                               progress (and its progress), last load error, retired
                               generations still draining, how many freed ones are still
                               handing memory back (`releasing`), the numbers of freed ones
                               something still references (`lingering`, serving/release.py
                               rule 3), the registry
                               (each entry `available`, or its `unavailable` reason)
    POST /admin/models/load    {"model": NAME, "wait": false} -> 202 (background) / 200
                               (wait); 409 while another load runs
    POST /admin/models/unload  {"model": NAME} retires that model (the hub stays open); no
                               body (or no model) retires every resident one and parks:
                               requests get 503 until a load
    Every model is listed with its residency (serving/report.py `model_states`): state
    resident/loading/available/unavailable, bytes, KV blocks, last used, leases,
    keep-alive; `memory` gives the budget, the bytes held (the sum) and free.

Health numbers follow the honest-null rule: absent means not measured.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from .. import __version__
from ..http.body import decode_body, decode_struct, read_body
from ..http.errors import endpoint, openai_error
from ..http.frontend import frontend
from .endpoint import json_response
from .openai.models import availability, context_length_of

if TYPE_CHECKING:
    from ..engine.kv.disk import DiskStats
    from ..serving.generation import Generation
    from ..serving.hub import Hub


class LoadBody(msgspec.Struct, forbid_unknown_fields=True):
    model: str
    wait: bool = False


class UnloadBody(msgspec.Struct, forbid_unknown_fields=True):
    model: str | None = None  # None: every resident model, and the hub parks


def generation_info(hub: Hub, gen: Generation) -> dict[str, Any]:
    return {"model": gen.spec.name, "generation": gen.number, "kind": gen.spec.kind,
            "context_length": context_length_of(gen), "loaded_at": gen.created_unix,
            "leases": hub.num_leases(gen),
            "load_time_s": getattr(gen.loaded, "load_time_s", None)}


def load_progress(hub: Hub) -> dict[str, Any] | None:
    """The running load's snapshot (serving/hub.py rule 3); None when none runs."""
    progress = getattr(hub, "load_progress", None)
    return progress.snapshot() if progress is not None else None


def _kv(stats: Any) -> dict[str, Any] | None:
    if stats is None:
        return None
    kv = {"blocks_total": stats.num_blocks_total, "blocks_used": stats.num_blocks_used,
          "blocks_cached": stats.num_blocks_cached, "block_size": stats.block_size}
    if getattr(stats, "state_slots_total", None) is not None:  # recurrent layers (engine/kv/slots.py)
        kv["state_slots_total"] = stats.state_slots_total
        kv["state_slots_used"] = stats.state_slots_used
    extra = getattr(stats, "extra", None) or {}
    if "state_snapshots_total" in extra:  # their snapshots (engine/kv/snapshots.py)
        kv["state_snapshots_total"] = int(extra["state_snapshots_total"])
        kv["state_snapshots_used"] = int(extra["state_snapshots_used"])
    if getattr(stats, "window_tokens", None) is not None:  # per kind (engine/kv/window.py)
        kv["kinds"] = {"full": {"blocks_used": stats.num_blocks_used},
                       "sliding": {"window": stats.window_tokens,
                                   "blocks_total": stats.window_blocks_total,
                                   "blocks_used": stats.window_blocks_used}}
    return kv


def disk_report(stats: DiskStats | None) -> dict[str, Any] | None:
    """The SSD tier of the prefix cache (engine/kv/disk.py DiskStats), for /health and
    the status page."""
    if stats is None:
        return None
    return {"enabled": stats.enabled, "error": stats.error, "directory": stats.directory,
            "bytes": stats.used_bytes, "budget_bytes": stats.budget_bytes,
            "files": stats.num_files, "reads": stats.read_requests_total,
            "hit_blocks": stats.hit_blocks_total, "written_blocks": stats.written_blocks_total,
            "dropped_blocks": stats.dropped_blocks_total,
            "refused_files": stats.refused_files_total,
            "evicted_files": stats.evicted_files_total}


async def health(request: Request) -> Response:
    front = frontend(request)
    hub, gen = front.hub, front.hub.current
    stats = front.engine_stats()
    body: dict[str, Any] = {
        "state": hub.state, "version": __version__, "uptime_s": round(front.uptime_s, 3),
        "model": gen.spec.name if gen else None, "generation": gen.number if gen else None,
        "loading": hub.loading, "progress": load_progress(hub),
        "context_ceiling": context_length_of(gen),
        "kv": _kv(stats), "queue_depth": stats.num_waiting if stats else None,
        "running": stats.num_running if stats else None,
        "models": front.model_states(), "memory": front.memory_report(),
        "kv_disk": disk_report(front.disk_stats()),
    }
    serving = hub.state in ("ready", "idle")  # idle: the next request reloads it
    lost = front.cluster_lost
    if lost is not None:  # distributed group lost (engine/channel.py): nothing can generate
        body["state"], body["reason"], serving = "unavailable", f"distributed group lost: {lost}", False
    if front.cluster is not None:
        body["ranks"] = front.cluster.group.size
    if hub.sleeping is not None:
        body["sleeping"] = hub.sleeping.name
    headers = None if serving else {"Retry-After": "2" if hub.loading else "10"}
    return json_response(body, 200 if serving else 503, headers)


@endpoint(openai_error)
async def list_admin_models(request: Request) -> Response:
    front = frontend(request)
    hub = front.hub
    states = front.model_states()
    entries = [{"name": s.name, "kind": s.kind, "aliases": list(s.aliases), "source": s.source,
                "loaded": states[s.name]["state"] == "resident", "residency": states[s.name],
                "description": s.description, **availability(front.registry, s)}
               for s in front.registry.entries.values()]
    return json_response({
        "state": hub.state, "parked": hub.parked, "auto_swap": front.config.auto_swap,
        "active": generation_info(hub, hub.current) if hub.current else None,
        "resident": [generation_info(hub, g) for g in hub.resident],
        "memory": front.memory_report(),
        "loading": hub.loading, "progress": load_progress(hub), "last_error": hub.last_error,
        "retired": [generation_info(hub, g) for g in hub.retired],
        "releasing": hub.releasing, "lingering": hub.lingering,
        "default": front.registry.default, "models": entries,
    })


@endpoint(openai_error)
async def load_model(request: Request) -> Response:
    front = frontend(request)
    body = await decode_body(request, LoadBody)
    task = front.hub.begin_load(body.model)  # raises 404 / 409 now
    if not body.wait:
        return json_response({"status": "loading", "model": front.hub.loading,
                              "requested_at": time.time()}, status=202)
    gen = await task
    return json_response({"status": "loaded", **generation_info(front.hub, gen)})


@endpoint(openai_error)
async def unload_model(request: Request) -> Response:
    front = frontend(request)
    raw = await read_body(request)
    body = decode_struct(raw, UnloadBody) if raw.strip() else UnloadBody()
    old = await front.hub.unload(body.model)
    return json_response({"status": "unloaded", "model": old.spec.name if old else None,
                          "generation": old.number if old else None})


routes: list[BaseRoute] = [
    Route("/health", health, methods=["GET"]),
    Route("/v1/health", health, methods=["GET"]),   # llama-server's alias
    Route("/admin/models", list_admin_models, methods=["GET"]),
    Route("/admin/models/load", load_model, methods=["POST"]),
    Route("/admin/models/unload", unload_model, methods=["POST"]),
]
