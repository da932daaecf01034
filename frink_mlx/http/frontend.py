"""`frontend(request)`: the one way from an HTTP request to the serving layer.

Why: Starlette's `app.state` is an untyped bag; a route that read it by name
was typed `Any` from there on, and neither mypy nor a reader could follow a
request past that point. Every adapter and http/ module asks here instead and
gets the typed `Frontend` (serving/frontend.py), as vLLM's routes ask
`engine_client(request)`.

Rules:
1. The composition root attaches the app's one Frontend in its lifespan
   (`attach`); nothing else writes it and nothing in adapters/ reads
   `app.state` (tests/test_layering.py).
2. This module imports no serving code at run time (adapters import no MLX):
   the type is for mypy only.
3. Before the lifespan has run there is no Frontend: `frontend_of(app)` says
   None (middleware falls back to its defaults); `frontend(request)` is only
   called by routes, which run after it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

from starlette.applications import Starlette
from starlette.requests import HTTPConnection

if TYPE_CHECKING:
    from ..serving.frontend import Frontend

_KEY = "frink"  # the attribute of `app.state` (tests reach it as app.state.frink)


def attach(app: Starlette, front: Frontend) -> None:
    """Rule 1: the lifespan's one write."""
    setattr(app.state, _KEY, front)


def frontend_of(app: object) -> Frontend | None:
    """The app's Frontend, or None before start-up (rule 3)."""
    return cast("Frontend | None", getattr(getattr(app, "state", None), _KEY, None))


def frontend(request: HTTPConnection) -> Frontend:
    """The Frontend serving `request` (rule 1)."""
    front = frontend_of(request.app)
    if front is None:
        raise RuntimeError("no Frontend attached: the app's lifespan has not run")
    return front
