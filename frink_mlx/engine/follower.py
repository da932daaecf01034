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
2. `Commit(g)`: wait for that load, then `gather` [ok, affordable blocks,
   split kind] from every rank. If every rank loaded and split it the same
   way, all build a pool of the smallest affordable size and g becomes live;
   else every rank drops it (the swap happens everywhere or nowhere).
3. `Step(g, plan)`: run the plan's forward on generation g.
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
        mx.eval(*parts, *runner.store.arrays())
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
        rows = self.channel.gather([int(offer is not None), offer.num_blocks if offer else 0,
                                    offer.split if offer else 0])
        if offer is None or not all(row[0] for row in rows):
            log.warning("generation %d dropped: not every rank loaded it", generation)
            return
        if len({row[2] for row in rows}) > 1:
            log.warning("generation %d dropped: the ranks split it differently "
                        "(distributed_split)", generation)
            return
        num_blocks = min(row[1] for row in rows)
        layers, heads, head_dim = model_kv_geometry(offer.model)
        store = PagedKVStore(num_layers=layers, num_blocks=num_blocks,
                             block_size=offer.block_size, n_kv_heads=heads,
                             head_dim=head_dim, dtype=offer.dtype)
        self.runners[generation] = Runner(offer.model, store, offer.forward)
        log.info("generation %d live: %d blocks of %d tokens", generation, num_blocks,
                 offer.block_size)

    def _free(self, generation: int) -> None:
        runner = self.runners.pop(generation, None)
        if runner is not None:
            runner.store.release()
            mx.clear_cache()
