"""OutputRouter: the MLX thread's per-request books, and the StepOutputs they send.

Why separate from the step loop (loop.py): the loop decides *when* a step is
planned, dispatched and read back; this module decides *what each request
hears* about it. It owns every per-request table of the engine thread (the
`SeqStream`s, each row's `RowSampler`, which rows have reported their usage,
the arrival forecast) and is the only place that pushes to a stream.

Rules:
1. A row's first output carries its usage (`num_prompt_tokens`,
   `num_cached_tokens`); outputs of one request in one step are pushed as one
   batch (one wake-up on the event loop).
2. A token is checked against the row's constraint before the scheduler sees
   it: a rejected token ends the row with finish "constraint" and the
   constraint's own error, a completed grammar ends it as "eos".
3. A request's stream is closed (dropped from the books) when its last row
   has finished; every finish, however it came (step, abort, error, expiry),
   goes through `finish_rows` or `deliver`, so no stream is left open.
4. A verify row (speculation, engine/speculative/) yields its accepted drafts and the
   token after them as several outputs of one step, checked by rule 2 in
   order (a verdict drops the tokens after it); the first carries
   `num_drafted` / `num_draft_accepted` for the request's usage.
"""

from __future__ import annotations

import logging
import time
from typing import Literal

from .admission import ArrivalForecast
from .runner import RowResult, StepResult
from .sampling import RowSampler
from .scheduler import Finished, Scheduler, Seq
from .stream import SeqStream
from .types import EngineFinish, EngineStats, StepOutput

log = logging.getLogger("frink_mlx.engine.engine")

StopReason = Literal["eos", "constraint"]


class OutputRouter:
    """Streams and samplers of the live requests, on the engine's MLX thread."""

    def __init__(self, scheduler: Scheduler, stats: EngineStats) -> None:
        self.scheduler = scheduler
        self._stats = stats
        self.streams: dict[str, SeqStream] = {}
        self.samplers: dict[int, RowSampler] = {}
        self.forecast = ArrivalForecast()
        self._reported: set[int] = set()

    def needs_host(self, step: StepResult) -> bool:
        """Whether a row of `step` draws its next token from host values (masks, penalties)."""
        return any((s := self.samplers.get(i)) is not None and s.needs_host_tokens
                   for i in step.seq_ids)

    def deliver(self, step: StepResult, rows: list[RowResult]) -> None:
        """Turn one read-back step into StepOutputs (and finishes), rules 1-4."""
        live: dict[int, tuple[Seq, int]] = {}
        stop: dict[int, EngineFinish] = {}
        kept: dict[int, list[RowResult]] = {}
        for seq_id, row in zip(step.seq_ids, rows):
            seq = self.scheduler.seqs.get(seq_id)
            if seq is None or seq.num_pending == 0:
                continue
            live[seq_id] = (seq, len(seq.token_ids))
            kept[seq_id] = self._checked(seq_id, [row, *row.following], stop)
        finished = {f.seq.seq_id: f for f in self.scheduler.update_rows(
            step.seq_ids, [[r.token_id for r in kept.get(s, [])] for s in step.seq_ids], stop)}
        outputs: dict[str, list[StepOutput]] = {}
        for seq_id, row in zip(step.seq_ids, rows):
            if seq_id not in live:
                continue
            seq, before = live[seq_id]
            emitted = kept[seq_id][:len(seq.token_ids) - before]
            done = finished.get(seq_id)
            outs = [StepOutput(seq.index, r.token_id, r.logprob, r.top_logprobs)
                    for r in emitted]
            if done is not None:
                error = done.error
                if done.reason == "constraint" and error is None:
                    error = _constraint_error(self.samplers.get(seq_id))
                outs[-1].finish, outs[-1].error = done.reason, error
                self.samplers.pop(seq_id, None)
            if seq.group.speculative:  # rule 4
                outs[0].num_drafted = row.num_drafted
                outs[0].num_draft_accepted = min(len(row.following), len(emitted))
            self._first_output(seq, outs[0])
            if done is not None:
                self._reported.discard(seq_id)
            outputs.setdefault(seq.group.request.request_id, []).extend(outs)
            self._stats.generated_tokens_total += len(outs)
        self.push_outputs(outputs)

    def _checked(self, seq_id: int, results: list[RowResult],
                 stop: dict[int, EngineFinish]) -> list[RowResult]:
        """Rule 2 over a row's tokens in order; the tokens up to the first verdict."""
        sampler = self.samplers.get(seq_id)
        if sampler is None:
            return results
        if results[0].num_drafted:
            sampler.step += len(results)  # draw number = output position (sampling.py rule 4)
        for j, result in enumerate(results):
            sampler.record(result.token_id)
            reason = _constraint_verdict(sampler, result.token_id)
            if reason is not None:
                stop[seq_id] = reason
                return results[:j + 1]
        return results

    def finish_rows(self, finished: list[Finished]) -> None:
        """Tell each finished row's request (rule 3)."""
        outputs: dict[str, list[StepOutput]] = {}
        for f in finished:
            self.samplers.pop(f.seq.seq_id, None)
            out = StepOutput(f.seq.index, None, finish=f.reason, error=f.error)
            self._first_output(f.seq, out)
            outputs.setdefault(f.seq.group.request.request_id, []).append(out)
        self.push_outputs(outputs)

    def fail_rows(self, seq_ids: set[int], exc: BaseException) -> None:
        """End the requests of `seq_ids` with finish "error" (a step that failed to build)."""
        message = f"engine step failed: {exc}"
        done: list[Finished] = []
        for seq_id in seq_ids:
            seq = self.scheduler.seqs.get(seq_id)
            if seq is not None:
                done += self.scheduler.abort(seq.group.request.request_id, "error", message)
        self.finish_rows(done)

    def abort_all(self, reason: EngineFinish, error: str | None) -> None:
        ids = {s.group.request.request_id for s in self.scheduler.seqs.values()}
        done: list[Finished] = []
        for request_id in ids:
            done += self.scheduler.abort(request_id, reason, error)
        self.finish_rows(done)

    def push_outputs(self, outputs: dict[str, list[StepOutput]]) -> None:
        for request_id, outs in outputs.items():
            stream = self.streams.get(request_id)
            if stream is None:
                continue
            stream._push(outs)
            if any(o.finish for o in outs) and not self._group_alive(request_id):
                self._close_stream(request_id)

    def _first_output(self, seq: Seq, out: StepOutput) -> None:
        """Rule 1: usage rides on each row's first output; forget rows that end."""
        if seq.seq_id not in self._reported:
            self._reported.add(seq.seq_id)
            out.num_prompt_tokens = seq.num_prompt
            out.num_cached_tokens = seq.group.num_cached_tokens
            out.num_disk_cached_tokens = seq.group.num_disk_tokens
        if out.finish is not None:
            self._reported.discard(seq.seq_id)

    def _group_alive(self, request_id: str) -> bool:
        return any(s.group.request.request_id == request_id for s in self.scheduler.seqs.values())

    def _close_stream(self, request_id: str) -> None:
        if self.streams.pop(request_id, None) is not None:
            self.forecast.finished(time.monotonic())


def _constraint_error(sampler: RowSampler | None) -> str:
    """Why a row's grammar ended it (RowConstraint.error), for the client."""
    c = sampler.constraint if sampler is not None else None
    return (c.error if c is not None else None) or \
        "Structured output failed: the grammar rejected the sampled token"


def _constraint_verdict(sampler: RowSampler, token_id: int) -> StopReason | None:
    """Rule 2: a token the row's constraint rejects ends it ("constraint"); a completed
    grammar ends it as "eos"."""
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
