"""What the hub holds, as the status routes show it: read-only views, no policy.

Why a module of its own: /health, /v1/models, /api/ps and /admin/models all
describe the resident set, and none of them may change it. These functions
only read the hub (hub.py) and its resident set (residency.py); the hub never
imports them, so the views can grow without the hub growing.

Honest nulls: a figure that is not measured (a model not resident has no
bytes, no KV blocks, no last use) is null, never 0.
"""

from __future__ import annotations

import time
from typing import Any

from .hub import Hub
from .residency import keep_alive_of


def model_states(hub: Hub) -> dict[str, dict[str, Any]]:
    """For /health, /v1/models and /admin/models: each registry entry's residency.

    state: resident | loading | available | unavailable (its source is missing);
    bytes held, KV blocks (reserved, in use), last used (unix s), leases, keep-alive
    -- null where the model is not resident."""
    states: dict[str, dict[str, Any]] = {}
    now_unix, now = time.time(), time.monotonic()
    for spec in hub.registry.entries.values():
        resident = next((r for r in hub.residency.residents.values()
                         if r.gen.spec.name == spec.name), None)
        problem = hub.registry.problem(spec)
        state = ("resident" if resident is not None else
                 "loading" if hub.loading == spec.name else
                 "unavailable" if problem is not None else "available")
        keep_alive_s = keep_alive_of(spec, hub.config)
        entry: dict[str, Any] = {"state": state, "bytes": None, "kv_blocks": None,
                                 "kv_blocks_used": None, "last_used": None, "leases": 0,
                                 "keep_alive_s": keep_alive_s,
                                 "pinned": (keep_alive_s or 0) < 0, "generation": None}
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


def memory_report(hub: Hub) -> dict[str, int]:
    """The resident set's totals: budget, held (the sum of each generation's bytes), free."""
    residency = hub.residency
    return {"budget_bytes": residency.budget_bytes, "held_bytes": residency.held_bytes(),
            "free_bytes": residency.free_bytes(), "num_resident": len(residency.residents)}
