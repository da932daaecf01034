"""create_app(settings) -> the Starlette app: routes, middleware, lifespan, the Frontend.

One route list serves the real server and the tests: every adapter module
exports `routes`, and `route_list()` concatenates them in ROUTE_MODULES order
(openai incl. responses, anthropic, llamacpp, ollama, embeddings, admin, the status
page and its JSON, metrics). The
lifespan builds everything (no module-level runtime state): the registry, the
hub, the metrics, and -- unless told not to -- the default model's generation.
This is the composition root: the only place below the CLI that reads
`Settings`; every layer beneath gets its slice (config.py).

The lifespan builds the one `Frontend` (serving/frontend.py) adapters call,
through `frontend(request)` (http/frontend.py); the metrics and the status
page's ring of recent requests sit beside it on the app (metrics_of,
recent_requests_of), being the HTTP edge's, not the serving layer's.

Rules:
1. `create_app(..., background_load=True)` (the daemon) starts the default
   model's load as the lifespan starts and does not wait for it: the socket
   answers /health ("loading", with progress) at once and generation routes
   503 + Retry-After until the model is in (hub rule 1). `Frontend.startup`
   is that load, which the server watches for its ready line or its refusal.
2. SIGTERM drains through `Frontend.drain` (serving/frontend.py rule 2).
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import asynccontextmanager
from types import ModuleType
from typing import TYPE_CHECKING, AsyncIterator

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from . import metrics as metrics_module
from .adapters import admin, anthropic, llamacpp, ollama, openai, page, status
from .adapters.openai import embeddings as openai_embeddings
from .backend import Backend, select_backend
from .errors import FrinkError, InvalidRequest, NotFound
from .http import security
from .http.access import RecentRequests, track_run
from .http.fields import IgnoredFieldsHeader
from .http.frontend import attach
from .metrics import Metrics
from .models.sources import source_checker
from .registry import Registry, load_registry
from .serving.frontend import Frontend
from .serving.generation import Generation, GenerationFactory, build_generation
from .serving.hub import Hub
from .settings import Settings

if TYPE_CHECKING:
    from .engine.channel import PlanChannel

log = logging.getLogger("frink_mlx.app")

# Modules whose `routes` are mounted, in order.
ROUTE_MODULES: tuple[ModuleType, ...] = (
    openai, anthropic, llamacpp, ollama, openai_embeddings, admin, status, page, metrics_module,
)


def route_list() -> list[BaseRoute]:
    return [route for module in ROUTE_MODULES for route in module.routes]


def middleware_list(settings: Settings) -> list[Middleware]:
    return [*security.build_middleware(settings), Middleware(IgnoredFieldsHeader)]


def _on_load(metrics: Metrics, gen: Generation) -> None:
    metrics.observe_model_load(gen.name, gen.number, float(gen.loaded.load_time_s))


async def _load_default(hub: Hub) -> None:
    """Rule 1's start-up load, then each `preload = true` entry next to it (registry rule
    8); returns nothing, so the task kept in Frontend.startup does not keep the first
    generation alive after a swap (hub rule 4). A preload that fails is logged and kept in
    the hub's `last_error`; the default model serves on."""
    await hub.load(None)
    default = hub.registry.resolve(None).name
    for spec in hub.registry.entries.values():
        if spec.preload and spec.name != default:
            try:
                await hub.load(spec.name)
            except Exception as exc:  # noqa: BLE001 - rule 1: the default serves regardless
                log.warning("preloading %s failed: %s", spec.name, exc)


def create_app(settings: Settings, *, registry: Registry | None = None, load_default: bool = True,
               factory: GenerationFactory | None = None, backend: Backend | None = None,
               background_load: bool = False, cluster: PlanChannel | None = None) -> Starlette:
    """The daemon app. `factory` replaces model loading (tests only); `backend` is
    the entry point's choice (cli/serve.py), else chosen here, once per app;
    `background_load`: rule 1 (the lifespan does not wait for the default model)."""
    chosen = backend if backend is not None else select_backend(settings.backend_config())

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        reg = registry if registry is not None else load_registry(settings)
        if registry is None:  # registry rule 5, Hub and Ollama entries included
            reg.source_check = source_checker(settings.load_config())
        hub = Hub(settings.hub_config(), reg, backend=chosen, factory=factory or build_generation)
        front = Frontend(settings.frontend_config(), reg, hub, cluster=cluster,
                         on_run=track_run)
        metrics = Metrics(stats_fn=front.engine_stats_by_model, disk_fn=front.disk_stats)
        hub.on_load = lambda gen: _on_load(metrics, gen)
        attach(app, front)
        app.state.metrics, app.state.recent_requests = metrics, RecentRequests()
        if load_default:
            front.startup = asyncio.get_running_loop().create_task(_load_default(hub))
            if not background_load:
                await asyncio.shield(front.startup)
        reaper = asyncio.get_running_loop().create_task(hub.reap_idle())
        try:
            yield
        finally:
            reaper.cancel()
            await hub.shutdown()

    return Starlette(routes=route_list(), middleware=middleware_list(settings), lifespan=lifespan,
                     exception_handlers={404: _no_route, 405: _no_route})


async def _no_route(request: Request, exc: Exception) -> Response:
    """An unknown path or method, in the envelope its protocol's clients parse (not text)."""
    status = getattr(exc, "status_code", 404)
    error: FrinkError = NotFound(f"No route for {request.method} {request.url.path}.")
    if status == 405:
        error = InvalidRequest(f"{request.method} is not allowed on {request.url.path}.",
                               code="method_not_allowed")
        error.status = 405
    response = security.envelope_for_path(request.url.path)(error)
    response.headers.update(getattr(exc, "headers", None) or {})   # 405's Allow
    return response
