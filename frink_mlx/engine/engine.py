"""The engine: one thread that owns every MLX call for one loaded model.

Why one thread: MLX work must not interleave across threads (see gate.py),
and continuous batching needs one place that sees every live sequence. The
event loop only talks to it through a thread-safe inbox (submit, abort) and
per-request `SeqStream`s (StepOutputs pushed with `call_soon_threadsafe`).

The loop, pipelined like mlx-lm's generate_step where that pays (on Metal, see below):

    forever:
        drain the inbox (block on it when there is nothing to do)
        expire requests that waited too long for the pool (-> Overloaded)
        if the in-flight step has rows whose next draw needs host values
            (grammar masks, penalties): read it back first
        plan step t+1 (scheduler, integers)
        with gate: dispatch step t+1 (runner; its decode inputs are step
            t's still-lazy tokens), then read step t back to the host
        scheduler.update(step t) -> StepOutputs to each stream

So the device works on t+1 while the host turns step t into events. A row
that finished at step t costs one wasted row in step t+1.

Exception: a step that sampled first tokens (final prefill chunks) is read
back before the next step is dispatched. On the CPU backend `mx.async_eval`
blocks until all but ~10 of a step's ~1,000 tasks are done (MLX bounds the
tasks in flight), so "dispatch t+1, then read t" held every request's first
token back by a whole decode step (measured: a turn-2 prefill of 32 tokens
took 0.40 s and reached its client at 0.51 s).

Pipelining is therefore a Metal feature: `EngineConfig.pipeline` comes from
`default_pipeline()` unless the setting says otherwise. On the CPU backend
the device cannot run ahead of the host anyway (the blocking above), and
building step t+1's graph while step t still runs only competes with the
compute threads for the cores: over HTTP on the 2-core build machine, one
client got 9.1 / 9.3 / 8.7 tok/s pipelined against 11.6 / 12.7 / 10.6 not
(alternating runs), 8 clients 48.9 / 50.3 against 47.9 / 54.5, 16 clients
66.5 against 66.7. (In process, without the HTTP side, 8 clients had shown
~5% the other way: 49.3 vs 46.9.)

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
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import queue
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any

from ..core.checks import check_sampling
from ..errors import ContextLengthExceeded, InvalidRequest, Overloaded
from ..backend.cpu import split as cpu_split
from .admission import ArrivalForecast
from .gate import DecodeGate
from .kv.manager import KVCacheManager
from .kv.paged import PagedKVStore, model_kv_geometry
from .runner import Runner, StepResult
from .sampling import RowSampler
from .scheduler import Finished, Scheduler, Seq
from .stream import SeqStream
from .types import EngineStats, SeqRequest, StepOutput

__all__ = ["Engine", "EngineConfig", "SeqStream"]

log = logging.getLogger(__name__)


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
    pipeline: bool | None = None             # None: default_pipeline(); see the module docstring
    admission_window_s: float = 0.0          # see _drain_inbox
    matmul_parts: int | None = None          # cpu_split.py; None = one per usable core


class Engine:
    def __init__(self, loaded: Any, config: EngineConfig, gate: DecodeGate) -> None:
        self.loaded = loaded
        if config.pipeline is None:
            config = dataclasses.replace(config, pipeline=default_pipeline())
        self.config = config
        self.gate = gate
        model = loaded.model
        self._geometry = model_kv_geometry(model)
        self._dtype = getattr(loaded, "dtype", None) or _param_dtype(model)
        self._stream = _new_stream()
        self._side_streams = cpu_split.setup(model, config.matmul_parts)
        self.store = self._new_store()
        self.kv = KVCacheManager(config.num_blocks, config.block_size)
        self.scheduler = Scheduler(
            self.kv, max_batch=config.max_batch,
            prefill_chunk_tokens=config.prefill_chunk_tokens, generation=config.generation,
            one_request_at_a_time=not config.batching,
            idle_prefill_tokens=config.idle_prefill_tokens)
        self.runner = Runner(model, self.store, self._side_streams)
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._streams: dict[str, SeqStream] = {}
        self._samplers: dict[int, RowSampler] = {}
        self._reported: set[int] = set()
        self._forecast = ArrivalForecast()
        self._queue_lock = threading.Lock()
        self._num_inbox = 0       # submitted, not yet seen by the MLX thread
        self._num_waiting = 0     # never-started requests in the scheduler's queue
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._stats = EngineStats(num_blocks_total=config.num_blocks, block_size=config.block_size,
                                  context_ceiling=config.context_ceiling)

    def _new_store(self) -> PagedKVStore:
        layers, heads, head_dim = self._geometry
        return PagedKVStore(num_layers=layers, num_blocks=self.config.num_blocks,
                            block_size=self.config.block_size, n_kv_heads=heads,
                            head_dim=head_dim, dtype=self._dtype)

    # -- public API (any thread) -------------------------------------------------

    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._main, name="frink-engine", daemon=True)
        self._thread.start()

    def submit(self, seq: SeqRequest) -> SeqStream:
        """Validate (rule 1) and enqueue; the stream yields this request's outputs."""
        if self._stopping:
            raise Overloaded("The engine is shutting down.", retry_after_s=1.0)
        seq = self._validated(seq)
        with self._queue_lock:
            depth = self._num_inbox + self._num_waiting
            if depth >= self.config.max_queue:
                raise Overloaded(
                    f"{depth} requests are already waiting (max_queue "
                    f"{self.config.max_queue}); retry later.",
                    retry_after_s=max(1.0, depth / max(1, self.config.max_batch)))
            self._num_inbox += 1
        stream = SeqStream(seq.request_id, max(1, seq.n), self.abort)
        self._inbox.put(("submit", (seq, stream)))
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
        self._inbox.put(("abort", (request_id, index)))

    def stats(self) -> EngineStats:
        s, sch = self._stats, self.scheduler
        s.num_blocks_used = self.kv.num_used_blocks
        s.num_blocks_cached = self.kv.num_cached_blocks
        s.num_running = len(sch.running)
        s.num_waiting = self._num_inbox + self._num_waiting
        s.prefix_hit_tokens_total = sch.prefix_hit_tokens_total
        s.prompt_tokens_total = sch.prompt_tokens_total
        s.extra["num_preemptions"] = float(sch.num_preemptions)
        store = self.store  # may be swapped by the MLX thread after an error
        if store is not None and store.keys:
            s.extra["kv_pool_bytes"] = float(store.nbytes)
        return dataclasses.replace(s, extra=dict(s.extra))

    def shutdown(self, timeout_s: float) -> None:
        """Let running rows finish for up to timeout_s, abort the rest, join the thread."""
        self._stopping = True
        self._inbox.put(("drain", time.monotonic() + max(0.0, timeout_s)))
        if self._thread is not None:
            self._thread.join(timeout=max(0.0, timeout_s) + 30.0)
            if not self._thread.is_alive():
                self._release_arrays()
            self._thread = None

    def _release_arrays(self) -> None:
        """Hand the KV pools and the thread's stream back now, not at interpreter exit
        (MLX aborts if they are torn down after its own globals)."""
        self._stats.extra["kv_pool_bytes"] = float(self.store.nbytes)
        self.runner.forget_pending()
        self.store.release()
        self._stream = None
        gc.collect()

    # -- the MLX thread --------------------------------------------------------------

    def _main(self) -> None:
        import mlx.core as mx

        # One explicit stream made by the constructing thread (as mlx-lm's
        # generation_stream): a thread-local default stream created on this
        # thread would be torn down at exit while its worker still runs.
        try:
            with mx.stream(self._stream):
                self._loop()
        finally:
            # This thread's streams (and their worker threads) end with it, not at
            # interpreter exit, where MLX's teardown may find a worker still
            # joinable and abort the process ("terminate called without an
            # active exception", seen in ~1 of 8 `frink-mlx generate` runs).
            _clear_thread_streams()

    def _loop(self) -> None:
        pending: StepResult | None = None
        drain_deadline: float | None = None
        while True:
            try:
                idle = pending is None and not self.scheduler.has_work
                drain_deadline = self._drain_inbox(block=idle, deadline=drain_deadline)
                if drain_deadline is not None and (idle or time.monotonic() > drain_deadline):
                    break
                self._expire_waiting()
                if pending is not None and (not self.config.pipeline or pending.has_first_tokens
                                            or _needs_host(pending, self._samplers)):
                    self._deliver(pending)
                    pending = None
                pending = self._step(pending)
            except Exception as exc:  # noqa: BLE001 - rule 3: a bug here must not hang anyone
                log.exception("engine loop failed; ending every live request")
                pending = None
                self._reset_after_eval_error(exc)
        try:
            if pending is not None:
                self._deliver(pending)
        finally:
            self._abort_all("abort", None)
            self._refuse_inbox()
            _synchronize()  # nothing of ours may still run on the device after the join
            self.runner.forget_pending()  # no array of this thread's stream outlives it

    def _refuse_inbox(self) -> None:
        """Streams submitted while the engine was stopping end with Overloaded."""
        while True:
            try:
                kind, payload = self._inbox.get_nowait()
            except queue.Empty:
                return
            if kind == "submit":
                payload[1]._push(Overloaded("The engine is shutting down.", retry_after_s=1.0))

    def _drain_inbox(self, *, block: bool, deadline: float | None) -> float | None:
        """Take every message waiting in the inbox (blocking first when idle).

        Admission window: when the engine was idle, it keeps taking messages
        while they arrive less than `admission_window_s` apart (at most four
        windows), so a burst of requests that the HTTP side parses, renders
        and tokenizes one after another starts as one prefill step
        instead of a small step followed by a large one (each step streams all
        weights once). Measured here, 8 HTTP clients: 60 tok/s and TTFT p95
        1.23 s with 25 ms, 54 / 1.38 s with 10 ms, 56 / 1.60 s with none.
        The window stays open only while `ArrivalForecast` expects more
        arrivals (admission.py): a lone follow-up, such as a chat's next turn,
        starts at once, and a burst of returning clients stops waiting once
        all of them are in.
        """
        try:
            item = self._inbox.get(timeout=0.05 if (block and deadline) else None) if block \
                else self._inbox.get_nowait()
        except queue.Empty:
            return deadline
        window = self.config.admission_window_s if block else 0.0
        until = time.monotonic() + 4 * window
        while True:
            kind, payload = item
            if kind == "submit":
                self._admit(*payload)
            elif kind == "abort":
                request_id, index = payload
                self._finish_rows(self.scheduler.abort(request_id, index=index))
            elif kind == "drain":
                deadline = payload
            now = time.monotonic()
            holding = deadline is None and window > 0 and self._forecast.expecting_more(now)
            wait = min(window, until - now) if holding else 0.0
            try:
                item = self._inbox.get(timeout=wait) if wait > 0 else self._inbox.get_nowait()
            except queue.Empty:
                return deadline

    def _admit(self, seq: SeqRequest, stream: SeqStream) -> None:
        with self._queue_lock:
            self._num_inbox -= 1
        self._forecast.arrived(time.monotonic())
        if seq.request_id in self._streams:
            stream._push(InvalidRequest(f"request id {seq.request_id!r} is already running",
                                        param="request_id"))
            return
        group = self.scheduler.add(seq)
        self._recount_queue()
        self._streams[seq.request_id] = stream
        base_seed = seq.sampling.seed if seq.sampling.seed is not None else secrets.randbits(62)
        for row in group.seqs:
            constraint = seq.constraints[row.index] if seq.constraints else None
            self._samplers[row.seq_id] = RowSampler(seq.sampling, base_seed + row.index, constraint,
                                                    list(seq.prompt_ids))

    def _expire_waiting(self) -> None:
        expired = self.scheduler.expire_waiting(self.config.queue_timeout_s)
        if expired:
            self._recount_queue()
        for group in expired:
            for row in group.seqs:
                self._samplers.pop(row.seq_id, None)
            stream = self._streams.pop(group.request.request_id, None)
            if stream is not None:
                stream._push(Overloaded(
                    f"The request waited {self.config.queue_timeout_s:.0f}s for KV cache space.",
                    retry_after_s=max(1.0, self.config.queue_timeout_s / 4)))

    def _step(self, pending: StepResult | None) -> StepResult | None:
        """Plan and dispatch one step, then read back the previous one."""
        plan = self.scheduler.schedule()
        self._recount_queue()
        self._mark_admitted(plan)
        if plan.is_empty:
            if pending is not None:
                self._deliver(pending)
            elif self.scheduler.has_work:
                time.sleep(0.005)  # blocked on the pool; aborts or timeouts will free it
            return None
        result: StepResult | None = None
        try:
            with self.gate:
                result = self.runner.run(plan, self._samplers)
        except Exception as exc:  # noqa: BLE001 - rule 3: this step's rows end, the engine goes on
            log.exception("engine step failed while building")
            ids = set(plan.sample_seq_ids) | {c.seq_id for c in plan.prefill}
            self._fail_rows(ids, exc)
            self.runner.forget_pending()
            # blocks published when this step was planned were never written
            self.kv.reset_prefix_cache()
        if pending is not None:
            self._deliver(pending)
        self._stats.steps_total += 1
        return result

    def _mark_admitted(self, plan: Any) -> None:
        """Failure rule 2: a request whose prefill is planned has left the queue."""
        for chunk in plan.prefill:
            seq = self.scheduler.seqs.get(chunk.seq_id)
            stream = self._streams.get(seq.group.request.request_id) if seq else None
            if stream is not None and not stream.admission_sent:
                stream._mark_admitted()

    def _deliver(self, step: StepResult) -> None:
        """Read one step back and turn it into StepOutputs (and finishes)."""
        try:
            with self.gate:
                rows = step.read()
        except Exception as exc:  # noqa: BLE001 - rule 3
            log.exception("engine step failed while evaluating")
            self._reset_after_eval_error(exc)
            return
        live: dict[int, Seq] = {}
        stop: dict[int, Any] = {}
        for seq_id, row in zip(step.seq_ids, rows):
            seq = self.scheduler.seqs.get(seq_id)
            if seq is None or seq.num_pending == 0:
                continue
            live[seq_id] = seq
            sampler = self._samplers.get(seq_id)
            if sampler is not None:
                sampler.history.append(row.token_id)
                reason = _constraint_verdict(sampler, row.token_id)
                if reason is not None:
                    stop[seq_id] = reason
        finished = {f.seq.seq_id: f for f in self.scheduler.update(
            step.seq_ids, [r.token_id for r in rows], stop)}
        outputs: dict[str, list[StepOutput]] = {}
        for seq_id, row in zip(step.seq_ids, rows):
            seq = live.get(seq_id)
            if seq is None:
                continue
            done = finished.get(seq_id)
            error = done.error if done else None
            if done is not None and done.reason == "constraint" and error is None:
                error = _constraint_error(self._samplers.get(seq_id))
            out = StepOutput(seq.index, row.token_id, row.logprob, row.top_logprobs,
                             finish=done.reason if done else None, error=error)
            self._first_output(seq, out)
            outputs.setdefault(seq.group.request.request_id, []).append(out)
            self._stats.generated_tokens_total += 1
            if done:
                self._samplers.pop(seq_id, None)
        self._push_outputs(outputs)

    def _first_output(self, seq: Seq, out: StepOutput) -> None:
        """Usage numbers ride on each row's first output; forget rows that end."""
        if seq.seq_id not in self._reported:
            self._reported.add(seq.seq_id)
            out.num_prompt_tokens = seq.num_prompt
            out.num_cached_tokens = seq.group.num_cached_tokens
        if out.finish is not None:
            self._reported.discard(seq.seq_id)

    def _push_outputs(self, outputs: dict[str, list[StepOutput]]) -> None:
        for request_id, outs in outputs.items():
            stream = self._streams.get(request_id)
            if stream is None:
                continue
            stream._push(outs)
            if any(o.finish for o in outs) and not self._group_alive(request_id):
                self._close_stream(request_id)

    def _group_alive(self, request_id: str) -> bool:
        return any(s.group.request.request_id == request_id for s in self.scheduler.seqs.values())

    def _close_stream(self, request_id: str) -> None:
        if self._streams.pop(request_id, None) is not None:
            self._forecast.finished(time.monotonic())

    def _finish_rows(self, finished: list[Finished]) -> None:
        outputs: dict[str, list[StepOutput]] = {}
        for f in finished:
            self._samplers.pop(f.seq.seq_id, None)
            out = StepOutput(f.seq.index, None, finish=f.reason, error=f.error)
            self._first_output(f.seq, out)
            outputs.setdefault(f.seq.group.request.request_id, []).append(out)
        self._recount_queue()
        self._push_outputs(outputs)

    def _recount_queue(self) -> None:
        self._num_waiting = sum(1 for g in self.scheduler.waiting if not g.activated)

    def _fail_rows(self, seq_ids: set[int], exc: BaseException) -> None:
        message = f"engine step failed: {exc}"
        done: list[Finished] = []
        for seq_id in seq_ids:
            seq = self.scheduler.seqs.get(seq_id)
            if seq is not None:
                done += self.scheduler.abort(seq.group.request.request_id, "error", message)
        self._finish_rows(done)

    def _reset_after_eval_error(self, exc: BaseException) -> None:
        self.runner.forget_pending()
        self._abort_all("error", f"engine step failed: {exc}")
        self.store = None  # type: ignore[assignment]  # drop the old pools before the new ones
        self.runner.store = None  # type: ignore[assignment]
        self.store = self._new_store()
        self.runner.store = self.store
        self.kv.reset_prefix_cache()

    def _abort_all(self, reason: Any, error: str | None) -> None:
        ids = {s.group.request.request_id for s in self.scheduler.seqs.values()}
        done: list[Finished] = []
        for request_id in ids:
            done += self.scheduler.abort(request_id, reason, error)
        self._finish_rows(done)


def _needs_host(step: StepResult, samplers: dict[int, RowSampler]) -> bool:
    return any((s := samplers.get(i)) is not None and s.needs_host_tokens for i in step.seq_ids)


def _constraint_error(sampler: RowSampler | None) -> str:
    """Why a row's grammar ended it (RowConstraint.error), for the client."""
    c = sampler.constraint if sampler is not None else None
    return (c.error if c is not None else None) or \
        "Structured output failed: the grammar rejected the sampled token"


def _constraint_verdict(sampler: RowSampler, token_id: int) -> str | None:
    c = sampler.constraint
    if c is None:
        return None
    try:
        if not c.accept(token_id):
            return "constraint"
        return "eos" if c.is_done() else None
    except Exception:  # noqa: BLE001 - a broken matcher ends its row, not the engine
        log.exception("row constraint failed")
        return "constraint"


def default_pipeline() -> bool:
    """Pipeline decode steps on a GPU (Metal), not on the CPU backend (module docstring)."""
    import mlx.core as mx

    return bool(mx.default_device().type == mx.DeviceType.gpu)


def _new_stream() -> Any:
    import mlx.core as mx

    return mx.new_thread_local_stream(mx.default_device())


def _clear_thread_streams() -> None:
    import mlx.core as mx

    mx.clear_streams()  # destroys the streams created on the calling thread


def _synchronize() -> None:
    import mlx.core as mx

    mx.synchronize()


def _param_dtype(model: Any) -> Any:
    from mlx.utils import tree_flatten

    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for _, value in params:
        return value.dtype
    raise ValueError("model has no parameters")
