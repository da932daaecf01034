"""The engine: one thread that owns every MLX call for one loaded model.

Why one thread: MLX work must not interleave across threads (see gate.py),
and continuous batching needs one place that sees every live sequence. The
event loop only talks to it through a thread-safe inbox (submit, abort) and
per-request `SeqStream`s (StepOutputs pushed with `call_soon_threadsafe`).

Where things are: this module is the engine's surface (any thread: submit,
abort, stats, shutdown) and its thread; loop.py is what that thread does
each step; outputs.py turns read-back steps into each request's outputs;
runner.py turns a plan into MLX calls.

The config (`EngineConfig`) is decided before the engine is built, once per
generation (config.py `resolve_engine_config`: pipelining, what recurrent
layers and a distributed group turn off, the draft model's pool); the engine
reads it as it is and refuses one that was not resolved.

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
A model with recurrent layers keeps its prefix cache through
`num_snapshots` state snapshots every `snapshot_interval_blocks` blocks
(kv/snapshots.py; 0 snapshots: prefix cache off, since a hit would skip the
state of the tokens it covers), decided with the rest of the config (config.py rule 2); its
speculation rolls a rejected draft's state back (engine/speculative/ rule 8).
Sliding-window entries get window tables (kv/window.py): blocks outside the
window go back to their own pool.
SSD tier (`disk` given, kv/disk.py): the engine's prefix cache spills to the
daemon's block files and reads prompts' runs back (kv/spill.py), window parts
and state snapshots included (kv/diskparts.py); not for a distributed group
(each rank holds its own shard of the pools).
KV bits (`kv_bits`, kv/quantized.py): the pools are quantized (their block
files too); refused on a distributed group (config.py rule 5).

Distributed (rank 0 of a group, `channel` given): the runner is leader.py's,
which posts each plan to the followers; steps are never pipelined (leader.py
rule 1); the cache kinds are rank 0's part's (config.py rule 3), and the
followers keep the same slots, snapshots and window tables, as the plan
names them (follower.py); once the channel is lost (channel.py) `submit` answers `Unavailable`
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
from typing import Any

import mlx.core as mx

from ..backend import Backend
from ..core.checks import check_sampling
from ..errors import ContextLengthExceeded, InvalidRequest, Overloaded, Unavailable
from . import workers
from .admission import QueueDepth
from .channel import Free, PlanChannel
from .config import EngineConfig, EngineModel, engine_cache_spec, model_dtype
from .gate import DecodeGate
from .kv.disk import DiskTier
from .kv.diskparts import disk_parts
from .kv.manager import KVCacheManager
from .kv.paged import PagedKVStore, model_kv_geometry
from .kv.quantized import QuantizedKVStore, check_kv_bits, reads_quantized
from .kv.recurrent import StateStore
from .kv.specs import model_family
from .kv.spill import DiskLink
from .leader import LeaderRunner
from .loop import Abort, Drain, LoopConfig, Message, StepLoop, Submit
from .runner import Runner
from .scheduler import Scheduler
from .speculative.model import DraftModel
from .stream import SeqStream
from .turns import PrefillSlicer
from .types import EngineStats, SeqRequest

__all__ = ["Engine", "EngineConfig", "EngineModel", "SeqStream"]

log = logging.getLogger("frink_mlx.engine.engine")


class Engine:
    def __init__(self, loaded: EngineModel, config: EngineConfig, gate: DecodeGate,
                 backend: Backend, *, channel: PlanChannel | None = None,
                 draft: EngineModel | None = None, disk: DiskTier | None = None) -> None:
        """`backend` prepares the model for the engine's forwards (backend/base.py);
        `channel`: this engine is rank 0 of a distributed group (module docstring);
        `draft`: the generation's draft model (engine/speculative/ rule 7; not distributed);
        `disk`: the daemon's SSD tier (module docstring)."""
        if not config.resolved or (channel is not None and (config.pipeline or config.spec)):
            raise ValueError("EngineConfig not resolved for this engine: build it with "
                             "engine/config.py resolve_engine_config")
        self.loaded = loaded
        self._channel = channel
        model = loaded.model
        self._dtype = model_dtype(loaded)
        self.cache_spec = engine_cache_spec(loaded, distributed=channel is not None)
        spec = config.spec
        self._draft = draft if spec is not None and spec.draft_num_blocks > 0 else None
        self.config = config
        self.gate = gate
        self._stream: Any = workers.stream_for(mx.default_device())
        has_state = self.cache_spec.has_state
        num_snapshots = (config.num_snapshots or 0) if has_state else 0
        self.kv = KVCacheManager(config.num_blocks, config.block_size,
                                 enable_caching=not has_state or num_snapshots > 0,
                                 num_state_slots=config.num_state_slots if has_state else 0,
                                 num_snapshots=num_snapshots,
                                 snapshot_interval_blocks=config.snapshot_interval_blocks,
                                 window=self._window())
        self.scheduler = Scheduler(
            self.kv, max_batch=config.max_batch,
            prefill_chunk_tokens=config.prefill_chunk_tokens, generation=config.generation,
            one_request_at_a_time=not config.batching,
            idle_prefill_tokens=config.idle_prefill_tokens, spec=config.spec,
            shared_prefill_tokens=config.shared_prefill_tokens)
        self.runner = self._new_runner(model, backend)
        if self.kv.windows is not None:
            self.runner.windowed_layers = self.cache_spec.windowed_pools()
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

    def _window(self) -> int | None:
        """The largest sliding window of a mixed model's entries, plus one (kv/window.py
        rule 4)."""
        return self.cache_spec.window_tokens

    def _link_disk(self, disk: DiskTier, backend: Backend) -> None:
        """The SSD tier, under the namespace of this model's content (kv/spill.py rule 1):
        its blocks (float or `kv_bits`), window parts and state snapshots (kv/diskparts.py);
        none for a model with recurrent layers but no snapshots (no prefix cache)."""
        spec = self.cache_spec
        has_state = spec is not None and spec.has_state
        if has_state and self.kv.snapshots is None:
            return
        parts = disk_parts(self.loaded.model, self.runner.store, backend.name,
                           windowed=self.runner.windowed_layers or [],
                           states=spec.states if spec is not None and has_state else ())
        self.scheduler.cache_namespace = parts.namespace.hex()
        self._loop.spill = DiskLink(disk, parts, self.kv, lambda: self.runner.store,
                                    lambda: self.runner.states)

    def _new_runner(self, model: Any, backend: Backend) -> Runner:
        forward, masks = backend.prepare_decoder(model), backend.device_token_masks()
        spec = self.cache_spec
        states = StateStore(spec.states, self.config.num_state_slots) if spec.has_state else None
        if self._channel is None:
            return Runner(model, self._new_store(), forward, device_masks=masks,
                          draft=self._new_draft(backend), cache_spec=spec, states=states)
        self._channel.on_lost.append(self._fail_in_flight)
        return LeaderRunner(model, self._new_store(), forward, channel=self._channel,
                            generation=self.config.generation, device_masks=masks,
                            cache_spec=spec, states=states)

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
                             dtype=model_dtype(self._draft))
        args = getattr(self.loaded.model, "args", None)  # qwen3_5's nests a text_config
        vocab = getattr(args, "vocab_size", 0) or getattr(args, "text_config", {}).get("vocab_size")
        return DraftModel(model, store, backend.prepare_decoder(model), int(vocab or 2**31 - 1))

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
        if (snaps := self.kv.snapshots) is not None and cache_spec is not None:  # kv/snapshots.py
            s.extra["state_snapshots_total"] = float(snaps.num_snapshots)
            s.extra["state_snapshots_used"] = float(snaps.num_used)
            s.extra["state_snapshot_bytes"] = float(snaps.num_snapshots * cache_spec.state_bytes_per_row)
        if (windows := self.kv.windows) is not None:  # kv/window.py
            s.window_tokens, s.window_blocks_total = windows.window, windows.pool.num_blocks
            s.window_blocks_used = windows.pool.num_used_blocks
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
