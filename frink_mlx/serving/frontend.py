"""The Frontend: the one typed surface every adapter calls (vLLM's `EngineClient`).

Why: a route that reached into the hub, the handles and the registry by itself
could not be followed past the HTTP edge by reading or by mypy, and every
protocol would write its own lease-render-submit sequence. Here it is written
once: `generate()` leases a generation, takes its decode handles, renders and
tokenizes, compiles any grammar, and submits, raising `FrinkError`s before a
single byte of the answer is sent; `count_tokens`, `tokenize` (`tokenize_many`
for many texts in one job), `detokenize`, `embed` and `drain` are the other
verbs. Adapters reach it only through `frontend(request)` (http/frontend.py);
the composition root (app.py) builds it in the lifespan. What belongs to one
generation (its grammar compiler, its turn memory) lives on that `Generation`,
not here.

Rules:
1. The start-up load (`startup`, app.py rule 1) is a task the server watches
   for its ready line or its refusal; generation routes answer 503 +
   Retry-After until the model is in (hub rule 1).
2. `drain(timeout_s)` (SIGTERM): the hub refuses new work (503 + Retry-After
   in each protocol's envelope, hub rule 7) while the listener stays open;
   runs in flight finish up to `timeout_s`; any still going is cut with an
   error event (handles rule 11), so every stream ends on its protocol's
   terminal frame.
3. An encoder-only target is refused before anything is loaded or evicted for
   it (errors.ModelNotGenerative, the refusal handles rule 1 also raises).
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

import anyio

from ..config import FrontendConfig, ImageLimits
from ..core.checks import check_request
from ..core.offload import Offload, input_chars, texts_chars
from ..core.prompt import check_token_ids, encode_text
from ..core.request import GenRequest
from ..engine import constraints
from ..engine.constraints import GrammarCompiler
from ..engine.kv.disk import DiskStats
from ..engine.types import EngineStats
from ..errors import InvalidRequest, ModelNotGenerative, Unavailable, UnsupportedField
from ..models.encoder import Encoder
from ..registry import Registry
from . import embeddings, report
from .embeddings import EmbedResult
from .generation import Generation
from .handles import DecodeHandles, Prepared, Run
from .hub import DRAIN_RETRY_AFTER_S, Hub
from .responses_store import ResponseStore

if TYPE_CHECKING:
    from mlx_lm.tokenizer_utils import TokenizerWrapper

    from ..engine.channel import PlanChannel

log = logging.getLogger("frink_mlx.frontend")


def _untracked(run: Run) -> None:
    """The default `on_run`: nothing accounts for runs (tests that build a bare Frontend)."""


@dataclass
class Frontend:
    """Generation, tokens, embeddings and drain for every protocol (module docstring)."""

    config: FrontendConfig
    registry: Registry
    hub: Hub
    cluster: PlanChannel | None = None  # rank 0 of a distributed group (engine/channel.py)
    started_at: float = field(default_factory=time.monotonic)
    startup: asyncio.Task[None] | None = None  # rule 1
    offload: Offload = field(default_factory=Offload)  # large inputs' CPU work (core/offload.py)
    responses: ResponseStore = field(default_factory=ResponseStore)  # OpenAI's stored responses
    on_run: Callable[[Run], None] = _untracked  # the access log's tally (http/access.py rule 3)
    _runs: list[Run] = field(default_factory=list)  # in flight, for the drain (rule 2)

    # --- generation ------------------------------------------------------------
    async def generate(self, req: GenRequest) -> Run:
        """Lease, render + tokenize, check the ceiling, compile, submit.

        Raises FrinkError before anything is sent; the Run owns the lease."""
        check_request(req, max_n=self.config.max_batch)  # before any per-choice state
        self._refuse_encoder_target(req.model)
        self.check_cluster()
        lease = await self.hub.acquire(req.model)
        try:
            handles = DecodeHandles.take(lease.generation)
            prepared = await self._prepare(handles, req)
            rows = await self._constraints(lease.generation, handles, prepared)
            run = handles.submit(prepared, lease, rows, lease.generation.turns)
        except BaseException:
            lease.release()
            raise
        self.on_run(run)  # the access log and metrics report it, whichever protocol asked
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
        return self.config.images

    def refuses_images(self, model: str | None) -> bool:
        """core/images.py rule 3: the entry's `refuse_images` (registry rule 11), else the setting."""
        routed = self.registry.route(model)
        own = self.registry.resolve(routed).refuse_images if self.registry.knows(routed or "default") \
            else None
        return self.config.refuse_images if own is None else own

    def _refuse_encoder_target(self, name: str | None) -> None:
        """Rule 3: do not load or evict anything just to refuse the request."""
        name = self.registry.route(name)
        if any(gen.answers_to(name) for gen in self.hub.resident):
            return
        spec = self.registry.resolve(name)
        if spec.kind != "generative":
            raise ModelNotGenerative(spec.name, spec.kind)

    async def _constraints(self, gen: Generation, handles: DecodeHandles, prepared: Prepared
                           ) -> list[Any] | None:
        slot = gen.grammar
        if slot.compiler is None:
            vocab = int(gen.loaded.config.get("vocab_size") or len(handles.tokenizer))
            slot.compiler = GrammarCompiler.for_tokenizer(handles.tokenizer, vocab_size=vocab)
        return await constraints.build_constraints(prepared.request, prepared.markup,
                                                   slot.compiler)

    # --- tokens ----------------------------------------------------------------
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
        return (await self.tokenize_many(model, [text], add_special=add_special))[0]

    async def tokenize_many(self, model: str | None, texts: Sequence[str], *,
                            add_special: bool) -> list[list[int]]:
        """Each of `texts` tokenized by itself, under one lease and in one job: a request
        naming a thousand texts (llama.cpp's text logit_bias keys, a mixed prompt's pieces)
        paid a lease, its handles and an encode on the loop per text -- a second in which
        nothing else was answered. Sized by core/offload.py `texts_chars`."""
        if not texts:
            return []
        async with self.hub.lease(model) as gen:
            encoder = _active_encoder(gen)  # an active encoder tokenizes with its own tokenizer
            if encoder is not None:
                return await self.offload.run(texts_chars(texts), lambda: [
                    list(encoder.tokenize_plain(t, add_special=add_special)) for t in texts])
            tokenizer = DecodeHandles.take(gen).tokenizer
            return await self.offload.run(texts_chars(texts), lambda: [
                _encode(tokenizer, t, add_special) for t in texts])

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

    # --- models and status ------------------------------------------------------
    def resident(self, name: str) -> Generation | None:
        """The resident generation of the registry entry `name`, if any."""
        return next((g for g in self.hub.resident if g.spec.name == name), None)

    def model_facts(self, name: str) -> dict[str, Any]:
        """kind, embedding_dim, max_input_tokens, vision of a registry entry (/v1/models)."""
        spec = self.registry.resolve(name)
        return embeddings.describe(spec, self.registry, self.resident(spec.name))

    def model_states(self) -> dict[str, dict[str, Any]]:
        """Each registry entry's residency (serving/report.py), for the status routes."""
        return report.model_states(self.hub)

    def memory_report(self) -> dict[str, int]:
        return report.memory_report(self.hub)

    @property
    def cluster_lost(self) -> str | None:
        """Why the distributed group was lost (engine/channel.py rule 5); None while whole."""
        return self.cluster.lost if self.cluster is not None else None

    def check_cluster(self) -> None:
        """503 once the distributed group is lost (engine/channel.py rule 5)."""
        lost = self.cluster_lost
        if lost is not None:
            raise Unavailable(f"distributed group lost: {lost}; restart the group",
                              retry_after_s=10.0)

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


def _encode(tokenizer: TokenizerWrapper, text: str, add_special: bool) -> list[int]:
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
