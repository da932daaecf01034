"""One generation: a loaded model and its engine, immutable once published.

Why a module of its own: the hub (hub.py) publishes and retires generations,
the embeddings service (embeddings.py) attaches an encoder to one, and the
decode handles (handles.py) read one; none of them owns the type. What is
built lazily for one generation -- its grammar compiler, its turn memory
(handles rule 7) -- lives on it, so it goes when the generation goes and no
dict keyed by generation number has to be pruned on each load. Building
and freeing a generation are the only two places that touch model loading
and the engine's lifetime, and they block: the hub runs them in worker
threads (docs/ARCHITECTURE.md, "Threads").

Rules:
1. `attach_embedder` (here, below the hub that calls it: embeddings.py only
   reads the result) gives a generation the encoder that answers
   /v1/embeddings for it (embeddings.py's table): an encoder entry serves
   itself, `embeddings = "self"` mean-pools the model's own hidden states,
   `embeddings = E` loads entry E next to it (a side-car). It runs inside the
   hub's load (worker thread), so a side-car that cannot load fails the load
   by name, with the resident set still serving.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Protocol

from ..backend import Backend
from ..config import HubConfig, LoadConfig
from ..engine.config import EngineConfig, resolve_engine_config
from ..engine.constraints import GrammarCompiler
from ..engine.engine import Engine
from ..engine.kv.disk import DiskTier
from ..engine.speculative import SpecConfig
from ..models.budget import KVPlan, plan_kv
from ..models.draft import load_draft
from ..models.encoder import Encoder, encoder_from_generative
from ..models.loader import LoadedModel, load_model
from ..registry import ModelSpec, Registry
from .turn_memory import TurnMemory

log = logging.getLogger("frink_mlx.hub")

SELF = "self"  # an entry's `embeddings = "self"`: its own hidden states, pooled (rule 1)


class Gate(Protocol):
    """The decode gate (engine/gate.py), or a plain lock in tests."""

    def __enter__(self) -> object: ...
    def __exit__(self, *exc: object) -> None: ...


@dataclass(slots=True)
class GrammarSlot:
    """A generation's grammar compiler, built on its first structured request (building
    it reads the whole vocabulary); filled on the event loop only."""

    compiler: GrammarCompiler | None = None


@dataclass(frozen=True, slots=True)
class Generation:
    """One loaded model, never mutated after publication."""

    number: int
    spec: ModelSpec
    loaded: LoadedModel
    engine: Engine | None  # encoders have none
    plan: KVPlan | None
    created_at: float      # time.monotonic()
    created_unix: float = field(default_factory=time.time)
    embedder: Encoder | None = None  # serves /v1/embeddings (embeddings.py)
    nbytes: int = 0  # what it holds (residency.py rule 1); 0 = measure it when published
    draft: LoadedModel | None = None  # the entry's draft model (registry rule 10), freed with it
    grammar: GrammarSlot = field(default_factory=GrammarSlot, compare=False, repr=False)
    turns: TurnMemory = field(default_factory=TurnMemory, compare=False, repr=False)  # handles rule 7

    @property
    def name(self) -> str:
        return self.spec.name

    def answers_to(self, name: str | None) -> bool:
        return name is None or name in ("default", self.spec.name, *self.spec.aliases)


# (spec, config, number, gate, backend[, draft=spec][, disk=tier]) -> Generation; blocking,
# run in a worker thread. The hub passes `draft` (the entry's draft model, registry rule 10)
# only when there is one, and `disk` (the SSD tier, engine/kv/disk.py) only when there is
# one and the factory names the parameter, so factories that know neither keep working.
GenerationFactory = Callable[..., Generation]


def build_generation(spec: ModelSpec, config: HubConfig, number: int, gate: Gate,
                     backend: Backend, draft: ModelSpec | None = None,
                     disk: DiskTier | None = None) -> Generation:
    """Load `spec` (and its `draft` when speculation is on) and start its engine on
    `backend` (the production factory), its prefix cache over the SSD tier `disk`; a
    draft whose tokenizer differs is refused."""
    loaded = load_model(spec, config.load, backend)
    spec = loaded.spec  # with the source's and the checkpoint's defaults (loader rules 1, 7)
    if loaded.kind != "generative":
        return Generation(number, spec, loaded, None, None, time.monotonic())
    helper = load_draft(loaded, draft, config.load, backend) \
        if draft is not None and config.engine.speculative else None
    plan = plan_kv(loaded, config.budget, backend.memory_budget(), draft=helper,
                   draft_rows=config.engine.spec_draft_rows)
    resolved = resolve_engine_config(engine_config(config, plan, number), loaded, backend,
                                     draft=helper)  # the engine's whole config, decided here
    engine = Engine(loaded, resolved, gate, backend, draft=helper, disk=disk)  # type: ignore[arg-type]
    engine.start()
    return Generation(number, spec, loaded, engine, plan, time.monotonic(), draft=helper)


def engine_config(config: HubConfig, plan: KVPlan, number: int) -> EngineConfig:
    """The engine's config for generation `number`, from the hub's limits and the KV plan,
    before what the model and the backend decide (engine/config.py resolves it)."""
    limits = config.engine
    return EngineConfig(
        block_size=plan.block_size, num_blocks=plan.num_blocks, max_batch=limits.max_batch,
        prefill_chunk_tokens=limits.prefill_chunk_tokens, batching=limits.batching,
        context_ceiling=plan.context_ceiling, max_queue=limits.max_queue,
        queue_timeout_s=limits.queue_timeout_s, generation=number,
        idle_prefill_tokens=limits.idle_prefill_tokens,
        shared_prefill_tokens=limits.shared_prefill_tokens,
        admission_window_s=limits.admission_window_ms / 1000,
        pipeline=limits.pipeline, num_state_slots=plan.num_state_slots, kv_bits=plan.kv_bits,
        num_snapshots=plan.num_snapshots,
        spec=SpecConfig(max_draft=limits.spec_max_draft, ngram_max=limits.spec_ngram,
                        max_rows=limits.spec_max_rows, draft_rows=limits.spec_draft_rows,
                        draft_num_blocks=plan.draft_num_blocks)
        if limits.speculative else None)


def attach_embedder(gen: Generation, registry: Registry, config: LoadConfig,
                    backend: Backend) -> Generation:
    """The generation with its `embedder` set (rule 1); unchanged when it has none."""
    if gen.embedder is not None:
        return gen
    spec = gen.spec
    if spec.kind == "encoder":
        embedder = gen.loaded.encoder
    elif spec.embeddings == SELF:
        embedder = encoder_from_generative(gen.loaded, config.encoder, backend)
    elif spec.embeddings:
        embedder = load_model(registry.resolve(spec.embeddings), config, backend).encoder
    else:
        return gen
    return dataclasses.replace(gen, embedder=embedder)


def free_generation(gen: Generation, timeout_s: float) -> None:
    """Shut the engine down (blocking); the hub hands the memory back once its last
    reference is gone (hub rule 4, Backend.release_freed_memory)."""
    if gen.engine is not None:
        try:
            gen.engine.shutdown(timeout_s)
        except Exception:  # noqa: BLE001 - freeing must not fail the caller
            log.exception("engine shutdown failed for generation %d", gen.number)


def takes_disk(factory: GenerationFactory) -> bool:
    """Whether `factory` names the `disk` parameter (see GenerationFactory)."""
    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return False
    return "disk" in params or any(p.kind is p.VAR_KEYWORD for p in params.values())
