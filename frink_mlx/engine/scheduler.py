"""The continuous-batching scheduler: plans each engine step in integers.

Why integers only: the plan (who decodes, which prompt chunk is prefilled,
which blocks each row reads and writes) must be testable without a model,
and the engine must be able to plan step t+1 while step t still runs on the
device (pipelining, see engine.py). So this module never imports mlx; the
runner turns a `SchedulerOutput` into arrays.

Vocabulary: a *request* (`SeqRequest`, with n rows) becomes a `Group`; each
row is a `Seq` with its own block table in the `KVCacheManager`. A seq's
`token_ids` are its prompt plus every output token the host knows;
`num_pending` counts tokens already sampled on the device but not yet read
back (at most 1: the previous step's). `num_computed` counts positions whose
K/V is written or scheduled to be written.

Rules:
1. Admission is strict FIFO against the block budget: the head of the
   waiting queue is admitted only when its whole prefill target fits (after
   prefix-cache hits) and the batch has room for its n rows; if it does not,
   nobody behind it jumps the queue. A head still reading blocks from disk
   (kv/spill.py rule 4) waits for them (no shortage); they count as cached.
2. Every step decodes one token for every running seq whose prefill is done
   and whose `max_tokens` is not yet scheduled, and spends up to
   `prefill_chunk_tokens` on prefill chunks (running seqs first, then
   admissions), so a long prompt never stalls running streams. A step that
   decodes nothing has no stream to stall: it may spend `idle_prefill_tokens`
   (a burst of new prompts, or one long prompt, then runs in fewer, larger
   steps; each step streams every weight once, whatever its token count) --
   unless `contended` (another model's engine shares the gate, engine/gate.py
   rule 5): its streams wait one chunk per step, so chunks are cut to
   `shared_prefill_tokens`, or to `sliced_prefill_tokens` (set by the loop)
   in a step that decodes nothing and so runs a few layers per turn
   (engine/turns.py).
3. Decode needs one new slot per row per step; when the pool is out of
   blocks, the newest running seq is preempted (blocks freed, requeued at the
   head of the waiting queue, recomputed later from its prompt + outputs,
   mostly from the prefix cache) instead of failing anybody.
4. n > 1: row 0 prefills the prompt once; the step that runs its final chunk
   samples all n rows from the same logits and forks rows 1..n-1, which share
   the full blocks and get their own copy of the partial last block and of
   the recurrent state (`copies` / `state_copies`, run before the next forward).
5. A finished or aborted seq frees its blocks at once; a step already in
   flight may still write its (discarded) token into them, which is safe
   because the device runs steps in order.
5b. Speculation (engine/speculative/, `spec` set): after step 1's reservations a decode
   row whose last token is on the host may draft k tokens and reserve k more
   slots (never preempting for them); `update_rows` takes the accepted drafts
   plus one token, and rolls the row's positions and slots back to them (and its
   draft-model KV, engine/speculative/ rule 7, which ends with the row; a recurrent
   row's state: it replays its kept tokens as a chunk, engine/speculative/ rule 8).
6. Full blocks enter the prefix cache as soon as the step that writes them
   is planned (prompt chunks) or their tokens are known (outputs): every
   step that could read them runs later on the device, and inside one
   forward each layer writes all rows before any row reads. With recurrent
   layers a hit restores a state snapshot (kv/snapshots.py; `state_restores`
   before the forward), prefill chunks stop at its interval, and a row whose
   forward ends at a block boundary snapshots its state (`state_snapshots`).
"""

from __future__ import annotations

import time
from collections import deque
from typing import Iterable

from .kv.hashing import make_extra_key
from .kv.manager import KVCacheManager
from .plan import DecodeRow, Finished, Group, PrefillChunk, SchedulerOutput, Seq
from .speculative import SpecConfig, Speculator
from .types import EngineFinish, SeqRequest

__all__ = ["DecodeRow", "Finished", "Group", "PrefillChunk", "Scheduler", "SchedulerOutput", "Seq"]


class Scheduler:
    def __init__(
        self,
        kv: KVCacheManager,
        *,
        max_batch: int,
        prefill_chunk_tokens: int,
        generation: int = 0,
        one_request_at_a_time: bool = False,
        idle_prefill_tokens: int | None = None,
        shared_prefill_tokens: int | None = None,
        spec: SpecConfig | None = None,
        cache_namespace: str | None = None,
    ) -> None:
        if max_batch < 1 or prefill_chunk_tokens < 1:
            raise ValueError("max_batch and prefill_chunk_tokens must be >= 1")
        self.kv = kv
        self.max_batch = max_batch
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self.idle_prefill_tokens = max(prefill_chunk_tokens, idle_prefill_tokens or 0)
        self.contended = False  # rule 2: another engine shares the gate (engine/gate.py rule 5)
        self.shared_prefill_tokens = min(prefill_chunk_tokens,
                                         shared_prefill_tokens or prefill_chunk_tokens)
        self.sliced_prefill_tokens: int | None = None  # rule 2, engine/turns.py rule 3
        self.generation = generation
        self.cache_namespace = cache_namespace  # the extra key's, instead of generation (spill.py rule 1)
        self.one_request_at_a_time = one_request_at_a_time  # batching off
        self.waiting: deque[Group] = deque()
        self.running: list[Seq] = []
        self.seqs: dict[int, Seq] = {}
        self._next_seq_id = 0
        self._pending_copies: list[tuple[int, int, int]] = []
        self._pending_state_copies: list[tuple[int, int]] = []
        self._pending_window_copies: list[tuple[int, int, int]] = []
        self.prefix_hit_tokens_total = self.disk_hit_tokens_total = 0  # rule 1: of it, from disk
        self.prompt_tokens_total = 0
        self.num_preemptions = 0
        self.blocked_since_s: float | None = None  # see _track_shortage
        self._head_short = False
        self.speculator = Speculator(spec, kv) if spec is not None else None

    # -- requests in and out ----------------------------------------------------

    def add(self, request: SeqRequest, now_s: float | None = None) -> Group:
        spec = self.speculator
        group = Group(request, make_extra_key(self.cache_namespace or self.generation,
                                              request.cache_salt),
                      time.monotonic() if now_s is None else now_s,
                      speculative=request.speculative and spec is not None)
        for index in range(request.n if request.n > 1 else 1):
            seq = Seq(self._new_id(), group, index, list(request.prompt_ids),
                      len(request.prompt_ids), request.max_tokens)
            group.seqs.append(seq)
            self.seqs[seq.seq_id] = seq
        self.waiting.append(group)
        self.prompt_tokens_total += len(request.prompt_ids)
        return group

    def _new_id(self) -> int:
        self._next_seq_id += 1
        return self._next_seq_id

    def abort(self, request_id: str, reason: EngineFinish = "abort",
              error: str | None = None, *, index: int | None = None) -> list[Finished]:
        """End the live rows of `request_id` now (only row `index` when given);
        their blocks are freed.

        One row of a request whose prompt is still in its first prefill
        (rows not yet forked into the batch) cannot end alone without
        stranding its siblings, so that aborts the whole request; a stop string
        (the reason to end one row) can only match after the first token.
        """
        rows = [s for s in self.seqs.values()
                if s.group.request.request_id == request_id and s.finish is None]
        if index is not None and all(s.group.activated for s in rows):
            done = []
            for seq in rows:
                if seq.index == index:
                    self._drop_waiting(seq)
                    done.append(self._finish(seq, reason, error))
            return done
        for group in list(self.waiting):
            if group.request.request_id == request_id:
                self.waiting.remove(group)
        return [self._finish(seq, reason, error) for seq in rows]

    def expire_waiting(self, older_than_s: float, now_s: float | None = None) -> list[Group]:
        """Remove (and return) never-started requests refused for `older_than_s`.

        Only a shortage counts: time spent while the head of the queue could not
        be admitted for lack of KV blocks or batch rows (`blocked_since_s`), not
        time spent behind other prompts' prefill budget -- a burst of long
        prompts on a slow machine is slow, not full. Preempted rows already
        streamed output, so they wait as long as it takes.
        """
        if self.blocked_since_s is None:
            return []
        now = time.monotonic() if now_s is None else now_s
        expired = [g for g in self.waiting if not g.activated
                   and now - max(g.arrival_s, self.blocked_since_s) > older_than_s]
        for group in expired:
            self.waiting.remove(group)
            for seq in group.seqs:
                if seq.finish is None:
                    self._finish(seq, "error")
        return expired

    def _finish(self, seq: Seq, reason: EngineFinish, error: str | None = None) -> Finished:
        seq.finish = reason
        if seq in self.running:
            self.running.remove(seq)
        self.kv.free(seq.seq_id)
        if self.speculator is not None:
            self.speculator.forget(seq)
        self.seqs.pop(seq.seq_id, None)
        return Finished(seq, reason, error)

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    # -- planning ---------------------------------------------------------------

    def schedule(self, now_s: float | None = None) -> SchedulerOutput:
        """Plan one step.

        Algorithm:
          1. decode: for each running seq past prefill with outputs left, reserve
             one slot (preempting the newest running seq when out of blocks);
          2. prefill: give the chunk budget (rule 2: larger when step 1 decodes
             nobody) to running seqs still in prefill, in admission order;
          3. admit from the head of the waiting queue while the budget, the batch
             and the block pool allow (strict FIFO), each starting its first chunk.
        """
        out = SchedulerOutput(copies=self._pending_copies, state_copies=self._pending_state_copies,
                              window_copies=self._pending_window_copies)
        self._pending_copies, self._pending_state_copies, self._pending_window_copies = [], [], []
        self.kv.begin_step()
        self._plan_decode(out)
        budget = (self.shared_prefill_tokens if self.contended else
                  self.prefill_chunk_tokens if out.decode else self.idle_prefill_tokens)
        if self.contended and not out.decode and self.sliced_prefill_tokens:
            budget = self.sliced_prefill_tokens
        for seq in list(self.running):
            if budget <= 0:
                break
            if seq.in_prefill and seq.finish is None:
                budget -= self._plan_chunk(seq, budget, out)
        admitted = short = False
        while budget > 0 and self.waiting:
            if not self._admit_head():
                short = self._head_short
                break
            admitted = True
            budget -= self._plan_chunk(self.running[-1], budget, out)
        self._track_shortage(admitted, short, now_s)
        self.mark_sampled(out.sample_seq_ids)
        return out

    def _track_shortage(self, admitted: bool, short: bool, now_s: float | None) -> None:
        """Keep `blocked_since_s`: when the queue head started being refused for lack of
        blocks or rows (None while the queue moves or is empty); see expire_waiting."""
        if admitted or not self.waiting:
            self.blocked_since_s = None
        if short and self.blocked_since_s is None:
            self.blocked_since_s = time.monotonic() if now_s is None else now_s

    def _plan_decode(self, out: SchedulerOutput) -> None:
        for seq in list(self.running):
            if seq not in self.running or seq.in_prefill or seq.finish is not None:
                continue
            if seq.num_scheduled_outputs >= seq.max_tokens:
                continue
            self.kv.free_outside_window(seq.seq_id, seq.num_computed)  # kv/window.py rule 1
            if not self._reserve(seq, 1, out):
                continue  # seq itself was preempted
            position = seq.num_computed
            token = seq.token_ids[-1] if seq.num_pending == 0 else None
            out.decode.append(DecodeRow(seq.seq_id, position, [], token,
                                        images=seq.group.request.images))
            seq.num_computed += 1
            seq.num_scheduled_outputs += 1
        if self.speculator is not None:
            self.speculator.plan(out, self.seqs)
        for row in out.decode:  # tables once every reservation is done
            row.block_table = self.kv.block_table(row.seq_id)
            row.slot = self.kv.state_slot(row.seq_id)
            if not (row.draft or row.num_model_draft):  # a verify row's state waits (5b)
                self._snapshot(self.seqs[row.seq_id], out, tail=True)
            row.window_table = self.kv.window_table(row.seq_id)

    def _reserve(self, seq: Seq, num_tokens: int, out: SchedulerOutput) -> bool:
        """Grow seq's table by num_tokens, preempting the newest others; False if seq went."""
        while self.kv.allocate_slots(seq.seq_id, num_tokens) is None:
            victim = self.running[-1]
            self._preempt(victim, out)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Seq, out: SchedulerOutput) -> None:
        """Rule 3: free seq's blocks and put it back at the head of the queue."""
        self.running.remove(seq)
        out.preempted.append(seq.seq_id)
        out.decode = [row for row in out.decode if row.seq_id != seq.seq_id]
        self.num_preemptions += 1
        if self.speculator is not None:
            self.speculator.forget(seq)
        group = seq.group
        if not group.activated:  # row 0 of a request still in its first prefill
            for member in group.seqs:
                self.kv.free(member.seq_id, preempted=True)
                member.num_computed = member.prefill_target = 0
            self.waiting.appendleft(group)
            return
        self.kv.free(seq.seq_id, preempted=True)
        seq.num_computed = seq.prefill_target = 0
        seq.num_scheduled_outputs = seq.num_outputs
        solo = Group(group.request, group.extra_key, group.arrival_s, [seq],
                     group.num_cached_tokens, activated=True, speculative=group.speculative)
        seq.group = solo
        self.waiting.appendleft(solo)

    def _admit_head(self) -> bool:
        """Rule 1: admit the waiting head if its blocks and rows fit; else admit nobody."""
        group = self.waiting[0]
        seq = group.seqs[0]
        self._head_short = False
        if seq.num_pending or group.loading:  # last token on the device; blocks read from disk
            return False
        self._head_short = True  # every refusal below is a shortage of rows or blocks
        if len(self.running) + len(group.seqs) > self.max_batch:
            return False
        if self.one_request_at_a_time and self.running:
            return False
        cache_prompt = group.request.cache_prompt
        blocks, num_hit = self.kv.get_computed_blocks(seq.key_ids(len(seq.token_ids)),
                                                      group.extra_key, cache_prompt=cache_prompt)
        target = len(seq.token_ids)
        if self.kv.allocate_slots(seq.seq_id, target - num_hit, blocks) is None:
            return False
        if not group.activated and not self._fork_children(seq):
            self.kv.free(seq.seq_id)
            return False
        self._head_short = False
        self.waiting.popleft()
        seq.num_computed = num_hit
        seq.prefill_target = target
        if not group.activated:
            group.num_cached_tokens = num_hit
            self.prefix_hit_tokens_total += num_hit
            self.disk_hit_tokens_total += group.admitted_from_disk(num_hit)
        self.running.append(seq)
        return True

    def _fork_children(self, parent: Seq) -> bool:
        """Rule 4: open rows 1..n-1 on the parent's reserved prompt blocks, or roll back."""
        length = len(parent.token_ids)
        opened: list[Seq] = []
        for child in parent.group.seqs[1:]:
            num_shared = self.kv.fork(parent.seq_id, child.seq_id, length)
            opened.append(child)
            if self.kv.allocate_slots(child.seq_id, length - num_shared) is None:
                for member in opened:
                    self.kv.free(member.seq_id)
                return False
            child.num_computed = num_shared
        return True

    def _plan_chunk(self, seq: Seq, budget: int, out: SchedulerOutput) -> int:
        """Schedule the next prefill chunk of seq within budget; returns tokens used."""
        start = seq.num_computed
        num = self.kv.snapshot_stop(start, min(budget, seq.prefill_target - start), seq.prefill_target)
        self.kv.free_outside_window(seq.seq_id, start)  # kv/window.py rule 1
        chunk = PrefillChunk(seq.seq_id, seq.token_ids[start:start + num], start,
                             self.kv.block_table(seq.seq_id), [], self.kv.state_slot(seq.seq_id),
                             seq.group.request.images, self.kv.window_table(seq.seq_id))
        seq.num_computed += num
        # Publish now: any later reader runs after this chunk's writes (rule 6).
        self.kv.cache_blocks(seq.seq_id, seq.key_ids(seq.num_computed), seq.group.extra_key,
                             cache_prompt=seq.group.request.cache_prompt)
        restore = self.kv.take_restore(seq.seq_id)  # a snapshot, or a verify's ROLLBACK (5b)
        if restore != -1:
            out.state_restores.append((restore, chunk.slot))
        self._snapshot(seq, out)
        if not seq.in_prefill:
            chunk.sample_seq_ids = [seq.seq_id]
            seq.prefill_target = 0
            seq.num_scheduled_outputs = seq.num_outputs + 1
            if not seq.group.activated:
                chunk.sample_seq_ids += self._activate_children(seq)
        out.prefill.append(chunk)
        return num

    def _snapshot(self, seq: Seq, out: SchedulerOutput, tail: bool = False) -> None:
        """Rule 6: a forward leaving seq at a block boundary snapshots its state."""
        snap = self.kv.plan_snapshot(seq.seq_id, seq.num_computed, tail=tail,
                                     cache_prompt=seq.group.request.cache_prompt)
        if snap is not None:
            out.state_snapshots.append((self.kv.state_slot(seq.seq_id), snap))

    def _activate_children(self, parent: Seq) -> list[int]:
        """The parent's final chunk runs now: rows 1..n-1 join the batch next step."""
        group = parent.group
        group.activated = True
        length = len(parent.token_ids)
        for child in group.seqs[1:]:
            blocks, states = self.kv.fork_copies(parent.seq_id, child.seq_id,
                                                 child.num_computed, length)
            self._pending_copies += blocks
            self._pending_state_copies += states
            self._pending_window_copies += self.kv.window_fork_copy(
                parent.seq_id, child.seq_id, child.num_computed, length)
            child.num_computed = length
            child.num_scheduled_outputs = 1
            self.running.append(child)
        return [child.seq_id for child in group.seqs[1:]]

    # -- results ----------------------------------------------------------------

    def mark_sampled(self, seq_ids: Iterable[int]) -> None:
        """The planned step samples these rows; their tokens are pending until `update`."""
        for seq_id in seq_ids:
            seq = self.seqs.get(seq_id)
            if seq is not None:
                seq.num_pending += 1

    def update(self, seq_ids: list[int], token_ids: list[int],
               stop_reasons: dict[int, EngineFinish] | None = None) -> list[Finished]:
        """Record the one token each row of a step sampled; see `update_rows`."""
        return self.update_rows(seq_ids, [[t] for t in token_ids], stop_reasons)

    def update_rows(self, seq_ids: list[int], tokens: list[list[int]],
                    stop_reasons: dict[int, EngineFinish] | None = None) -> list[Finished]:
        """Record the tokens one step produced per row; returns the rows that finished.

        A row's tokens are one sampled token, or for a verify row (rule 5b) its
        accepted drafts and the token after them. Rows no longer live (aborted,
        finished or preempted meanwhile) are skipped. A row finishes on a stop
        token ("eos", later tokens dropped), its max_tokens ("length"), or a
        reason the engine supplies for its last token (constraint verdicts).
        """
        done: list[Finished] = []
        for seq_id, row_tokens in zip(seq_ids, tokens):
            seq = self.seqs.get(seq_id)
            if seq is None or seq.num_pending == 0:
                continue
            seq.num_pending -= 1
            num_kept = seq.append_until_end(row_tokens)
            given = (stop_reasons or {}).get(seq_id)  # it belongs to the last token
            reason = given if given is not None and num_kept == len(row_tokens) \
                else seq.end_reason
            if seq.num_drafted and self.speculator is not None:
                self.speculator.settle(seq, len(row_tokens) - 1)
            self._publish(seq)
            if reason is not None:
                self._drop_waiting(seq)
                done.append(self._finish(seq, reason))
        return done

    def _publish(self, seq: Seq) -> None:
        if seq.seq_id not in self.kv or seq.in_prefill:
            return
        known = min(len(seq.token_ids), seq.num_computed)
        self.kv.cache_blocks(seq.seq_id, seq.key_ids(known), seq.group.extra_key,
                             cache_prompt=seq.group.request.cache_prompt)

    def _drop_waiting(self, seq: Seq) -> None:
        for group in list(self.waiting):
            if seq in group.seqs:
                group.seqs.remove(seq)
                if not group.seqs:
                    self.waiting.remove(group)
