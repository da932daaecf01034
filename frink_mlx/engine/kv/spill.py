"""One engine's link to the SSD tier: idle blocks out to disk, a prompt's run back in.

Why here and not in the block pool: the pool and the manager are integers
(no MLX, tests/test_layering.py), while copying a block's K/V out of the
paged pools or back into them is MLX work that must run on the engine thread
under the decode gate. So the pool only reports a cached block going idle
(`BlockPool.on_idle`), and this module, called by the step loop (loop.py),
does the rest with disk.py's `DiskTier` and blockfile.py's format.

    block goes idle ──> pending ──snapshot()──> gather K/V (async) ──> tier.offer
    prompt added ──prefetch()──> tier.read(leading run past the RAM hits)
                                  ... reader thread checks, assembles numpy ...
    poll() ──> promote: copy into free blocks, publish their hashes, free them
               (cached, at the LRU tail) ──> the scheduler admits the row with
               them counted as cached (scheduler rule 1)

Rules:
1. Namespace: the scheduler's extra key carries `BlockLayout.namespace` (model
   weights digest, models/identity.py; KV dtype; layer layout; block size;
   backend) instead of the generation number, so a block's hash names the
   same K/V in every process that loads the same weights (hashing.py).
2. A block is written once it is idle (its last holder freed it) and still
   carries the hash it was freed with; a block evicted and reused before
   its snapshot is lost to the tier (`num_lost_blocks`), never written with
   someone else's K/V. Blocks already on disk are only touched (disk.py rule 2).
3. Snapshots never delay a step: a busy engine copies out at most
   `STEP_SNAPSHOT_BYTES` per step, and only as much as the writer queue has
   room for (disk.py rule 3); an idle engine copies out the rest while its
   inbox stays empty (`flush`). The gather is evaluated asynchronously; the
   writer thread only waits for its result and reads the host bytes.
4. A prompt whose RAM hit stops short of its rule-1 cap (manager rule 1)
   asks the tier for the leading run of the following blocks that are on
   disk; the row is held in the queue (`Group.loading`) until the read
   returns, then promoted blocks are in RAM like any cached block. A read
   that returns fewer blocks (missing, refused: disk.py rules 4-5), or a
   pool without room for all of them, promotes what it can; the rest is
   prefilled, so output never depends on the disk.
5. `Group.num_disk_tokens` (set at admission, scheduler rule 1) counts the
   admitted cached tokens that came from disk; None when the tier is off.
"""

from __future__ import annotations

import hashlib
import queue
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

import mlx.core as mx
import numpy as np

from ...models.identity import weights_digest
from ..plan import Group
from .blockfile import BlockLayout
from .disk import DiskTier, ReadJob, WriteJob
from .hashing import iter_block_hashes
from .manager import KVCacheManager
from .paged import PagedKVStore

STEP_SNAPSHOT_BYTES = 4 * 1024 * 1024     # rule 3, per busy step
FLUSH_CHUNK_BYTES = 64 * 1024 * 1024      # rule 3, per gather while idle
_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_MX_BITS = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}


def disk_layout(model: object, store: PagedKVStore, backend_name: str) -> BlockLayout | None:
    """Rule 1's layout of `store`'s blocks for `model`; None for pools the tier cannot
    copy as one slab per layer (layers of different shapes)."""
    shapes = {tuple(k.shape) for k in store.keys} | {("v",) + tuple(v.shape) for v in store.values}
    if len(shapes) != 2:
        return None
    dtype = str(store.dtype).rpartition(".")[2]
    identity = (f"frink-kv-disk-1|weights={weights_digest(model)}|dtype={dtype}|"
                f"layers={store.num_layers}|kv_heads={store.n_kv_heads}|head_dim={store.head_dim}|"
                f"v_head_dim={store.v_head_dim}|block_size={store.block_size}|"
                f"backend={backend_name}")
    return BlockLayout(namespace=hashlib.blake2b(identity.encode(), digest_size=16).digest(),
                       num_layers=store.num_layers, n_kv_heads=store.n_kv_heads,
                       head_dim=store.head_dim, v_head_dim=store.v_head_dim,
                       block_size=store.block_size, dtype=dtype, itemsize=store.dtype.size)


@dataclass(slots=True)
class _Load:
    group: Group
    start_block: int
    hashes: list[int]


class _Snapshot:
    """Block payloads of one gather, read on the writer thread (rule 3)."""

    def __init__(self, keys: mx.array, values: mx.array, block_size: int) -> None:
        self._arrays: tuple[mx.array, mx.array] = (keys, values)
        self._host: tuple[np.ndarray, np.ndarray] | None = None
        self._bs = block_size

    def __call__(self, index: int) -> bytes:
        if self._host is None:  # waits for the gather, then reads host memory: no MLX op
            self._host = (np.asarray(self._arrays[0]), np.asarray(self._arrays[1]))
        keys, values = self._host
        cols = slice(index * self._bs, (index + 1) * self._bs)
        return keys[:, :, cols].tobytes() + values[:, :, cols].tobytes()


class DiskLink:
    """The tier as one engine uses it (module rules); engine thread only, except
    `_deliver`, which the tier's reader thread calls."""

    def __init__(self, tier: DiskTier, layout: BlockLayout, kv: KVCacheManager,
                 store: Callable[[], PagedKVStore]) -> None:
        self.tier, self.layout, self.kv = tier, layout, kv
        self._store = store
        self._pending: dict[int, int] = {}  # block id -> hash it was freed with (rule 2)
        self._done: queue.SimpleQueue[tuple[_Load, tuple[np.ndarray, np.ndarray] | None]] = \
            queue.SimpleQueue()
        self.num_loading = 0
        self.num_lost_blocks = 0
        kv.pool.on_idle = self._on_idle

    def _on_idle(self, block_id: int, block_hash: int) -> None:
        self._pending[block_id] = block_hash

    def forget(self) -> None:
        """The pools were rebuilt (loop.py, failure rule 3): nothing pending is valid."""
        self._pending.clear()

    # -- out (rules 2, 3) --------------------------------------------------------

    def snapshot(self, max_bytes: int) -> int:
        """Copy out up to `max_bytes` of pending blocks; returns how many were queued."""
        if not self.tier.enabled:
            self._pending.clear()
            return 0
        per_block = self.layout.file_nbytes
        limit = min(max_bytes, self.tier.room_bytes()) // per_block
        if not self._pending or not limit:
            return 0
        pool = self.kv.pool
        ids: list[int] = []
        hashes: list[int] = []
        for block_id, block_hash in list(self._pending.items()):
            if pool.blocks[block_id].block_hash != block_hash:
                del self._pending[block_id]
                self.num_lost_blocks += 1
            elif self.tier.has(block_hash):
                del self._pending[block_id]
                self.tier.touch(block_hash)
            elif len(ids) < limit:
                del self._pending[block_id]
                ids.append(block_id)
                hashes.append(block_hash)
        if ids:
            keys, values = self._gather(ids)
            self.tier.offer(WriteJob(self.layout, hashes, _Snapshot(keys, values,
                                                                    self.layout.block_size)))
        return len(ids)

    def flush(self, gate: AbstractContextManager[object], quiet: Callable[[], bool],
              until_s: float | None = None) -> None:
        """Rule 3, idle: snapshot every pending block while `quiet()` (and before `until_s`,
        time.monotonic()), waiting for room in the writer's queue when it is full."""
        while self._pending and self.tier.enabled and quiet():
            if until_s is not None and time.monotonic() > until_s:
                return
            with gate:
                queued = self.snapshot(FLUSH_CHUNK_BYTES)
            if not queued and self._pending:
                time.sleep(0.01)  # the queue is full: the writer is busy

    def _gather(self, block_ids: list[int]) -> tuple[mx.array, mx.array]:
        """(L, H, n * block_size, D) K and V of `block_ids`, as unsigned ints of the
        dtype's width (raw bits: numpy has no bfloat16), evaluating asynchronously."""
        store, bs = self._store(), self.layout.block_size
        slots = (np.asarray(block_ids)[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        rows = np.arange(store.n_kv_heads)[:, None] * (store.num_slots + 1) + slots[None, :]
        index = mx.array(rows.astype(np.int32))
        bits = _MX_BITS[self.layout.itemsize]

        def take(pools: list[mx.array]) -> mx.array:
            return mx.view(mx.stack([mx.take(p.reshape(-1, p.shape[-1]), index, axis=0)
                                     for p in pools]), bits)

        keys, values = take(store.keys), take(store.values)
        mx.async_eval(keys, values)
        return keys, values

    # -- in (rule 4) ---------------------------------------------------------------

    def prefetch(self, group: Group) -> None:
        """Called when `group` joins the queue: start reading its run of disk blocks."""
        group.num_disk_tokens = 0
        seq, bs = group.seqs[0], self.layout.block_size
        if not (self.tier.enabled and group.request.cache_prompt and self.kv.enable_caching):
            return
        cap = (len(seq.token_ids) - 1) // bs  # manager rule 1
        held, _ = self.kv.get_computed_blocks(seq.token_ids, group.extra_key)
        start = len(held)
        if start >= cap:
            return
        parent = held[-1].block_hash if held else None
        run: list[int] = []
        for block_hash in iter_block_hashes(seq.token_ids, bs, group.extra_key, parent=parent,
                                            start_block=start, stop_block=cap):
            if not self.tier.has(block_hash):
                break
            run.append(block_hash)
        load = _Load(group, start, run)
        if run and self.tier.read(ReadJob(self.layout, run, lambda p: self._deliver(load, p))):
            group.loading = True
            self.num_loading += 1

    def _deliver(self, load: _Load, payloads: list[memoryview]) -> None:
        """Reader thread: the checked payloads as (L, H, n * bs, D) K and V (numpy only)."""
        if not payloads:
            self._done.put((load, None))
            return
        lay, bs, n = self.layout, self.layout.block_size, len(payloads)
        bits = _BITS[lay.itemsize]
        keys = np.empty((lay.num_layers, lay.n_kv_heads, n * bs, lay.head_dim), bits)
        values = np.empty((lay.num_layers, lay.n_kv_heads, n * bs, lay.v_head_dim), bits)
        split = keys.size // n
        for j, payload in enumerate(payloads):
            flat = np.frombuffer(payload, bits)
            keys[:, :, j * bs:(j + 1) * bs] = flat[:split].reshape(keys.shape[:2] + (bs, -1))
            values[:, :, j * bs:(j + 1) * bs] = flat[split:].reshape(values.shape[:2] + (bs, -1))
        self._done.put((load, (keys, values)))

    def poll(self, gate: AbstractContextManager[object]) -> None:
        """Promote every finished read (engine thread, each loop turn)."""
        while True:
            try:
                load, arrays = self._done.get_nowait()
            except queue.Empty:
                return
            self.num_loading -= 1
            group = load.group
            group.loading = False
            if arrays is not None and group.seqs and group.seqs[0].finish is None:
                with gate:
                    num = self._promote(load, arrays)
                bs = self.layout.block_size
                group.disk_span = (load.start_block * bs, (load.start_block + num) * bs)

    def _promote(self, load: _Load, arrays: tuple[np.ndarray, np.ndarray]) -> int:
        """Copy a read run into free blocks and publish it; returns the run's length."""
        pool, bs = self.kv.pool, self.layout.block_size
        seq = load.group.seqs[0]
        num = arrays[0].shape[2] // bs
        held, _ = self.kv.get_computed_blocks(seq.token_ids, load.group.extra_key)
        pool.touch(held)  # our own RAM prefix must not be evicted for its continuation
        try:
            todo = [j for j, h in enumerate(load.hashes[:num]) if pool.get_cached_block(h) is None]
            todo = todo[:pool.num_free_blocks]
            blocks = pool.get_new_blocks(len(todo)) or []
            if blocks:
                self._scatter([b.block_id for b in blocks], todo, arrays)
            for block, j in zip(blocks, todo):
                pool.cache_full_block(block, load.hashes[j])
            pool.free_blocks(reversed(blocks))
        finally:
            pool.free_blocks(reversed(held))
        return num

    def _scatter(self, block_ids: list[int], cols: list[int],
                 arrays: tuple[np.ndarray, np.ndarray]) -> None:
        store, bs = self._store(), self.layout.block_size
        slots = (np.asarray(block_ids)[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        index = mx.array(slots.astype(np.int32))
        picks = (np.asarray(cols)[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        for pools, host in ((store.keys, arrays[0]), (store.values, arrays[1])):
            part = host if len(picks) == host.shape[2] else host[:, :, picks]
            for layer in range(store.num_layers):
                pools[layer][:, index] = mx.view(mx.array(part[layer]), store.dtype)
        mx.eval(store.arrays())
