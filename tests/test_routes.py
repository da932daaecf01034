"""The daemon's public HTTP surface, pinned: one route list for the server and the tests."""

from __future__ import annotations

from frink_mlx.app import create_app, route_list
from frink_mlx.settings import Settings

REQUIRED = {
    ("GET", "/health"), ("GET", "/v1/models"), ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"), ("GET", "/admin/models"), ("POST", "/admin/models/load"),
    ("POST", "/admin/models/unload"),
}


def methods_and_paths(routes) -> set[tuple[str, str]]:
    return {(m, r.path) for r in routes for m in (getattr(r, "methods", None) or ())}


def test_required_routes_are_mounted_once():
    routes = route_list()
    pairs = methods_and_paths(routes)
    assert REQUIRED <= pairs
    paths = [(tuple(sorted(getattr(r, "methods", ()) or ())), r.path) for r in routes]
    assert len(paths) == len(set(paths)), "a route is mounted twice"


def test_app_serves_exactly_the_route_list():
    app = create_app(Settings.load(access_log=False), load_default=False)
    assert methods_and_paths(app.routes) == methods_and_paths(route_list())
