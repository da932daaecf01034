"""The engine: one thread that owns every MLX call for one loaded model.

Why one thread: MLX work must not interleave across threads (see gate.py),
and continuous batching needs one place that sees every live sequence. The
event loop only talks to it through a thread-safe inbox (submit, abort) and
per-request `SeqStream`s (StepOutputs pushed with `call_soon_threadsafe`).

Where things are: this module is the engine's surface (any thread: submit,
abort, stats, shutdown) and its thread; loop.py is what that thread does
each step; outputs.py turns read-back steps into each request's outputs;
runner.py turns a plan into MLX calls.

Pipelining (loop.py: dispatch step t+1, then read step t back) is a Metal
feature: `EngineConfig.pipeline` comes from the backend
(`Backend.pipelines_steps`) unless the setting says otherwise. On the CPU
backend `mx.async_eval` blocks until all but ~10 of a step's ~1,000 tasks are
done (MLX bounds the tasks in flight), so the device cannot run ahead of the
host, and building step t+1's graph while step t still runs only competes
with the compute threads for the cores (benchmarks/results/engine.md has the
runs that decided it). For the same reason a step that sampled first tokens
(final prefill chunks) is always read back before the next is dispatched:
otherwise every request's first token waits a whole decode step.

Failure rules:
1. `submit` validates synchronously: empty prompt, n, sampling ranges
   (core/checks.py), constraints (InvalidRequest), prompt + 1 token over the ceiling
   (ContextLengthExceeded), a full waiting queue (Overloaded). max_tokens is
   clamped to the ceiling, never refused.
2. A request refused for lack of KV blocks or batch rows for longer than
   `queue_timeout_s` (the scheduler's shortage clock, not mere waiting behind
   other prompts' prefill) ends its stream with `Overloaded` (iteration raises it, and so does
   `SeqStream.admitted()`, which returns once the request's first prefill
   chunk is planned: from then on it cannot time out).
3. An exception while building a step ends that step's rows with
   finish="error"; an exception while evaluating one also rebuilds the KV
   pools (their contents are unknown) and ends every live row. The thread
   keeps serving either way: no request ever hangs.

Cache kinds (kv/specs.py): the model's own `make_cache()` says which entries
it needs; each attention entry gets its own paged pool (its geometry), each
recurrent entry a pool of `num_state_slots` row states (kv/recurrent.py).
Until recurrent-state snapshots exist, a model with recurrent layers runs
with the prefix cache off (a hit would skip the state of the tokens it
covers) and without speculation (a rejected draft would leave its tokens in
the state); both are logged once when the engine starts.
SSD tier (`disk` given, kv/disk.py): the engine's prefix cache spills to the
daemon's block files and reads prompts' runs back (kv/spill.py); not for a
distributed group (each rank holds its own shard of the pools).
KV bits (`kv_bits`, kv/quantized.py): the pools are quantized; refused on a
distributed group, and the SSD tier is off for such a model (one warning).

Distributed (rank 0 of a group, `channel` given): the runner is leader.py's,
which posts each plan to the followers; steps are never pipelined (leader.py
rule 1); once the channel is lost (channel.py) `submit` answers `Unavailable`
(503) and the requests in flight end with it; shutting down tells the
followers to free the generation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import logging
import queue
import secrets
import time
from dataclasses import dataclass
from typing import Any, Protocol

import mlx.core as mx
from mlx.utils import tree_flatten

from ..backend import Backend
from ..core.checks import check_sampling
from ..errors import ConfigError, ContextLengthExceeded, InvalidRequest, Overloaded, Unavailable
from . import workers
from .admission import QueueDepth
from .channel import Free, PlanChannel
from .gate import DecodeGate
from .kv.disk import DiskTier
from .kv.manager import KVCacheManager
from .kv.paged import PagedKVStore, model_kv_geometry
from .kv.quantized import QuantizedKVStore, check_kv_bits, reads_quantized
from .kv.recurrent import StateStore
from .kv.specs import ModelCacheSpec, UnsupportedModel, has_recurrent_layers, model_cache_spec, model_family
from .kv.spill import DiskLink, disk_layout
from .leader import LeaderRunner
from .loop import Abort, Drain, LoopConfig, Message, StepLoop, Submit
from .runner import Runner
from .scheduler import Scheduler
from .speculative import SpecConfig
from .speculative.model import DraftModel
from .stream import SeqStream
from .turns import PrefillSlicer
from .types import EngineStats, SeqRequest

__all__ = ["Engine", "EngineConfig", "EngineModel", "SeqStream"]

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
    pipeline: bool | None = None             # None: the backend decides; see the module docstring
    admission_window_s: float = 0.0          # see loop.py `_drain_inbox`
    spec: SpecConfig | None = None           # speculative decoding (engine/speculative/); None = off
    num_state_slots: int = 0                 # recurrent-state slots; 0: max_batch (if any)
    kv_bits: int | None = None               # KV pools in 8 or 4 bits (kv/quantized.py); None: float


class Engine:
    def __init__(self, loaded: EngineModel, config: EngineConfig, gate: DecodeGate,
                 backend: Backend, *, channel: PlanChannel | None = None,
                 draft: EngineModel | None = None, disk: DiskTier | None = None) -> None:
        """`backend` prepares the model for the engine's forwards (backend/base.py);
        `channel`: this engine is rank 0 of a distributed group (module docstring);
        `draft`: the generation's draft model (engine/speculative/ rule 7; not distributed);
        `disk`: the daemon's SSD tier (module docstring)."""
        self.loaded = loaded
        self._channel = channel
        if channel is not None and config.kv_bits is not None:  # kv/quantized.py rule 4
            raise ConfigError(f"kv_bits={config.kv_bits} is not supported on a distributed group "
                              "(each rank's pools are float)")
        if channel is not None:
            config = dataclasses.replace(config, pipeline=False)
        elif config.pipeline is None:
            config = dataclasses.replace(config, pipeline=backend.pipelines_steps())
        model = loaded.model
        self.cache_spec = self._cache_spec(loaded, channel)
        config = self._without_state_features(config)
        self._draft = draft if config.spec is not None and channel is None else None
        config = dataclasses.replace(config, spec=self._spec_config(config, loaded))
        self.config = config
        self.gate = gate
        self._dtype = getattr(loaded, "dtype", None) or _param_dtype(model)
        self._stream: Any = workers.stream_for(mx.default_device())
        has_state = self.cache_spec is not None and self.cache_spec.has_state
        self.kv = KVCacheManager(config.num_blocks, config.block_size, enable_caching=not has_state,
                                 num_state_slots=config.num_state_slots if has_state else 0)
        self.scheduler = Scheduler(
            self.kv, max_batch=config.max_batch,
            prefill_chunk_tokens=config.prefill_chunk_tokens, generation=config.generation,
            one_request_at_a_time=not config.batching,
            idle_prefill_tokens=config.idle_prefill_tokens, spec=config.spec,
            shared_prefill_tokens=config.shared_prefill_tokens)
        self.runner = self._new_runner(model, backend)
        self._inbox: queue.SimpleQueue[Message] = queue.SimpleQueue()
        self._depth = QueueDepth()
        self._stats = EngineStats(num_blocks_total=config.num_blocks, block_size=config.block_size,
                                  context_ceiling=config.context_ceiling)
        self._loop = StepLoop(
            LoopConfig(bool(config.pipeline), config.queue_timeout_s, config.admission_window_s),
            gate, self.scheduler, self.runner, self.kv, self._new_store, self._inbox,
            self._depth, self._stats)
        if channel is None and isinstance(gate, DecodeGate):  # turns.py (never across ranks)
            self._loop.slicer = PrefillSlicer(gate, min_tokens=self.scheduler.shared_prefill_tokens,
                                              max_tokens=config.prefill_chunk_tokens)
        if disk is not None and disk.enabled and channel is None:
            self._link_disk(disk, backend)
        self._thread: workers.Job | None = None
        self._stopping = False

    def _cache_spec(self, loaded: EngineModel, channel: PlanChannel | None) -> ModelCacheSpec | None:
        """The model's cache entries (kv/specs.py); None on a distributed group, whose
        ranks keep one uniform paged cache per layer (a recurrent model is refused there)."""
        if channel is None:
            return getattr(loaded, "cache_spec", None) or model_cache_spec(loaded.model)
        if has_recurrent_layers(loaded.model):
            raise UnsupportedModel(f"{model_family(loaded.model)}: distributed serving of "
                                   "recurrent layers is not supported")
        return None

    def _without_state_features(self, config: EngineConfig) -> EngineConfig:
        """The module docstring's limits for a model with recurrent layers."""
        spec = self.cache_spec
        if spec is None or not spec.has_state:
            return config
        log.info("model %s has recurrent layers: prefix cache off%s", spec.family,
                 ", speculation off" if config.spec is not None else "")
        return dataclasses.replace(config, spec=None,
                                   num_state_slots=config.num_state_slots or config.max_batch)
    def _link_disk(self, disk: DiskTier, backend: Backend) -> None:
        """The SSD tier, under the namespace of this model's content (kv/spill.py rule 1);
        none for a model with recurrent layers (its prefix cache is off: module docstring)."""
        if self.cache_spec is not None and self.cache_spec.has_state:
            return
        if self.config.kv_bits is not None:  # kv/quantized.py rule 4
            log.warning("SSD tier off for this model: its KV blocks are in %d bits (kv_bits) and "
                        "the tier's block files hold float blocks only", self.config.kv_bits)
            return
        layout = disk_layout(self.loaded.model, self.runner.store, backend.name)
        if layout is None:
            return
        self.scheduler.cache_namespace = layout.namespace.hex()
        self._loop.spill = DiskLink(disk, layout, self.kv, lambda: self.runner.store)

    def _spec_config(self, config: EngineConfig, loaded: EngineModel) -> SpecConfig | None:
        """The speculation settings with the draft model's pool and step cost (rule 7)."""
        spec = config.spec
        if spec is None or self._draft is None:
            return dataclasses.replace(spec, draft_num_blocks=0) if spec is not None else None
        num_blocks = spec.draft_num_blocks or draft_pool_blocks(
            spec, config.num_blocks, config.block_size, config.context_ceiling)
        cost = spec.draft_step_cost or _nbytes(self._draft.model) / max(1, _nbytes(loaded.model))
        return dataclasses.replace(spec, draft_num_blocks=num_blocks, draft_step_cost=cost)

    def _new_runner(self, model: Any, backend: Backend) -> Runner:
        forward, masks = backend.prepare_decoder(model), backend.device_token_masks()
        if self._channel is None:
            spec = self.cache_spec
            states = StateStore(spec.states, self.config.num_state_slots) \
                if spec is not None and spec.has_state else None
            return Runner(model, self._new_store(), forward, device_masks=masks,
                          draft=self._new_draft(backend), cache_spec=spec, states=states)
        self._channel.on_lost.append(self._fail_in_flight)
        return LeaderRunner(model, self._new_store(), forward, channel=self._channel,
                            generation=self.config.generation, device_masks=masks)

    def _fail_in_flight(self, reason: str) -> None:
        """The channel was lost (called from its watchdog): end every request in flight.

        The engine thread may be parked inside a collective that never returns
        (channel.py rule 2), so the streams are ended from here."""
        error = Unavailable(f"distributed group lost: {reason}", retry_after_s=10.0)
        for stream in list(self._loop.router.streams.values()):
            stream._push(error)

    def _new_draft(self, backend: Backend) -> DraftModel | None:
        spec = self.config.spec
        if self._draft is None or spec is None:
            return None
        model = self._draft.model
        layers, heads, head_dim = model_kv_geometry(model)
        store = PagedKVStore(num_layers=layers, num_blocks=spec.draft_num_blocks,
                             block_size=self.config.block_size, n_kv_heads=heads,
                             head_dim=head_dim,
                             dtype=getattr(self._draft, "dtype", None) or _param_dtype(model))
        vocab = int(getattr(getattr(self.loaded.model, "args", None), "vocab_size", 0) or 0)
        return DraftModel(model, store, backend.prepare_decoder(model), vocab or 1 << 31)

    @property
    def store(self) -> PagedKVStore:
        """The KV pools (replaced by the MLX thread after an evaluation error)."""
        return self.runner.store

    def _new_store(self) -> PagedKVStore:
        """The KV pools, quantized with `kv_bits` (kv/quantized.py)."""
        spec, config, model = self.cache_spec, self.config, self.loaded.model
        if spec is not None:
            geometries = spec.geometries()
        else:
            layers, heads, head_dim = model_kv_geometry(model)
            geometries = [(heads, head_dim, head_dim)] * layers
        shape: dict[str, Any] = dict(num_layers=len(geometries), num_blocks=config.num_blocks,
                                     block_size=config.block_size, n_kv_heads=0, head_dim=0,
                                     dtype=self._dtype, geometries=geometries)
        if config.kv_bits is None:
            return PagedKVStore(**shape)
        check_kv_bits(config.kv_bits, [d for _, k, v in geometries for d in (k, v)],
                      model_family(model))
        return QuantizedKVStore(bits=config.kv_bits, **shape,
                                quantized_reads=reads_quantized(model, len(geometries)))

    # -- public API (any thread) -------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = workers.start(self._main, f"frink-engine g{self.config.generation}")

    def submit(self, seq: SeqRequest) -> SeqStream:
        """Validate (rule 1) and enqueue; the stream yields this request's outputs."""
        if self._stopping:
            raise Overloaded("The engine is shutting down.", retry_after_s=1.0)
        if self._channel is not None and self._channel.lost is not None:
            raise Unavailable(f"distributed group lost: {self._channel.lost}; restart the group",
                              retry_after_s=10.0)
        seq = self._validated(seq)
        depth = self._depth.try_enter(self.config.max_queue)
        if depth is not None:
            raise Overloaded(
                f"{depth} requests are already waiting (max_queue "
                f"{self.config.max_queue}); retry later.",
                retry_after_s=max(1.0, depth / max(1, self.config.max_batch)))
        stream = SeqStream(seq.request_id, max(1, seq.n), self.abort)
        self._inbox.put(Submit(seq, stream))
        return stream

    def _validated(self, seq: SeqRequest) -> SeqRequest:
        ceiling = self.config.context_ceiling
        if not seq.prompt_ids:
            raise InvalidRequest("The prompt is empty.", param="prompt")
        if seq.n < 1 or seq.n > self.config.max_batch:
            raise InvalidRequest(f"'n' must be between 1 and {self.config.max_batch}.", param="n")
        check_sampling(seq.sampling)  # a knob out of range would fail the whole batched step
        if seq.constraints is not None and len(seq.constraints) != seq.n:
            raise InvalidRequest("one constraint per row is needed", param="response_format")
        if len(seq.prompt_ids) + 1 > ceiling:
            raise ContextLengthExceeded(len(seq.prompt_ids) + 1, ceiling)
        if seq.max_tokens < 1:
            raise InvalidRequest("'max_tokens' must be at least 1.", param="max_tokens")
        room = ceiling - len(seq.prompt_ids)
        if seq.max_tokens > room:
            seq = dataclasses.replace(seq, max_tokens=room)
        if not seq.request_id:
            seq = dataclasses.replace(seq, request_id=f"seq-{secrets.token_hex(8)}")
        return seq

    def abort(self, request_id: str, index: int | None = None) -> None:
        """Thread-safe: end row `index` of the request (None: every row) within one step."""
        self._inbox.put(Abort(request_id, index))

    def stats(self) -> EngineStats:
        s, sch = self._stats, self.scheduler
        s.num_blocks_used = self.kv.num_used_blocks
        s.num_blocks_cached = self.kv.num_cached_blocks
        s.num_running = len(sch.running)
        s.num_waiting = self._depth.total
        s.prefix_hit_tokens_total = sch.prefix_hit_tokens_total
        s.prompt_tokens_total = sch.prompt_tokens_total
        s.extra["num_preemptions"] = float(sch.num_preemptions)
        if self._loop.spill is not None:
            s.extra["disk_hit_tokens_total"] = float(sch.disk_hit_tokens_total)
            s.extra["disk_lost_blocks_total"] = float(self._loop.spill.num_lost_blocks)
        if self._loop.slicer is not None:
            s.extra["sliced_prefill_turns_total"] = float(self._loop.slicer.turns_total)
        spec = sch.speculator
        if spec is not None:
            s.draft_tokens_total = spec.num_drafted_total
            s.draft_accepted_tokens_total = spec.num_accepted_total
            if spec.draft_kv is not None:  # engine/speculative/ rule 7
                s.extra["draft_model_tokens_total"] = float(spec.num_model_drafted_total)
                s.extra["draft_model_accepted_total"] = float(spec.num_model_accepted_total)
                s.extra["draft_kv_blocks_used"] = float(spec.draft_kv.num_used_blocks)
        store = self.runner.store  # may be swapped by the MLX thread after an error
        if store is not None and store.keys:
            s.extra["kv_pool_bytes"] = float(store.nbytes)
        slots, cache_spec = self.kv.state_slots, self.cache_spec
        if slots is not None and cache_spec is not None:  # priced full (kv/recurrent.py rule 6)
            s.state_slots_total, s.state_slots_used = slots.num_slots, slots.num_used
            s.extra["state_pool_bytes"] = float(slots.num_slots * cache_spec.state_bytes_per_row)
        return dataclasses.replace(s, extra=dict(s.extra))

    def shutdown(self, timeout_s: float) -> None:
        """Let running rows finish for up to timeout_s, abort the rest, join the thread."""
        self._stopping = True
        self._inbox.put(Drain(time.monotonic() + max(0.0, timeout_s)))
        lost = self._channel is not None and self._channel.lost is not None
        if self._thread is not None:
            # a lost group may have parked the thread in a collective for good (channel.py rule 2)
            self._thread.join(timeout=1.0 if lost else max(0.0, timeout_s) + 30.0)
            if not self._thread.is_alive():
                self._release_arrays()
            self._thread = None
        if self._channel is not None:
            self._channel.on_lost.remove(self._fail_in_flight)
            if self._channel.lost is None:
                with contextlib.suppress(Unavailable), self._channel.exclusive():
                    self._channel.post(Free(self.config.generation))

    def _release_arrays(self) -> None:
        """Hand the KV pools and the thread's stream back now, not at interpreter exit
        (MLX aborts if they are torn down after its own globals)."""
        self._stats.extra["kv_pool_bytes"] = float(self.runner.store.nbytes)
        self.runner.forget_pending()
        self.runner.store.release()
        if self.runner.states is not None:
            self.runner.states.release()
        if self.runner.draft is not None:
            self.runner.draft.store.release()
        self._stream = None
        gc.collect()

    # -- the MLX thread --------------------------------------------------------------

    def _main(self) -> None:
        # On a pool thread, with the device's one thread-local stream (workers.py): its
        # streams outlive this generation and serve the next engine the thread runs.
        with mx.stream(self._stream):
            self._loop.run()


def draft_pool_blocks(spec: SpecConfig, num_blocks: int, block_size: int,
                      context_ceiling: int) -> int:
    """The draft KV pool (rule 7): `draft_rows` full contexts, never more than the target's."""
    return max(1, min(num_blocks, spec.draft_rows * -(-context_ceiling // block_size)))


def _nbytes(model: Any) -> int:
    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return sum(v.nbytes for _, v in params)


def _param_dtype(model: Any) -> mx.Dtype:
    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for _, value in params:
        return value.dtype
    raise ValueError("model has no parameters")
