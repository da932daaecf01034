"""The draft model's forwards (rule 7 of engine/speculative/__init__.py), batched across rows.

Why a runner of its own: the draft model has its own weights, its own paged
KV pool and its own geometry, and it runs before the target's forward of
the same step (its tokens are the verify rows' inputs), so it cannot share
the target's calls. Its work per step, for the jobs the speculator planned:

    catch-up   one forward over every job's backlog (right-padded, like a
               prefill): the tokens its KV lacks, ending with the row's last
               token; the head runs on each drafting job's last position.
    draft      k - 1 more forwards of one token per still-drafting row, each
               feeding the previous argmax back (rows drafting fewer tokens
               leave the batch, so nobody writes slots it did not reserve).

The tokens stay lazy until the end: one read-back per step, after the last
forward. Drafts are the draft's argmax over the target's vocabulary (a
larger draft head's extra ids could never be verified), so they are the
point-mass drafts sampling.py rule 4 verifies.
"""

from __future__ import annotations

from typing import Any, cast

import mlx.core as mx
import numpy as np

from ...backend import ForwardScope
from ..heads import pick, split_head
from ..kv.layout import BatchLayout, RowSpan
from ..kv.paged import PagedKVStore, groups_queries_per_kv_head, make_layer_caches
from ..plan import DraftJob


class DraftModel:
    """A loaded draft model with its KV pool; `propose` runs one step's jobs."""

    def __init__(self, model: Any, store: PagedKVStore, forward: ForwardScope,
                 vocab_size: int) -> None:
        self.model = model
        self.store = store
        self._forward = forward
        self._split = split_head(model)
        self._grouped_mask = groups_queries_per_kv_head(model)
        self.vocab_size = vocab_size  # the target's: drafts never leave it

    def reset_store(self) -> None:
        """A fresh pool after an evaluation error (engine.py failure rule 3): the old
        one's contents are unknown, and every row that used it has ended."""
        old, self.store = self.store, None  # type: ignore[assignment]  # drop it first
        self.store = PagedKVStore(num_layers=old.num_layers, num_blocks=old.num_blocks,
                                  block_size=old.block_size, n_kv_heads=old.n_kv_heads,
                                  head_dim=old.head_dim, dtype=old.dtype,
                                  v_head_dim=old.v_head_dim)

    def propose(self, jobs: list[DraftJob]) -> dict[int, list[int]]:
        """Each drafting job's `num_draft` tokens, by seq id (catch-up-only jobs: none)."""
        if not jobs:
            return {}
        drafting = [i for i, job in enumerate(jobs) if job.num_draft > 0]
        first = self._catch_up(jobs, drafting)
        if first is None:
            mx.eval(*self.store.arrays())
            return {}
        active = [jobs[i] for i in drafting]
        steps: list[tuple[list[int], mx.array]] = [(list(range(len(active))), first)]
        last = first
        for step in range(1, max(job.num_draft for job in active)):
            rows = [i for i, job in enumerate(active) if job.num_draft > step]
            index = [steps[-1][0].index(i) for i in rows]
            inputs = last if len(index) == len(steps[-1][0]) else last[mx.array(index)]
            spans = [RowSpan(active[i].start + len(active[i].token_ids) + step - 1, 1,
                             active[i].block_table) for i in rows]
            last = self._argmax(self._run(inputs[:, None], spans)[:, -1, :])
            steps.append((rows, last))
        mx.eval(*(tokens for _, tokens in steps), *self.store.arrays())
        drafts: dict[int, list[int]] = {job.seq_id: [] for job in active}
        for rows, tokens in steps:
            ids = cast(list[int], tokens.tolist())  # one token id per row
            for i, token in zip(rows, ids):
                drafts[active[i].seq_id].append(int(token))
        return drafts

    def _catch_up(self, jobs: list[DraftJob], drafting: list[int]) -> mx.array | None:
        """Feed every job's backlog; the first draft token of each drafting job."""
        length = max(len(job.token_ids) for job in jobs)
        inputs = np.zeros((len(jobs), length), dtype=np.int32)
        for i, job in enumerate(jobs):
            inputs[i, :len(job.token_ids)] = job.token_ids
        spans = [RowSpan(job.start, len(job.token_ids), job.block_table) for job in jobs]
        finals = [(i, len(jobs[i].token_ids) - 1, 1) for i in drafting]
        layout = self._layout(spans)
        caches = make_layer_caches(self.store, layout, self._grouped_mask)
        x = mx.array(inputs)
        with self._forward():
            if self._split is not None:
                body, head = self._split
                hidden = body(x, caches)
                logits = head(pick(hidden, finals)) if finals else None
            else:
                out = self.model(x, cache=caches)
                logits = pick(out, finals) if finals else None
        if logits is None:
            return None
        return self._argmax(logits)

    def _run(self, x: mx.array, spans: list[RowSpan]) -> mx.array:
        caches = make_layer_caches(self.store, self._layout(spans), self._grouped_mask)
        with self._forward():
            logits: mx.array = self.model(x, cache=caches)
        return logits

    def _layout(self, spans: list[RowSpan]) -> BatchLayout:
        return BatchLayout(spans, block_size=self.store.block_size,
                           trash_slot=self.store.trash_slot)

    def _argmax(self, logits: mx.array) -> mx.array:
        return mx.argmax(logits[..., :self.vocab_size], axis=-1).astype(mx.int32)
