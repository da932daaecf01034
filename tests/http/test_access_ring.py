"""The access ring the status page shows (http/access.py rule 5): bounded, ordered,
numbered, and blind to the page's own polling."""

from __future__ import annotations

from typing import Any

from frink_mlx.app import route_list
from frink_mlx.http.access import QUIET_ROUTES, RecentRequests


def line(route: str, status: int = 200, **kw: Any) -> dict[str, Any]:
    fields = {"id": "req_1", "method": "POST", "route": route, "path": route, "status": status,
              "model": "tiny", "generation": 1, "prompt_tokens": 3, "completion_tokens": 4,
              "cached_tokens": 0, "ttft_ms": 1.5, "duration_ms": 9.0}
    return {**fields, **kw}


def test_ring_keeps_the_newest_records_in_order() -> None:
    ring = RecentRequests(capacity=3)
    for i in range(5):
        ring.add(line("/v1/chat/completions", completion_tokens=i))
    records = ring.snapshot()
    assert [r.completion_tokens for r in records] == [2, 3, 4]
    assert [r.seq for r in records] == [3, 4, 5]
    assert records[-1].route == "/v1/chat/completions" and records[-1].ttft_ms == 1.5
    assert records[0].at_unix <= records[-1].at_unix


def test_quiet_routes_are_left_out() -> None:
    ring = RecentRequests()
    for route in sorted(QUIET_ROUTES):
        ring.add(line(route, method="GET"))
    ring.add(line("<unmatched>", status=404))
    assert [(r.route, r.status, r.seq) for r in ring.snapshot()] == [("<unmatched>", 404, 1)]


def test_every_quiet_route_is_a_mounted_route() -> None:
    mounted = {getattr(r, "path", None) for r in route_list()}
    assert QUIET_ROUTES <= mounted
