"""StepLoop: what the engine's MLX thread does, step after step.

The loop, pipelined like mlx-lm's generate_step where that pays (on Metal,
see engine.py):

    forever:
        drain the inbox (block on it when there is nothing to do)
        expire requests that waited too long for the pool (-> Overloaded)
        if the in-flight step has rows whose next draw needs host values
            (grammar masks, penalties): read it back first
        plan step t+1 (scheduler, integers)
        with gate: dispatch step t+1 (runner; its decode inputs are step
            t's still-lazy tokens), then read step t back to the host
        scheduler.update(step t) -> StepOutputs to each stream (outputs.py)

So the device works on t+1 while the host turns step t into events. A row
that finished at step t costs one wasted row in step t+1. A step that sampled
first tokens (final prefill chunks) is read back before the next step is
dispatched, and without `pipeline` every step is (engine.py says why); so
is a step with verify rows (speculation, engine/speculative/): how many drafts a row
kept decides its next input and positions; and so is a step with a row
that would draft next (engine/speculative/ rule 4).

The inbox carries three messages, `Submit`, `Abort` and `Drain`; failure
rules 2 and 3 of engine.py are implemented here.

With the SSD tier (`spill`, kv/spill.py): a submitted prompt starts its disk
read at once, each turn promotes the reads that came back, each planned step
copies out a few idle blocks, an idle engine copies out the rest before it
waits on its inbox, and a draining one before it stops.
"""

from __future__ import annotations

import logging
import queue
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx

from ..errors import InvalidRequest, Overloaded
from .admission import QueueDepth
from .gate import DecodeGate
from .kv.manager import KVCacheManager
from .kv.paged import PagedKVStore
from .kv.spill import STEP_SNAPSHOT_BYTES, DiskLink
from .outputs import OutputRouter
from .runner import Runner, StepResult
from .sampling import LogitBias, RowSampler
from .scheduler import Finished, Scheduler, SchedulerOutput
from .stream import SeqStream
from .turns import PrefillSlicer
from .types import EngineFinish, EngineStats, SeqRequest

log = logging.getLogger("frink_mlx.engine.engine")

SPILL_FLUSH_S = 10.0  # how long a stopping engine may spend copying idle blocks out


@dataclass(frozen=True, slots=True)
class Submit:
    seq: SeqRequest
    stream: SeqStream


@dataclass(frozen=True, slots=True)
class Abort:
    request_id: str
    index: int | None  # None: every row


@dataclass(frozen=True, slots=True)
class Drain:
    deadline: float  # time.monotonic(): running rows may finish until then


Message = Submit | Abort | Drain


@dataclass(frozen=True, slots=True)
class LoopConfig:
    pipeline: bool
    queue_timeout_s: float
    admission_window_s: float


class StepLoop:
    """The MLX thread's loop over one engine's scheduler, runner and requests."""

    def __init__(self, config: LoopConfig, gate: DecodeGate, scheduler: Scheduler,
                 runner: Runner, kv: KVCacheManager, new_store: Callable[[], PagedKVStore],
                 inbox: queue.SimpleQueue[Message], depth: QueueDepth,
                 stats: EngineStats) -> None:
        self.config, self.gate = config, gate
        self.scheduler, self.runner, self.kv = scheduler, runner, kv
        self._new_store = new_store
        self._inbox, self._depth, self._stats = inbox, depth, stats
        self.router = OutputRouter(scheduler, stats)
        self.slicer: PrefillSlicer | None = None  # engine/turns.py; set by the engine
        self.spill: DiskLink | None = None  # the SSD tier (kv/spill.py); set by the engine
        self._note_step: Callable[[], None] | None = getattr(gate, "note_step", None)

    def run(self) -> None:
        """Step until a drain ends (see the module docstring); then end every request."""
        pending: StepResult | None = None
        drain_deadline: float | None = None
        while True:
            try:
                idle = pending is None and not self.scheduler.has_work
                if idle and self.spill is not None:
                    self.spill.flush(self.gate, self._inbox.empty)
                drain_deadline = self._drain_inbox(block=idle, deadline=drain_deadline)
                if self.spill is not None:
                    self.spill.poll(self.gate)
                if drain_deadline is not None and (idle or time.monotonic() > drain_deadline):
                    break
                self._expire_waiting()
                if pending is not None and (not self.config.pipeline or pending.must_read
                                            or self.router.needs_host(pending)
                                            or self._wants_drafts(pending)):
                    self._deliver(pending)
                    pending = None
                pending = self._step(pending)
            except Exception as exc:  # noqa: BLE001 - engine.py failure rule 3: no hang
                log.exception("engine loop failed; ending every live request")
                pending = None
                self._reset_after_eval_error(exc)
        try:
            if pending is not None:
                self._deliver(pending)
        finally:
            self._abort_all("abort", None)
            self._refuse_inbox()
            if self.spill is not None:  # a drained engine's blocks outlive it on disk
                self.spill.flush(self.gate, lambda: True, time.monotonic() + SPILL_FLUSH_S)
            mx.synchronize()  # nothing of ours may still run on the device after the join
            self.runner.forget_pending()  # no array of this thread's stream outlives it

    def _wants_drafts(self, step: StepResult) -> bool:
        """Speculation needs a row's last token on the host to draft (engine/speculative/ rule 4)."""
        speculator = self.scheduler.speculator
        return speculator is not None and speculator.wants_host(step.seq_ids, self.scheduler.seqs)

    def _refuse_inbox(self) -> None:
        """Streams submitted while the engine was stopping end with Overloaded."""
        while True:
            try:
                message = self._inbox.get_nowait()
            except queue.Empty:
                return
            if isinstance(message, Submit):
                message.stream._push(Overloaded("The engine is shutting down.", retry_after_s=1.0))

    def _drain_inbox(self, *, block: bool, deadline: float | None) -> float | None:
        """Take every message waiting in the inbox (blocking first when idle).

        Admission window: when the engine was idle, it keeps taking messages
        while they arrive less than `admission_window_s` apart (at most four
        windows), so a burst of requests that the HTTP side parses, renders
        and tokenizes one after another starts as one prefill step instead
        of a small step followed by a large one (each step streams all
        weights once; benchmarks/results/engine.md has the measurements). The window
        stays open only while `ArrivalForecast` expects more arrivals
        (admission.py): a lone follow-up, such as a chat's next turn, starts
        at once, and a burst of returning clients stops waiting once all of
        them are in.
        """
        try:
            message = self._inbox.get(timeout=0.05 if (block and deadline) else None) if block \
                else self._inbox.get_nowait()
        except queue.Empty:
            return deadline
        window = self.config.admission_window_s if block else 0.0
        until = time.monotonic() + 4 * window
        while True:
            if isinstance(message, Submit):
                self._admit(message.seq, message.stream)
            elif isinstance(message, Abort):
                self._finish(self.scheduler.abort(message.request_id, index=message.index))
            else:
                deadline = message.deadline
            now = time.monotonic()
            holding = deadline is None and window > 0 and self.router.forecast.expecting_more(now)
            wait = min(window, until - now) if holding else 0.0
            try:
                message = self._inbox.get(timeout=wait) if wait > 0 else self._inbox.get_nowait()
            except queue.Empty:
                return deadline

    def _admit(self, seq: SeqRequest, stream: SeqStream) -> None:
        self._depth.taken()
        router = self.router
        router.forecast.arrived(time.monotonic())
        if seq.request_id in router.streams:
            stream._push(InvalidRequest(f"request id {seq.request_id!r} is already running",
                                        param="request_id"))
            return
        group = self.scheduler.add(seq)
        if self.spill is not None:
            self.spill.prefetch(group)
        if seq.constraints and not all(hasattr(c, "masks_along") for c in seq.constraints):
            group.speculative = False  # a verify row needs every position's mask (engine/speculative/)
        self._recount_queue()
        router.streams[seq.request_id] = stream
        base_seed = seq.sampling.seed if seq.sampling.seed is not None else secrets.randbits(62)
        bias = LogitBias.of(seq.sampling.logit_bias)   # once per request (sampling rule 1)
        for row in group.seqs:
            constraint = seq.constraints[row.index] if seq.constraints else None
            router.samplers[row.seq_id] = RowSampler(seq.sampling, base_seed + row.index,
                                                     constraint, list(seq.prompt_ids), bias=bias)

    def _expire_waiting(self) -> None:
        """engine.py failure rule 2: requests refused KV space for `queue_timeout_s` end
        with Overloaded."""
        timeout_s = self.config.queue_timeout_s
        expired = self.scheduler.expire_waiting(timeout_s)
        if expired:
            self._recount_queue()
        for group in expired:
            for row in group.seqs:
                self.router.samplers.pop(row.seq_id, None)
            stream = self.router.streams.pop(group.request.request_id, None)
            if stream is not None:
                stream._push(Overloaded(
                    f"The request waited {timeout_s:.0f}s for KV cache space.",
                    retry_after_s=max(1.0, timeout_s / 4)))

    def _step(self, pending: StepResult | None) -> StepResult | None:
        """Plan and dispatch one step, then read back the previous one."""
        contended = getattr(self.gate, "contended", None)
        self.scheduler.contended = bool(contended()) if contended is not None else False
        slicer = self.slicer if self.scheduler.contended else None
        self.scheduler.sliced_prefill_tokens = slicer.chunk_tokens() if slicer else None
        plan = self.scheduler.schedule()
        if plan.decode or not plan.prefill:
            slicer = None  # engine/turns.py rule 1
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
                if self.spill is not None:  # before this step may overwrite an idle block
                    self.spill.snapshot(STEP_SNAPSHOT_BYTES)  # (kv/spill.py rule 2)
                result = self.runner.run(plan, self.router.samplers, slicer)
        except Exception as exc:  # noqa: BLE001 - engine.py failure rule 3
            if slicer is not None:  # its slices were evaluations: the pools are unknown
                raise
            log.exception("engine step failed while building")
            ids = set(plan.sample_seq_ids) | {c.seq_id for c in plan.prefill}
            self.router.fail_rows(ids, exc)
            self._recount_queue()
            self.runner.forget_pending()
            # blocks published when this step was planned were never written
            self.kv.reset_prefix_cache()
        if pending is not None:
            self._deliver(pending)
        self._stats.steps_total += 1
        return result

    def _mark_admitted(self, plan: SchedulerOutput) -> None:
        """engine.py failure rule 2: a request whose prefill is planned has left the queue."""
        for chunk in plan.prefill:
            seq = self.scheduler.seqs.get(chunk.seq_id)
            stream = self.router.streams.get(seq.group.request.request_id) if seq else None
            if stream is not None and not stream.admission_sent:
                stream._mark_admitted()

    def _deliver(self, step: StepResult) -> None:
        """Read one step back (engine.py failure rule 3) and hand its rows to the router."""
        try:
            with self.gate:
                rows = step.read()
        except Exception as exc:  # noqa: BLE001 - engine.py failure rule 3
            log.exception("engine step failed while evaluating")
            self._reset_after_eval_error(exc)
            return
        finally:
            if self._note_step is not None:
                self._note_step()  # gate.py rules 6 and 7: this step is over
        speculator = self.scheduler.speculator
        if speculator is not None and step.num_positions:
            speculator.cost.observe(step.num_positions, step.elapsed_s,
                                    step.context)  # engine/speculative/ rule 3
        self.router.deliver(step, rows)

    def _finish(self, finished: list[Finished]) -> None:
        self._recount_queue()
        self.router.finish_rows(finished)

    def _recount_queue(self) -> None:
        self._depth.set_waiting(sum(1 for g in self.scheduler.waiting if not g.activated))

    def _reset_after_eval_error(self, exc: BaseException) -> None:
        """engine.py failure rule 3: the pools' contents are unknown; end every row, rebuild them."""
        self.runner.forget_pending()
        self._abort_all("error", f"engine step failed: {exc}")
        self.runner.store = None  # type: ignore[assignment]  # drop the old pools first
        self.runner.store = self._new_store()
        self.runner.reset_states()
        if self.runner.draft is not None:
            self.runner.draft.reset_store()
        self.kv.reset_prefix_cache()
        if self.spill is not None:
            self.spill.forget()

    def _abort_all(self, reason: EngineFinish, error: str | None) -> None:
        self.router.abort_all(reason, error)
        self._recount_queue()
