"""create_app(settings) -> the Starlette app: routes, middleware, lifespan, AppState.

One route list serves the real server and the tests: every adapter module
exports `routes`, and `route_list()` concatenates them in ROUTE_MODULES order
(openai incl. responses, anthropic, llamacpp, ollama, embeddings, admin, the status
page and its JSON, metrics). The
lifespan builds everything (no module-level runtime state): the registry, the
hub, the metrics, and -- unless told not to -- the default model's generation.
This is the composition root: the only place below the CLI that reads
`Settings`; every layer beneath gets its slice (config.py).

`AppState` is the one thing adapters call: `generate()` leases a generation,
takes its decode handles, renders and tokenizes, compiles any grammar, and
submits, raising `FrinkError`s before a single byte of the answer is sent.

Rules:
1. `create_app(..., background_load=True)` (the daemon) starts the default
   model's load as the lifespan starts and does not wait for it: the socket
   answers /health ("loading", with progress) at once and generation routes
   503 + Retry-After until the model is in (hub rule 1). `AppState.startup`
   is that load, which the server watches for its ready line or its refusal.
2. `drain(timeout_s)` (SIGTERM): the hub refuses new work (503 + Retry-After
   in each protocol's envelope, hub rule 7) while the listener stays open;
   runs in flight finish up to `timeout_s`; any still going is cut with an
   error event (handles rule 11), so every stream ends on its protocol's
   terminal frame.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, AsyncIterator

import anyio
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute

from . import metrics as metrics_module
from .adapters import admin, anthropic, llamacpp, ollama, openai, page, status
from .adapters.openai import embeddings as openai_embeddings
from .backend import Backend, select_backend
from .config import ImageLimits
from .core.checks import check_request
from .core.offload import Offload, input_chars
from .core.prompt import check_token_ids, encode_text
from .core.request import GenRequest
from .engine import constraints
from .engine.constraints import GrammarCompiler
from .engine.kv.disk import DiskStats
from .engine.types import EngineStats
from .errors import FrinkError, InvalidRequest, NotFound, Unavailable, UnsupportedField
from .http import security
from .http.access import RecentRequests, track_run
from .http.fields import IgnoredFieldsHeader
from .metrics import Metrics
from .models.encoder import Encoder
from .models.sources import source_checker
from .registry import Registry, load_registry
from .serving import embeddings, report
from .serving.embeddings import EmbedResult
from .serving.generation import Generation, GenerationFactory, build_generation
from .serving.handles import DecodeHandles, Prepared, Run, TurnMemory
from .serving.hub import DRAIN_RETRY_AFTER_S, Hub
from .settings import Settings

log = logging.getLogger("frink_mlx.app")

# Modules whose `routes` are mounted, in order.
ROUTE_MODULES: tuple[ModuleType, ...] = (
    openai, anthropic, llamacpp, ollama, openai_embeddings, admin, status, page, metrics_module,
)


def route_list() -> list[BaseRoute]:
    return [route for module in ROUTE_MODULES for route in module.routes]


def middleware_list(settings: Settings) -> list[Middleware]:
    return [*security.build_middleware(settings), Middleware(IgnoredFieldsHeader)]


@dataclass
class AppState:
    """What every route reaches through `request.app.state.frink`."""

    settings: Settings
    registry: Registry
    hub: Hub
    started_at: float = field(default_factory=time.monotonic)
    metrics: Metrics | None = None
    cluster: Any = None  # engine/channel.py PlanChannel on rank 0 of a group; its `lost` reason
    startup: "asyncio.Task[None] | None" = None  # rule 1
    recent_requests: RecentRequests = field(default_factory=RecentRequests)  # the page's ring
    offload: Offload = field(default_factory=Offload)  # large inputs' CPU work (serving/offload.py)
    _compilers: dict[int, GrammarCompiler] = field(default_factory=dict)
    _memories: dict[int, TurnMemory] = field(default_factory=dict)
    _runs: list[Run] = field(default_factory=list)  # in flight, for the drain (rule 2)

    # --- generation ------------------------------------------------------------
    async def generate(self, req: GenRequest) -> Run:
        """Lease, render + tokenize, check the ceiling, compile, submit.

        Raises FrinkError before anything is sent; the Run owns the lease."""
        check_request(req, max_n=self.settings.max_batch)  # before any per-choice state
        self._refuse_encoder_target(req.model)
        self.check_cluster()
        lease = await self.hub.acquire(req.model)
        try:
            handles = DecodeHandles.take(lease.generation)
            prepared = await self._prepare(handles, req)
            constraints = await self._constraints(lease.generation, handles, prepared)
            run = handles.submit(prepared, lease, constraints, self._memory(lease.generation))
        except BaseException:
            lease.release()
            raise
        track_run(run)  # the access log and metrics report it, whichever protocol asked
        self._runs.append(run)
        run.on_close = self._forget_run  # a finished Run must not keep its generation alive
        await run.admitted()  # a queue timeout is a real 503 + Retry-After (handles rule 8)
        return run

    async def _prepare(self, handles: DecodeHandles, req: GenRequest) -> Prepared:
        """handles.prepare, with core/images.py rule 3 first; images decode off the loop."""
        if req.images and handles.vision is None and self.refuses_images(req.model):
            raise UnsupportedField(req.images[0].path, "is an image; the model reads text only "
                                   "(refuse_images is set for it)")
        if handles.vision is not None and req.images:   # serving/vision.py rule 5
            return await anyio.to_thread.run_sync(handles.prepare, req, self.image_limits)
        return await self.offload.run(input_chars(req), handles.prepare, req, self.image_limits)

    @property
    def image_limits(self) -> ImageLimits:
        return self.settings.image_limits()

    def refuses_images(self, model: str | None) -> bool:
        """core/images.py rule 3: the entry's `refuse_images` (registry rule 11), else the setting."""
        routed = self.registry.route(model)
        own = self.registry.resolve(routed).refuse_images if self.registry.knows(routed or "default") \
            else None
        return self.settings.refuse_images if own is None else own

    def _memory(self, gen: Generation) -> TurnMemory:
        """The turn memory of `gen` (one live generation's kept; rule 7 of handles.py)."""
        memory = self._memories.get(gen.number)
        if memory is None:
            memory = TurnMemory()
            self._memories = {**self._keep(self._memories), gen.number: memory}
        return memory

    def _keep(self, per_generation: dict[int, Any]) -> dict[int, Any]:
        """Only resident generations keep a grammar compiler and a turn memory."""
        resident = {g.number for g in self.hub.resident}
        return {n: v for n, v in per_generation.items() if n in resident}

    def _refuse_encoder_target(self, name: str | None) -> None:
        """Do not load or evict anything just to refuse the request."""
        name = self.registry.route(name)
        if any(gen.answers_to(name) for gen in self.hub.resident):
            return
        spec = self.registry.resolve(name)
        if spec.kind != "generative":
            raise InvalidRequest(
                f"The model '{spec.name}' is an embedding model (kind = \"{spec.kind}\") and "
                "cannot generate text; use /v1/embeddings with it.", param="model",
                code="model_not_generative")

    async def _constraints(self, gen: Generation, handles: DecodeHandles, prepared: Prepared
                           ) -> Any:
        compiler = self._compilers.get(gen.number)
        if compiler is None:
            vocab = int(gen.loaded.config.get("vocab_size") or len(handles.tokenizer))
            compiler = GrammarCompiler.for_tokenizer(handles.tokenizer, vocab_size=vocab)
            self._compilers = {**self._keep(self._compilers), gen.number: compiler}
        return await constraints.build_constraints(prepared.request, prepared.markup, compiler)

    async def count_tokens(self, req: GenRequest) -> int:
        async with self.hub.lease(req.model) as gen:
            handles = DecodeHandles.take(gen)
            if handles.vision is not None and req.images:   # serving/vision.py rule 5
                rendered = await anyio.to_thread.run_sync(handles.render_images, req,
                                                          self.image_limits)
                return len(rendered[0].ids)
            return len((await self.offload.run(input_chars(req), handles.render, req)).ids)

    async def eos_token_ids(self, model: str | None) -> list[int]:
        """The ids that end a generation on `model` (llama.cpp's `ignore_eos` bans them)."""
        async with self.hub.lease(model) as gen:
            return sorted(DecodeHandles.take(gen).eos_ids)

    async def render_text(self, req: GenRequest) -> str:
        """The prompt text `req` renders to on its model (chat template applied)."""
        async with self.hub.lease(req.model) as gen:
            rendered = await self.offload.run(input_chars(req), DecodeHandles.take(gen).render, req)
            return rendered.text or ""

    async def tokenize(self, model: str | None, text: str, *, add_special: bool) -> list[int]:
        async with self.hub.lease(model) as gen:
            encoder = _active_encoder(gen)  # an active encoder tokenizes with its own tokenizer
            if encoder is not None:
                return list(await self.offload.run(
                    len(text), lambda: encoder.tokenize_plain(text, add_special=add_special)))
            tokenizer = DecodeHandles.take(gen).tokenizer
            return await self.offload.run(len(text), _encode, tokenizer, text, add_special)

    async def token_pieces(self, model: str | None, ids: list[int]) -> list[str]:
        async with self.hub.lease(model) as gen:
            encoder = _active_encoder(gen)
            if encoder is not None:
                return list(await self.offload.run(len(ids), encoder.token_pieces,
                                                   _encoder_ids(encoder, ids)))
            handles = DecodeHandles.take(gen)
            check_token_ids(handles.tokenizer, ids, param="tokens")
            piece = handles.text.piece or (lambda i: handles.text.decode([i]))
            return await self.offload.run(len(ids), lambda: [piece(i) for i in ids])

    async def detokenize(self, model: str | None, ids: list[int]) -> str:
        async with self.hub.lease(model) as gen:
            encoder = _active_encoder(gen)
            if encoder is not None:
                return await self.offload.run(len(ids), encoder.detokenize,
                                              _encoder_ids(encoder, ids))
            handles = DecodeHandles.take(gen)
            checked = check_token_ids(handles.tokenizer, ids, param="tokens")
            return await self.offload.run(len(ids), handles.text.decode, checked)

    # --- embeddings (serving/embeddings.py) -------------------------------------
    async def embed(self, model: str | None, inputs: list[str] | list[list[int]], *,
                    truncate: bool = False, dimensions: int | None = None) -> EmbedResult:
        """Vectors for `inputs` from the encoder serving `model`."""
        return await embeddings.embed(self.hub, self.registry, model, inputs, truncate=truncate,
                                      dimensions=dimensions)

    def model_facts(self, name: str) -> dict[str, Any]:
        """kind, embedding_dim, max_input_tokens, vision of a registry entry (/v1/models)."""
        spec = self.registry.resolve(name)
        gen = next((g for g in self.hub.resident if g.spec.name == spec.name), None)
        return embeddings.describe(spec, self.registry, gen)

    def model_states(self) -> dict[str, dict[str, Any]]:
        """Each registry entry's residency (serving/report.py), for the status routes."""
        return report.model_states(self.hub)

    def memory_report(self) -> dict[str, int]:
        return report.memory_report(self.hub)

    def check_cluster(self) -> None:
        """503 once the distributed group is lost (engine/channel.py rule 5)."""
        lost = getattr(self.cluster, "lost", None)
        if lost is not None:
            raise Unavailable(f"distributed group lost: {lost}; restart the group",
                              retry_after_s=10.0)

    # --- shutdown ----------------------------------------------------------------
    async def drain(self, timeout_s: float, *, flush_s: float = 2.0) -> int:
        """Rule 2; returns how many runs had to be cut."""
        self.hub.begin_drain()
        deadline = time.monotonic() + timeout_s
        while self._live_runs() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        cut = self._live_runs()
        if cut:
            log.warning("drain: %d request(s) still generating after %.0f s; ending them",
                        len(cut), timeout_s)
        for run in cut:
            run.cut(Unavailable("The daemon is shutting down: this answer was cut at the "
                                "drain limit.", code="shutting_down",
                                retry_after_s=DRAIN_RETRY_AFTER_S))
        flush_until = time.monotonic() + flush_s  # let the terminal frames reach the clients
        while self._live_runs() and time.monotonic() < flush_until:
            await asyncio.sleep(0.02)
        return len(cut)

    def _live_runs(self) -> list[Run]:
        return [r for r in self._runs if not r.finished]

    def _forget_run(self, run: Run) -> None:
        self._runs = [r for r in self._runs if r is not run]

    def forget_generations(self) -> None:
        """On each load: grammar compilers and turn memories of generations no longer
        resident go (their in-flight rows already hold what they need), so nothing here
        keeps an evicted model's tokenizer."""
        self._compilers = self._keep(self._compilers)
        self._memories = self._keep(self._memories)

    # --- status ----------------------------------------------------------------
    def engine_stats(self) -> EngineStats | None:
        gen = self.hub.current
        return gen.engine.stats() if gen is not None and gen.engine is not None else None

    def disk_stats(self) -> DiskStats | None:
        """The SSD tier's numbers (engine/kv/disk.py); None when it is not configured."""
        return self.hub.disk.snapshot() if self.hub.disk is not None else None

    def engine_stats_by_model(self) -> dict[str, EngineStats]:
        """Every resident model's engine stats (/metrics labels them `model`)."""
        return {gen.name: gen.engine.stats() for gen in self.hub.resident
                if gen.engine is not None}

    @property
    def uptime_s(self) -> float:
        return time.monotonic() - self.started_at


def _encode(tokenizer: Any, text: str, add_special: bool) -> list[int]:
    return encode_text(tokenizer, text, add_special_tokens=add_special)


def _active_encoder(gen: Generation) -> Encoder | None:
    """The encoder when `gen` is an encoder entry (not a chat model's side-car)."""
    return gen.embedder if gen.spec.kind == "encoder" else None


def _encoder_ids(encoder: Encoder, ids: list[int]) -> list[int]:
    """Token ids checked against an active encoder's vocabulary (param `tokens`)."""
    vocab = encoder.tokenizer.vocab_size
    bad = next((i for i in ids if not 0 <= i < vocab), None)
    if bad is not None:
        raise InvalidRequest(f"Token id {bad} is outside the vocabulary of {vocab}.",
                             param="tokens")
    return ids


def _on_load(state: AppState, gen: Generation) -> None:
    state.forget_generations()
    if state.metrics is not None:
        state.metrics.observe_model_load(gen.name, gen.number, float(gen.loaded.load_time_s))


async def _load_default(hub: Hub) -> None:
    """Rule 1's start-up load, then each `preload = true` entry next to it (registry rule
    8); returns nothing, so the task kept in AppState.startup does not keep the first
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
               background_load: bool = False, cluster: Any = None) -> Starlette:
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
        state = AppState(settings, reg, hub, cluster=cluster)
        state.metrics = Metrics(stats_fn=state.engine_stats_by_model, disk_fn=state.disk_stats)
        hub.on_load = lambda gen: _on_load(state, gen)
        app.state.frink = state
        if load_default:
            state.startup = asyncio.get_running_loop().create_task(_load_default(hub))
            if not background_load:
                await asyncio.shield(state.startup)
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
