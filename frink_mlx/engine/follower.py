"""The engine follower: what ranks 1..N-1 run instead of HTTP, the hub and a scheduler.

Why so little: rank 0 decides everything (admission, blocks, prefix hits,
chunking, aborts, sampling) and posts each step's plan (leader.py); a
follower only executes the same forward over its own paged KV pool, which
holds its share of the KV (its KV heads, or its pipeline stage's layers) at
the same block ids. Its pool mirrors rank 0's
block for block, so a block rank 0 frees (an abort, a finished row) is free
here too: nothing to tell the follower.

Messages, in the order rank 0 posts them (channel.py):
1. `Load(g, name)`: start loading generation g's shard in a worker thread,
   so steps of the generation still serving keep running meanwhile.
2. `Commit(g)`: wait for that load, then `gather` its `commit_row` from
   every rank: [ok, affordable blocks, split kind, affordable state
   snapshots, recurrent layers (0/1), window tables' w (0: none)]. If every
   rank loaded it, split it the same way and holds the same cache kinds
   (`disagreement`), all build pools of the smallest affordable size and g
   becomes live (rank 0 takes the fewest snapshots too); else every rank
   drops it (the swap happens everywhere or nowhere).
3. `Step(g, plan)`: run the plan's forward on generation g, over this
   rank's cache kinds (its part's probe, kv/specs.py): the plan names every
   state slot, snapshot and window block (leader.py rule 3), so the runner
   applies them here as on rank 0.
4. `Free(g)`: drop generation g (rank 0 shut its engine down).
5. `Ping`: nothing (rank 0 checking the group while idle). `Stop`: return.

A failure while running a step cannot be recovered: rank 0 would be waiting
inside an all-reduce this rank never reaches. The follower re-raises and
exits; rank 0 sees its peer go (channel.py rule 1).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx

from ..backend import ForwardScope
from .channel import Commit, Free, Load, Ping, PlanChannel, Step, Stop
from .kv.paged import PagedKVStore, model_kv_geometry
from .kv.recurrent import StateStore
from .kv.specs import ModelCacheSpec
from .leader import GroupRunner
from .runner import Runner

log = logging.getLogger("frink_mlx.engine.follower")


@dataclass(slots=True)
class ShardOffer:
    """One loaded shard and what this rank can afford for its KV pool."""

    model: Any
    dtype: Any
    forward: ForwardScope
    num_blocks: int
    block_size: int
    split: int = 0         # backend/distributed.py `split_code`: every rank must agree
    cache_spec: ModelCacheSpec | None = None  # this rank's part's cache kinds (kv/specs.py)
    num_state_slots: int = 0   # models/budget.py rule 7 (0: no recurrent layers)
    num_snapshots: int = 0     # models/budget.py rule 8: what this rank affords


def commit_row(offer: ShardOffer | None) -> list[int]:
    """This rank's answer to `Commit` (message 2); None: its load failed."""
    if offer is None:
        return [0] * 6
    spec = offer.cache_spec
    return [1, offer.num_blocks, offer.split, offer.num_snapshots,
            int(spec is not None and spec.has_state),
            (spec.window_tokens or 0) if spec is not None else 0]


def disagreement(rows: list[list[int]]) -> str | None:
    """Why the ranks' `commit_row`s cannot serve the generation together; None: they can.

    Tensor-split ranks hold the same layer kinds; pipeline stages may not, and
    the scheduler's slots and window tables are one for the whole group."""
    failed = [rank for rank, row in enumerate(rows) if not row[0]]
    if failed:
        return f"rank(s) {failed} could not load their shard (see their logs)"
    for column, what in ((2, "split it otherwise than rank 0 (give every rank the same "
                             "distributed_split)"),
                         (4, "hold recurrent layers where rank 0 does not, or none where it "
                             "does (pipeline stages of other kinds)"),
                         (5, "have another sliding window than rank 0's layers")):
        mixed = [rank for rank, row in enumerate(rows) if row[column] != rows[0][column]]
        if mixed:
            return f"rank(s) {mixed} {what}"
    return None


def follower_runner(offer: ShardOffer, num_blocks: int) -> Runner:
    """The runner of a live generation on this rank: pools of `num_blocks` blocks at its
    part's geometry, a state store for its recurrent layers, window tables where rank 0
    keeps them (`disagreement` made sure its w is this rank's)."""
    spec = offer.cache_spec
    if spec is None:
        layers, heads, head_dim = model_kv_geometry(offer.model)
        geometries = [(heads, head_dim, head_dim)] * layers
    else:
        geometries = spec.geometries()
    store = PagedKVStore(num_layers=len(geometries), num_blocks=num_blocks,
                         block_size=offer.block_size, n_kv_heads=0, head_dim=0,
                         dtype=offer.dtype, geometries=geometries)
    states = StateStore(spec.states, max(1, offer.num_state_slots)) \
        if spec is not None and spec.has_state else None
    runner = GroupRunner(offer.model, store, offer.forward, cache_spec=spec, states=states)
    if spec is not None and spec.window_tokens:
        runner.windowed_layers = spec.windowed_pools()
    return runner


@dataclass(slots=True)
class _PendingLoad:
    name: str
    thread: threading.Thread
    offer: ShardOffer | None = None
    error: str | None = None


@dataclass(slots=True)
class Follower:
    channel: PlanChannel
    load_shard: Callable[[str], ShardOffer]
    runners: dict[int, Runner] = field(default_factory=dict)
    pending: dict[int, _PendingLoad] = field(default_factory=dict)
    steps_total: int = 0

    def run(self) -> None:
        """Serve rank 0's messages until `Stop` (see the module docstring)."""
        while True:
            message = self.channel.receive()
            if isinstance(message, Step):
                self._step(message)
            elif isinstance(message, Load):
                self._start_load(message)
            elif isinstance(message, Commit):
                self._commit(message.generation)
            elif isinstance(message, Free):
                self._free(message.generation)
            elif isinstance(message, Stop):
                log.info("rank 0 stopped the group")
                return
            elif not isinstance(message, Ping):
                raise RuntimeError(f"unknown message {message!r}")

    def _step(self, message: Step) -> None:
        runner = self.runners.get(message.generation)
        if runner is None:
            raise RuntimeError(f"step for generation {message.generation}, which is not loaded here")
        parts = runner.forward(message.plan)
        mx.eval(*parts, *runner.pool_arrays())
        self.steps_total += 1

    def _start_load(self, message: Load) -> None:
        pending = _PendingLoad(message.model, threading.Thread(
            target=lambda: self._load(pending), name="frink-follower-load", daemon=True))
        self.pending[message.generation] = pending
        pending.thread.start()

    def _load(self, pending: _PendingLoad) -> None:
        started = time.perf_counter()
        try:
            pending.offer = self.load_shard(pending.name)
        except Exception as exc:  # noqa: BLE001 - reported to rank 0 as "not ok" at commit
            log.exception("loading %s failed", pending.name)
            pending.error = f"{type(exc).__name__}: {exc}"
            return
        log.info("loaded shard of %s in %.1fs", pending.name, time.perf_counter() - started)

    def _commit(self, generation: int) -> None:
        pending = self.pending.pop(generation, None)
        if pending is not None:
            pending.thread.join()
        offer = pending.offer if pending is not None else None
        rows = self.channel.gather(commit_row(offer))
        reason = disagreement(rows)
        if offer is None or reason is not None:
            log.warning("generation %d dropped: %s", generation, reason or "its load failed")
            return
        num_blocks = min(row[1] for row in rows)
        self.runners[generation] = follower_runner(offer, num_blocks)
        log.info("generation %d live: %d blocks of %d tokens", generation, num_blocks,
                 offer.block_size)

    def _free(self, generation: int) -> None:
        runner = self.runners.pop(generation, None)
        if runner is not None:
            runner.store.release()
            if runner.states is not None:
                runner.states.release()
            mx.clear_cache()
