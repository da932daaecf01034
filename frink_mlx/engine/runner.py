"""Executes one scheduler step with MLX: inputs, index arrays, forward, sampling.

Why separate from the scheduler: the plan is integers (testable, and made
while the previous step still runs); this module is the only place that
turns it into arrays and calls the stock mlx-lm model.

One step, in order:
0. Draft-model jobs (engine/speculative/ rule 7, speculative/model.py): their tokens fill
   the drafts of the rows the speculator gave to the draft model.
1. Block copies (and recurrent-state copies) for freshly forked rows (n > 1),
   see kv/paged.py and kv/recurrent.py; recurrent-state snapshots restored
   for prefix hits (kv/recurrent.py rule 7), and, once both forwards are
   built, taken at block boundaries (kv/snapshots.py rule 1);
   windowed layers: kv/caches.py rule 3.
2. Decode forward: every decoding row, one token each, shape (B, 1). A row
   whose input token was sampled by the previous step takes it straight
   from that step's (possibly still lazy) token array, so the engine can
   build step t+1 before reading step t back (mlx-lm's generate_step trick).
3. Prefill forward: the step's prompt chunks, right-padded to one length.
   Only the last real position of a *final* chunk goes through the LM head
   (for the model families we know how to split; others run the full head
   and slice), so non-final chunks never pay for the (L, vocab) matmul.
   Decode and prefill are separate calls: padding a decode row to a chunk
   length would waste compute. A model with recurrent layers (kv/specs.py)
   runs one prefill call per chunk length instead, never padded
   (kv/recurrent.py rule 4); its logits are put back in chunk order.
4. Sampling (sampling.py) over [decode rows; final chunk rows repeated once
   per sampled row], in `SchedulerOutput.sample_seq_ids` order.
   Speculation (engine/speculative/): a decode row with a draft of k tokens is a
   verify row, inputs [last token, d1..dk] at positions p..p+k, like a small
   prefill chunk whose every position is sampled; the decode call is then
   (B, 1 + longest draft), shorter rows padded (paged.py rule 4). Position
   j's sample is checked against d(j+1): `StepResult.read` keeps the tokens
   up to the first mismatch, so a verify row yields its accepted drafts plus
   the token after them (greedy: exactly what k + 1 plain steps would give).
5. `mx.async_eval` of the tokens and the KV pools; `StepResult.read()`
   blocks until the host has the values.

Both forwards run inside the `ForwardScope` the backend returned when it
prepared the model (backend/base.py): on the CPU backend that selects our own
attention, SwiGLU and RoPE and matmuls split over one MLX stream per core
(backend/cpu/); on Metal it is a no-op and stock mlx-lm runs.
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from ..backend import ForwardScope
from .heads import in_groups, pick, pick_all, split_head
from .kv.caches import copy_blocks, make_model_caches, window_layout
from .kv.layout import BatchLayout, RowSpan
from .kv.paged import PagedKVStore, groups_queries_per_kv_head, make_layer_caches
from .kv.recurrent import RowSlots, StateStore
from .kv.specs import ModelCacheSpec
from .sampling import RowSampler, SampleOutput, draft_samplers, sample
from .scheduler import DecodeRow, PrefillChunk, SchedulerOutput
from .speculative.model import DraftModel
from .turns import PrefillSlicer
from .types import ImageInputs, TopLogprob


@dataclass(slots=True)
class RowResult:
    token_id: int
    logprob: float | None = None
    top_logprobs: list[TopLogprob] | None = None
    num_drafted: int = 0  # a verify row's draft length; `following` are its accepted
    following: list[RowResult] = field(default_factory=list)  # tokens after token_id

    @property
    def token_ids(self) -> list[int]:
        return [self.token_id, *(r.token_id for r in self.following)]


class StepResult:
    """The lazy outputs of one dispatched step."""

    def __init__(self, seq_ids: list[int], out: SampleOutput | None, samplers: Sequence[RowSampler],
                 has_first_tokens: bool = False, drafts: Sequence[list[int]] | None = None,
                 num_positions: int = 0) -> None:
        self.seq_ids = seq_ids
        self.has_first_tokens = has_first_tokens  # a final prefill chunk sampled here
        self._out = out
        self._want_top = [s.params.top_logprobs for s in samplers]
        self._want_lp = [s.params.logprobs for s in samplers]
        self._drafts = list(drafts) if drafts is not None else [[] for _ in seq_ids]
        self.has_drafts = any(self._drafts)
        self.num_positions = num_positions  # decode-only step: rows x width (else 0)
        self.context = 0  # decode-only step: the longest row's tokens (engine/speculative/ rule 3)
        self.started_s = time.perf_counter()
        self.elapsed_s = 0.0

    @property
    def must_read(self) -> bool:
        """Read back before the next step is planned (first tokens, or verify rows)."""
        return self.has_first_tokens or self.has_drafts

    def wait(self) -> None:
        """Block until the step's tokens are computed (without reading them back)."""
        if self._out is not None:
            mx.eval(*self._out.arrays())

    def read(self) -> list[RowResult]:
        """Block until the step's tokens are on the host; one result per sampled row."""
        flat = self._read_positions()
        self.elapsed_s = time.perf_counter() - self.started_s
        if not self.has_drafts:
            return flat
        results, at = [], 0
        for draft in self._drafts:
            kept = [flat[at]]
            for j, token in enumerate(draft):  # position j checked d(j+1)
                if flat[at + j].token_id != token:
                    break
                kept.append(flat[at + j + 1])
            head = kept[0]
            head.num_drafted, head.following = len(draft), kept[1:]
            results.append(head)
            at += len(draft) + 1
        return results

    def _read_positions(self) -> list[RowResult]:
        if self._out is None:
            return []
        out = self._out
        tokens: list[int] = out.tokens.tolist()  # type: ignore[assignment]
        lps: list[float] | None = out.logprobs.tolist() if out.logprobs is not None else None  # type: ignore[assignment]
        top_ids: list[list[int]] | None = (
            out.top_ids.tolist() if out.top_ids is not None else None)  # type: ignore[assignment]
        top_vals: list[list[float]] | None = (
            out.top_logprobs.tolist() if out.top_logprobs is not None else None)  # type: ignore[assignment]
        results = []
        for i, tok in enumerate(tokens):
            res = RowResult(int(tok))
            if lps is not None and self._want_lp[i]:
                res.logprob = float(lps[i])
                k = self._want_top[i]
                if k and top_ids is not None and top_vals is not None:
                    res.top_logprobs = [TopLogprob(int(t), float(v))
                                        for t, v in zip(top_ids[i][:k], top_vals[i][:k])]
            results.append(res)
        return results


class Runner:
    def __init__(self, model: Any, store: PagedKVStore, forward: ForwardScope, *,
                 device_masks: bool = False, draft: DraftModel | None = None,
                 cache_spec: ModelCacheSpec | None = None,
                 states: StateStore | None = None) -> None:
        """`forward`: what `backend.prepare_decoder(model)` returned (module docstring);
        `device_masks`: the backend's `device_token_masks()` (constraints.py rule 5);
        `draft`: the generation's draft model (engine/speculative/ rule 7); `cache_spec`:
        the model's cache entries (kv/specs.py; None: one paged cache per layer),
        `states` the recurrent-state pools they need."""
        self.model = model
        self.draft = draft
        self.store = store
        self.cache_spec = cache_spec
        self.states = states
        self._forward = forward
        self._device_masks = device_masks
        self._split = split_head(model)
        self._grouped_mask = groups_queries_per_kv_head(model)  # kv/paged.py rule 5
        self._prev_tokens: mx.array | None = None
        self._prev_index: dict[int, int] = {}
        # step 1: the windowed layers' pools, set by the engine when rows carry window tables
        self.windowed_layers: list[int] | None = None

    def run(self, plan: SchedulerOutput, samplers: dict[int, RowSampler],
            sliced: PrefillSlicer | None = None) -> StepResult:
        """Dispatch one step (asynchronously); see the module docstring. `sliced`: run
        the forward's layers in gate turns first (engine/turns.py)."""
        self._fill_model_drafts(plan)
        started_s = time.perf_counter()  # the verify step alone is what rule 3 fits
        parts = self.forward(plan)
        if sliced is not None:
            sliced.run(self.layer_arrays(), sum(len(c.token_ids) for c in plan.prefill), started_s)
        seq_ids = plan.sample_seq_ids
        drafts = {row.seq_id: row.draft for row in plan.decode if row.draft}
        if not parts:
            mx.async_eval(self.pool_arrays())
            return StepResult([], None, [])
        rows, index = self._position_samplers(seq_ids, drafts, samplers)
        logits = parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=0)
        out = sample(logits, rows, device_masks=self._device_masks)
        self._prev_tokens = out.tokens
        self._prev_index = index
        mx.async_eval(*out.arrays(), *self.pool_arrays())
        positions = 0 if plan.prefill else len(plan.decode) * plan.width
        result = StepResult(seq_ids, out, rows, any(c.sample_seq_ids for c in plan.prefill),
                            [drafts.get(s, []) for s in seq_ids], positions)
        result.started_s = started_s
        if positions:  # the longest row's reach: every row attends that far (padded)
            result.context = max(row.position for row in plan.decode) + plan.width
        return result

    def _fill_model_drafts(self, plan: SchedulerOutput) -> None:
        """Step 0: the draft model's jobs; its tokens become the verify rows' drafts."""
        if not plan.draft_jobs:
            return
        if self.draft is None:
            raise RuntimeError("a step planned draft-model jobs but the engine has no draft model")
        drafts = self.draft.propose(plan.draft_jobs)
        for row in plan.decode:
            if row.num_model_draft:
                row.draft = drafts[row.seq_id]

    def forward(self, plan: SchedulerOutput) -> list[mx.array]:
        """Steps 1-3: the logits to sample from (decode rows, then final chunks' rows).

        A distributed follower (follower.py) runs this alone: the same forwards,
        hence the same all-reduces in the same order as rank 0, without sampling."""
        copy_blocks(self.store, plan.copies, plan.window_copies, self.windowed_layers)
        if self.states is not None:
            self.states.copy_slots(plan.state_copies)
            self.states.restore(plan.state_restores)  # kv/recurrent.py rules 7 and 8
            self.states.checkpoint([r.slot for r in plan.decode if r.draft])
        parts: list[mx.array] = []
        if plan.decode:
            parts.append(self._decode_by_width(plan.decode) if self.states is not None
                         else self._decode(plan.decode, plan.width))
            if plan.prefill:
                # Dispatch decode first: its gathers must run before the prefill's
                # scatters reach the same pools, or those scatters copy (paged.py rule 1).
                mx.async_eval(parts[0])
        if plan.prefill:
            final = self._prefill(plan.prefill)
            if final is not None:
                parts.append(final)
        if self.states is not None:
            self.states.snapshot(plan.state_snapshots)
        return parts

    @staticmethod
    def _position_samplers(seq_ids: list[int], drafts: dict[int, list[int]],
                           samplers: dict[int, RowSampler]
                           ) -> tuple[list[RowSampler], dict[int, int]]:
        """One sampler per sampled position (a verify row has 1 + k), and where each
        plain row's token sits (the next step's input)."""
        rows: list[RowSampler] = []
        index: dict[int, int] = {}
        for seq_id in seq_ids:
            draft = drafts.get(seq_id)
            if draft:
                rows += draft_samplers(samplers[seq_id], draft)
            else:
                index[seq_id] = len(rows)
                rows.append(samplers[seq_id])
        return rows, index

    def _caches(self, layout: BatchLayout, slots: list[int], starts: list[int],
                window: BatchLayout | None = None) -> list[Any]:
        if self.cache_spec is None:
            return make_layer_caches(self.store, layout, self._grouped_mask)
        rows = RowSlots(slots, [s == 0 for s in starts]) if self.states is not None else None
        return make_model_caches(self.cache_spec, self.store, self.states, layout, rows,
                                 self._grouped_mask, window)

    def pool_arrays(self) -> list[mx.array]:
        """Every KV and state pool, for `mx.eval` (do not keep the list)."""
        states = self.states.arrays() if self.states is not None else []
        if self.states is not None:
            self.states.settle()  # the caller evaluates them now (kv/recurrent.py rule 7)
        return [*self.store.arrays(), *states]

    def layer_arrays(self) -> list[list[mx.array]]:
        """The pools per cache entry in model order, for evaluating layer by layer (turns.py)."""
        store, spec = self.store, self.cache_spec
        if spec is None:
            return [store.layer_arrays(i) for i in range(store.num_layers)]
        return [store.layer_arrays(i) if kind == "attention" else
                self.states.layer_arrays(i) if self.states is not None else []
                for kind, i in spec.flat_order()]

    def reset_states(self) -> None:
        """New, zeroed state pools (after an evaluation error, engine.py failure rule 3)."""
        if self.states is not None:
            specs, num_slots = self.states.specs, self.states.num_slots
            self.states = None  # drop the old pools first
            self.states = StateStore(specs, num_slots)

    def forget_pending(self) -> None:
        """Drop the previous step's token array (after an error)."""
        self._prev_tokens = None
        self._prev_index = {}

    def _decode(self, rows: list[DecodeRow], width: int = 1) -> mx.array:
        """Logits of every sampled position: one per row, 1 + k for a verify row."""
        layout = BatchLayout([RowSpan(r.position, 1 + len(r.draft), r.block_table) for r in rows],
                             block_size=self.store.block_size, trash_slot=self.store.trash_slot)
        layout.rope_positions = rope_positions(
            [(r.images, r.position, 1 + len(r.draft)) for r in rows], width)
        inputs = self._decode_inputs(rows)[:, None]
        window = window_layout(self.store, layout, self.windowed_layers, [
            RowSpan(r.position, 1 + len(r.draft), r.window_table or []) for r in rows])
        caches = self._caches(layout, [r.slot for r in rows], [r.position for r in rows], window)
        if width == 1:
            with self._forward():
                logits = self.model(inputs, cache=caches)
            return logits[:, -1, :]
        drafts = np.zeros((len(rows), width - 1), dtype=np.int32)
        for i, r in enumerate(rows):
            drafts[i, :len(r.draft)] = r.draft
        x = mx.concatenate([inputs, mx.array(drafts)], axis=1)
        finals = [(i, len(r.draft), 1) for i, r in enumerate(rows)]
        with self._forward():
            if self._split is not None:
                body, head = self._split
                return head(pick_all(body(x, caches), finals))
            return pick_all(self.model(x, cache=caches), finals)

    def _decode_by_width(self, rows: list[DecodeRow]) -> mx.array:
        """A recurrent model's decode: one call per verify width, never padded
        (engine/speculative/ rule 8); logits put back in row order."""
        widths = [1 + len(r.draft) for r in rows]
        logits = in_groups(widths, widths, lambda idx: self._decode([rows[i] for i in idx],
                                                                     widths[idx[0]]))
        return logits if logits is not None else mx.zeros((0,))  # every call returns logits

    def _decode_inputs(self, rows: list[DecodeRow]) -> mx.array:
        if all(r.token_id is not None for r in rows):
            return mx.array([r.token_id for r in rows], dtype=mx.int32)
        if self._prev_tokens is None:
            raise RuntimeError("a decode row waits for a token no step produced")
        prev_n = self._prev_tokens.shape[0]
        known = [r.token_id for r in rows if r.token_id is not None]
        index, k = [], 0
        for r in rows:
            if r.token_id is None:
                index.append(self._prev_index[r.seq_id])
            else:
                index.append(prev_n + k)
                k += 1
        pool = self._prev_tokens
        if known:
            pool = mx.concatenate([pool, mx.array(known, dtype=mx.int32)])
        if index == list(range(prev_n)):
            return pool
        return pool[mx.array(index, dtype=mx.int32)]

    def _prefill(self, chunks: list[PrefillChunk]) -> mx.array | None:
        """Run the chunks; logits (one row per sampled row) of the final ones, or None.
        A recurrent model runs one call per chunk length (module docstring, step 3)."""
        if self.states is None:
            return self._prefill_call(chunks)
        return in_groups([len(c.token_ids) for c in chunks], [len(c.sample_seq_ids) for c in chunks],
                         lambda idx: self._prefill_call([chunks[i] for i in idx]))

    def _prefill_call(self, chunks: list[PrefillChunk]) -> mx.array | None:
        length = max(len(c.token_ids) for c in chunks)
        inputs = np.zeros((len(chunks), length), dtype=np.int32)
        for i, c in enumerate(chunks):
            inputs[i, :len(c.token_ids)] = c.token_ids
        layout = BatchLayout([RowSpan(c.start, len(c.token_ids), c.block_table) for c in chunks],
                             block_size=self.store.block_size, trash_slot=self.store.trash_slot)
        x = mx.array(inputs)
        embedded = image_embeddings(x, chunks)
        layout.rope_positions = rope_positions(
            [(c.images, c.start, len(c.token_ids)) for c in chunks], length)
        window = window_layout(self.store, layout, self.windowed_layers, [
            RowSpan(c.start, len(c.token_ids), c.window_table or []) for c in chunks])
        caches = self._caches(layout, [c.slot for c in chunks], [c.start for c in chunks], window)
        finals = [(i, len(c.token_ids) - 1, len(c.sample_seq_ids))
                  for i, c in enumerate(chunks) if c.sample_seq_ids]
        with self._forward():
            if embedded is not None:   # a vision prompt's chunk (types.py ImageInputs)
                logits = self.model(x, cache=caches, input_embeddings=embedded)
            elif self._split is not None:
                body, head = self._split
                hidden = body(x, caches)
                return head(pick(hidden, finals)) if finals else None
            else:
                logits = self.model(x, cache=caches)
        return pick(logits, finals) if finals else None


def image_embeddings(x: mx.array, chunks: list[PrefillChunk]) -> mx.array | None:
    """The batch's input embeddings when a chunk covers image positions, else None.

    Text positions get the language model's own embeddings of their ids; each
    image position the feature row of its image token (types.py ImageInputs)."""
    covered = []
    for i, chunk in enumerate(chunks):
        images = chunk.images
        if images is None:
            continue
        end = chunk.start + len(chunk.token_ids)
        lo = bisect.bisect_left(images.positions, chunk.start)
        hi = bisect.bisect_left(images.positions, end)
        if lo < hi:
            covered.append((i, images, lo, hi, chunk.start))
    if not covered:
        return None
    embedded = covered[0][1].embed(x)
    for i, images, lo, hi, start in covered:
        where = mx.array([p - start for p in images.positions[lo:hi]], dtype=mx.int32)
        rows = images.rows(lo, hi).astype(embedded.dtype)
        embedded[i, where] = rows
    return embedded


def rope_positions(rows: list[tuple[ImageInputs | None, int, int]], length: int
                   ) -> mx.array | None:
    """(3, B, length) M-RoPE position ids of a forward whose rows are (images, start,
    num_new), when a row's images give them (kv/paged.py rule 3), else None: the
    model then counts each row on from its offset. Rows without images and the
    padding past a row's tokens count on from their start too."""
    tables = [images.rope_positions(start, num) if images is not None else None
              for images, start, num in rows]
    if all(table is None for table in tables):
        return None
    ids = np.empty((3, len(rows), length), dtype=np.int32)
    for i, ((_, start, num), table) in enumerate(zip(rows, tables)):
        ids[:, i, :] = start + np.arange(length)
        if table is not None:
            ids[:, i, :num] = table
    return mx.array(ids)
