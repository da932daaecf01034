"""The engine's config, decided once, before the engine is built.

Why a module of its own: what an engine runs with depends on more than the
settings -- on the backend (whether steps pipeline), the model (recurrent
layers need state slots and snapshots), the draft model (its KV pool and step cost) and
on whether it leads a distributed group. `resolve_engine_config` decides all
of it in one place, once per generation (serving/generation.py
`build_generation`, serving/distributed.py for a group's rank 0); the engine
reads the result as it is and refuses a config that was not resolved.

Rules:
1. Pipelining: never for a distributed group (leader.py rule 1); else the
   setting, else `Backend.pipelines_steps()` (engine.py's docstring says why
   the CPU backend does not).
2. A model with recurrent layers (kv/specs.py) runs with `num_state_slots` =
   max_batch unless given, and keeps its prefix cache through state snapshots
   (kv/snapshots.py): `num_snapshots` (4 a slot unless given; 0: the prefix
   cache off, since a hit would skip the state of the tokens it covers) every
   `snapshot_interval_blocks` (kv/snapshots.py rule 6 unless given); logged
   once. It speculates (a rejected draft's state is rolled back:
   engine/speculative/ rule 8), but never with a draft model that has
   recurrent layers itself.
3. A distributed group never speculates (the step plan the followers replay
   carries no drafts). Its cache kinds are rank 0's part's (the loader's
   probe of the split model, kv/specs.py rule 2): recurrent layers get their
   slots and snapshots as in rule 2, sliding windows their tables, and the
   plan names every slot, snapshot and window block, so each follower's own
   pools stay the same as rank 0's (engine/follower.py).
4. Speculation with a draft model (engine/speculative/ rule 7): its KV pool
   holds `draft_rows` full contexts, never more blocks than the target's,
   unless given; its step cost is its weights over the target's unless
   given. Without a draft model there is no draft pool.
5. KV bits (`kv_bits`, kv/quantized.py): refused on a distributed group
   (ConfigError: each rank's pools are float).
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Any, Protocol

from mlx.utils import tree_flatten

from ..backend import Backend
from ..errors import ConfigError
from .kv.snapshots import interval_blocks
from .kv.specs import ModelCacheSpec, has_recurrent_layers, model_cache_spec
from .speculative import SpecConfig

log = logging.getLogger("frink_mlx.engine.engine")


class EngineModel(Protocol):
    """What the engine needs of a loaded model (models/loader.py `LoadedModel`)."""

    @property
    def model(self) -> Any: ...  # an mlx-lm model (nn.Module)


@dataclass(frozen=True)
class EngineConfig:
    block_size: int
    num_blocks: int
    max_batch: int
    prefill_chunk_tokens: int
    batching: bool
    context_ceiling: int
    max_queue: int
    queue_timeout_s: float
    generation: int = 0
    idle_prefill_tokens: int | None = None   # scheduler rule 2; None = prefill_chunk_tokens
    shared_prefill_tokens: int | None = None  # scheduler rule 2, while another engine runs
    pipeline: bool | None = None             # rule 1; None: the backend decides
    admission_window_s: float = 0.0          # see loop.py `_drain_inbox`
    spec: SpecConfig | None = None           # speculative decoding (engine/speculative/); None = off
    num_state_slots: int = 0                 # recurrent-state slots; 0: max_batch (if any)
    num_snapshots: int | None = None         # state snapshots (rule 2); None: 4 a slot
    snapshot_interval_blocks: int = 0        # rule 2; 0: kv/snapshots.py rule 6
    kv_bits: int | None = None               # rule 5: KV pools in 8 or 4 bits; None: float
    resolved: bool = False                   # set by resolve_engine_config only


def engine_cache_spec(loaded: EngineModel, distributed: bool) -> ModelCacheSpec:
    """The model's cache entries (kv/specs.py); a split model's probe is never evaluated
    (rule 3: its collectives would run on this rank alone)."""
    return getattr(loaded, "cache_spec", None) or model_cache_spec(
        loaded.model, evaluate=not distributed)


def resolve_engine_config(config: EngineConfig, loaded: EngineModel, backend: Backend, *,
                          distributed: bool = False,
                          draft: EngineModel | None = None) -> EngineConfig:
    """The config an engine for `loaded` runs with (rules 1-4), decided once."""
    pipeline = False if distributed else (
        backend.pipelines_steps() if config.pipeline is None else config.pipeline)
    cache_spec = engine_cache_spec(loaded, distributed)
    if cache_spec.has_state:  # rule 2 (rule 3 on a group)
        config = _with_state(config, cache_spec, model_dtype(loaded))
        if draft is not None and has_recurrent_layers(draft.model):
            draft = None
    spec = config.spec
    if distributed and config.kv_bits is not None:  # rule 5
        raise ConfigError(f"kv_bits={config.kv_bits} is not supported on a distributed group "
                          "(each rank's pools are float)")
    if distributed:  # rule 3
        spec = None
    return dataclasses.replace(config, pipeline=pipeline,
                               spec=_with_draft(spec, config, loaded, draft), resolved=True)


def _with_state(config: EngineConfig, cache_spec: ModelCacheSpec, dtype: Any) -> EngineConfig:
    """Rule 2: the state slots and snapshots of a model with recurrent layers."""
    slots = config.num_state_slots or config.max_batch
    snaps = 4 * slots if config.num_snapshots is None else config.num_snapshots
    chunk = max(config.prefill_chunk_tokens, config.idle_prefill_tokens or 0)
    every = config.snapshot_interval_blocks or interval_blocks(  # kv/snapshots.py rule 6
        config.num_blocks, snaps, cache_spec.state_bytes_per_row,
        cache_spec.kv_bytes_per_token(dtype) * config.block_size, -(-chunk // config.block_size))
    log.info("model %s has recurrent layers: %s", cache_spec.family,
             f"{snaps} state snapshots every {every} blocks" if snaps else "prefix cache off")
    return dataclasses.replace(config, num_state_slots=slots, num_snapshots=snaps,
                               snapshot_interval_blocks=every)


def _with_draft(spec: SpecConfig | None, config: EngineConfig, loaded: EngineModel,
                draft: EngineModel | None) -> SpecConfig | None:
    """Rule 4: the speculation settings with the draft model's pool and step cost."""
    if spec is None or draft is None:
        return dataclasses.replace(spec, draft_num_blocks=0) if spec is not None else None
    num_blocks = spec.draft_num_blocks or draft_pool_blocks(
        spec, config.num_blocks, config.block_size, config.context_ceiling)
    cost = spec.draft_step_cost or _nbytes(draft.model) / max(1, _nbytes(loaded.model))
    return dataclasses.replace(spec, draft_num_blocks=num_blocks, draft_step_cost=cost)


def draft_pool_blocks(spec: SpecConfig, num_blocks: int, block_size: int,
                      context_ceiling: int) -> int:
    """The draft KV pool (rule 4): `draft_rows` full contexts, never more than the target's."""
    return max(1, min(num_blocks, spec.draft_rows * -(-context_ceiling // block_size)))


def model_dtype(loaded: EngineModel) -> Any:
    """The float type of `loaded`'s KV: the loader's dtype, else its first parameter's."""
    dtype = getattr(loaded, "dtype", None)
    if dtype is not None:
        return dtype
    params: list[tuple[str, Any]] = tree_flatten(loaded.model.parameters())  # type: ignore[assignment]
    for _, value in params:
        return value.dtype
    raise ValueError("model has no parameters")


def _nbytes(model: Any) -> int:
    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return sum(v.nbytes for _, v in params)
