"""One engine's link to the SSD tier: idle blocks and state snapshots out to disk, a
prompt's longest run back in.

Why here and not in the block pool: the pool and the manager are integers
(no MLX, tests/test_layering.py), while copying a block's K/V out of the
paged pools or back into them is MLX work that must run on the engine thread
under the decode gate. So the pools only report a cached block going idle
(`BlockPool.on_idle`), and this module, called by the step loop (loop.py),
does the rest with disk.py's `DiskTier`; diskparts.py says what each file
holds (a block's full-attention part, its sliding-window part, the recurrent
state after it) and turns arrays into its bytes and back.

    block goes idle ──> pending ──snapshot()──> gather K/V (async) ──> tier.offer
      (its snapshot, if bound and ready) ──────> copy out (async) ───> tier.offer
    prompt added ──prefetch()──> tier.read(the files of the longest hit past RAM's)
                                  ... reader thread checks, assembles numpy ...
    poll() ──> promote: copy into free blocks, publish their hashes, free them
               (cached, at the LRU tail); a state into a snapshot id, bound
               ──> the scheduler admits the row with them counted as cached
               (scheduler rule 1)

Rules:
1. Namespace: the scheduler's extra key carries the engine's namespace
   (diskparts.py rule 1: weights digest, models/identity.py; KV dtype and bits;
   every layer's layout; block size; backend) instead of the generation
   number, so a block's hash names the same K/V in every process that loads
   the same weights (hashing.py).
2. A block part is written once its pool's block is idle (its last holder
   freed it) and still carries the hash it was freed with; a block evicted
   and reused before then is lost to the tier (`num_lost_blocks`), never
   written with someone else's K/V. Files already on disk are only touched
   (disk.py rule 2). A state snapshot goes out once its block's full part
   was written or found on disk, if a snapshot is bound to that block and
   ready (kv/snapshots.py rule 3), or, bound to a block already idle, once
   it is ready; one evicted before then is lost too. (Not at binding: a
   decoding row's tail moves every block and only its last one is kept.)
3. Snapshots never delay a step: a busy engine copies out at most
   `STEP_SNAPSHOT_BYTES` per step (of which state files, at least one a
   step when the queue has room, so a state larger than that share still
   goes out), and only as much as the writer queue has room for (disk.py
   rule 3); an idle engine copies out the rest while its inbox stays empty
   (`flush`). Copies are evaluated asynchronously; the writer thread only
   waits for their result and reads the host bytes.
4. A prompt whose RAM hit stops short of its rule-1 cap (manager rule 1)
   asks the tier for the files of the longest hit RAM and disk make
   together (diskparts.py rule 3): the deepest k whose blocks' full parts,
   window parts (lo(n)..k-1) and the state after block k-1 are each in RAM
   or on disk; those not in RAM are read. The row is held in the queue
   (`Group.loading`) until the read returns; what was read and checked is
   then in RAM like any cached block or snapshot, and the admission's own
   lookup finds the hit. A read that returns fewer files (missing, refused:
   disk.py rules 4-5), or a pool without room for all of them, promotes what
   it can; the rest is prefilled, so output never depends on the disk.
5. `Group.num_disk_tokens` (set at admission, scheduler rule 1) counts the
   admitted cached tokens past the RAM hit the prompt had when it arrived
   (those the read made possible); None when the tier is off.
"""

from __future__ import annotations

import queue
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import numpy as np

from ..plan import Group
from .block_pool import BlockPool, KVBlock
from .blockfile import KIND_BLOCK, KIND_STATE, KIND_WINDOW
from .disk import DiskTier, ReadJob, WriteJob
from .diskparts import DiskParts, PoolPart, StatePart
from .hashing import iter_block_hashes
from .manager import KVCacheManager
from .paged import PagedKVStore
from .recurrent import StateStore

STEP_SNAPSHOT_BYTES = 4 * 1024 * 1024     # rule 3, per busy step
FLUSH_CHUNK_BYTES = 64 * 1024 * 1024      # rule 3, per gather while idle
FROM_DISK = ("frink-kv-disk",)            # the row a snapshot read back is reserved for


@dataclass(slots=True)
class _Load:
    group: Group
    start_block: int
    end_block: int
    hashes: list[int]                      # the prompt's block hashes 0 .. end_block - 1
    files: list[tuple[int, int]]           # what is read: (kind, block index), in order
    cols: dict[int, list[int]] = field(default_factory=dict)   # kind -> block indices read
    blocks: dict[int, list[np.ndarray]] = field(default_factory=dict)  # kind -> unpacked runs
    state: memoryview | None = None


class _Out:
    """One pool's idle blocks waiting to be written (rule 2): block id -> its hash."""

    def __init__(self, part: PoolPart, pool: BlockPool) -> None:
        self.part, self.pool = part, pool
        self.pending: dict[int, int] = {}

    def on_idle(self, block_id: int, block_hash: int) -> None:
        self.pending[block_id] = block_hash


class DiskLink:
    """The tier as one engine uses it (module rules); engine thread only, except
    `_deliver`, which the tier's reader thread calls."""

    def __init__(self, tier: DiskTier, parts: DiskParts, kv: KVCacheManager,
                 store: Callable[[], PagedKVStore],
                 states: Callable[[], StateStore | None] = lambda: None) -> None:
        self.tier, self.parts, self.kv = tier, parts, kv
        self._store, self._states = store, states
        self._parts: dict[int, PoolPart | StatePart] = {
            kind: part for kind, part in ((KIND_BLOCK, parts.full), (KIND_WINDOW, parts.window),
                                          (KIND_STATE, parts.state)) if part is not None}
        self._outs = [_Out(parts.full, kv.pool)]
        if parts.window is not None and kv.windows is not None:
            self._outs.append(_Out(parts.window, kv.windows.pool))
        self._state_pending: dict[int, None] = {}  # block hashes whose snapshot may go out
        self._short_of_room = False
        self._done: queue.SimpleQueue[_Load] = queue.SimpleQueue()
        self.num_loading = 0
        self.num_lost_blocks = 0
        for out in self._outs:
            out.pool.on_idle = out.on_idle
        if kv.snapshots is not None and parts.state is not None:
            kv.snapshots.on_bound = self._on_bound

    def _on_bound(self, block_hash: int) -> None:
        """Rule 2: a snapshot bound to a block already idle (one read back, or a block a
        recomputed row could not publish again: block_pool.py rule 6) goes out now; one
        bound to a held block goes when the block goes idle."""
        block = self.kv.pool.get_cached_block(block_hash)
        if block is None or block.ref_cnt == 0:
            self._state_pending[block_hash] = None

    def forget(self) -> None:
        """The pools were rebuilt (loop.py, failure rule 3): nothing pending is valid."""
        for out in self._outs:
            out.pending.clear()
        self._state_pending.clear()

    def _has_pending(self) -> bool:
        return bool(self._state_pending) or any(out.pending for out in self._outs)

    # -- out (rules 2, 3) --------------------------------------------------------

    def snapshot(self, max_bytes: int) -> int:
        """Copy out up to `max_bytes` of pending files; returns how many were queued."""
        self._short_of_room = False
        if not self.tier.enabled:
            self.forget()
            return 0
        queued, left = 0, max_bytes
        for out in self._outs:
            num = self._write_blocks(out, left)
            queued, left = queued + num, left - num * out.part.layout.file_nbytes
        if self._state_pending:
            queued += self._write_states(left)
        return queued

    def _write_blocks(self, out: _Out, max_bytes: int) -> int:
        limit = max(0, min(max_bytes, self.tier.room_bytes())) // out.part.layout.file_nbytes
        if not out.pending:
            return 0
        snaps = self.kv.snapshots if out.part is self.parts.full and self.parts.state else None
        ids: list[int] = []
        keys: list[int] = []
        for block_id, block_hash in list(out.pending.items()):
            key = out.part.key(block_hash)
            if out.pool.blocks[block_id].block_hash != block_hash:
                del out.pending[block_id]
                self.num_lost_blocks += 1
                continue
            if self.tier.has(key):
                del out.pending[block_id]
                self.tier.touch(key)
            elif len(ids) < limit:
                del out.pending[block_id]
                ids.append(block_id)
                keys.append(key)
            else:
                self._short_of_room = True
                continue
            if snaps is not None and snaps.find(block_hash) is not None:
                self._state_pending[block_hash] = None
        if ids:
            self.tier.offer(WriteJob(out.part.layout, keys, out.part.gather(self._store(), ids)))
        return len(ids)

    def _write_states(self, max_bytes: int) -> int:
        """Rule 2's snapshots, as many as `max_bytes` holds, at least one if the queue has room."""
        snaps, states, part = self.kv.snapshots, self._states(), self.parts.state
        if snaps is None or states is None or part is None:
            self._state_pending.clear()
            return 0
        size, queued = part.layout.file_nbytes, 0
        for block_hash in list(self._state_pending):
            found = snaps.find(block_hash)
            if found is None or not found[1]:  # gone: lost; not ready: the next call
                if found is None:
                    del self._state_pending[block_hash]
                continue
            key = part.key(block_hash)
            rows = states.snapshot_rows(found[0])
            if self.tier.has(key) or rows is None:
                del self._state_pending[block_hash]
                self.tier.touch(key)
                continue
            if queued and queued * size >= max_bytes or self.tier.room_bytes() < size:
                self._short_of_room = True
                break
            del self._state_pending[block_hash]
            queued += self.tier.offer(WriteJob(part.layout, [key], part.pack(rows)))
        return queued

    def flush(self, gate: AbstractContextManager[object], quiet: Callable[[], bool],
              until_s: float | None = None) -> None:
        """Rule 3, idle: snapshot every pending file while `quiet()` (and before `until_s`,
        time.monotonic()), waiting for room in the writer's queue when it is full."""
        while self._has_pending() and self.tier.enabled and quiet():
            if until_s is not None and time.monotonic() > until_s:
                return
            with gate:
                queued = self.snapshot(FLUSH_CHUNK_BYTES)
            if not queued:
                if not self._short_of_room:
                    return  # what is left waits for its snapshot to be ready
                time.sleep(0.01)  # the queue is full: the writer is busy

    # -- in (rule 4) ---------------------------------------------------------------

    def prefetch(self, group: Group) -> None:
        """Called when `group` joins the queue: start reading its files from disk."""
        group.num_disk_tokens = 0
        seq, bs = group.seqs[0], self.kv.block_size
        if not (self.tier.enabled and group.request.cache_prompt and self.kv.enable_caching):
            return
        ids = seq.key_ids(len(seq.token_ids))
        cap = (len(ids) - 1) // bs  # manager rule 1
        held, _ = self.kv.get_computed_blocks(ids, group.extra_key)
        start = len(held)
        if start >= cap:
            return
        hashes = [b.block_hash or 0 for b in held] + list(iter_block_hashes(
            ids, bs, group.extra_key, parent=held[-1].block_hash if held else None,
            start_block=start, stop_block=cap))
        end = self._deepest_hit(hashes, start)
        load = _Load(group, start, end, hashes[:end], self._files(hashes, start, end))
        if not load.files:
            return
        layouts = [self._parts[kind].layout for kind, _ in load.files]
        keys = [self._parts[kind].key(hashes[i]) for kind, i in load.files]
        if self.tier.read(ReadJob(layouts, keys, lambda p: self._deliver(load, p))):
            group.loading = True
            self.num_loading += 1

    def _deepest_hit(self, hashes: Sequence[int], start: int) -> int:
        """Rule 4: the deepest hit RAM and disk make together (diskparts.py rule 3)."""
        pool, run = self.kv.pool, start
        while run < len(hashes) and (pool.get_cached_block(hashes[run]) is not None
                                     or self.tier.has(hashes[run])):
            run += 1
        for end in range(run, start, -1):
            if self._state_at(hashes[end - 1]) != "none" and self._window_ok(hashes, end):
                return end
        return start

    def _state_at(self, block_hash: int) -> str:
        """Where the state after `block_hash` is: "ram", "disk", "none", or "ram" for a
        model without recurrent layers (nothing needed)."""
        snaps, part = self.kv.snapshots, self.parts.state
        if snaps is None or part is None:
            return "ram"
        found = snaps.find(block_hash)
        if found is not None and found[1]:
            return "ram"
        return "disk" if self.tier.has(part.key(block_hash)) else "none"

    def _window_ok(self, hashes: Sequence[int], end: int) -> bool:
        windows, part = self.kv.windows, self.parts.window
        if windows is None or part is None:
            return True
        lo = windows.first_needed(end * self.kv.block_size)
        return all(windows.pool.get_cached_block(h) is not None or self.tier.has(part.key(h))
                   for h in hashes[lo:end])

    def _files(self, hashes: Sequence[int], start: int, end: int) -> list[tuple[int, int]]:
        """What a hit of `end` blocks reads (rule 4): full parts, window parts, the state."""
        if end <= start:
            return []
        pool, windows = self.kv.pool, self.kv.windows
        files = [(KIND_BLOCK, i) for i in range(start, end) if pool.get_cached_block(hashes[i]) is None]
        if windows is not None and self.parts.window is not None:
            lo = windows.first_needed(end * self.kv.block_size)
            files += [(KIND_WINDOW, i) for i in range(lo, end)
                      if windows.pool.get_cached_block(hashes[i]) is None]
        if self._state_at(hashes[end - 1]) == "disk":
            files.append((KIND_STATE, end - 1))
        return files

    def _deliver(self, load: _Load, payloads: list[memoryview]) -> None:
        """Reader thread: the checked payloads unpacked into numpy (no MLX)."""
        read = load.files[:len(payloads)]
        for kind, part in ((KIND_BLOCK, self.parts.full), (KIND_WINDOW, self.parts.window)):
            mine = [p for (k, _), p in zip(read, payloads) if k == kind]
            if mine and part is not None:
                load.cols[kind] = [i for k, i in read if k == kind]
                load.blocks[kind] = part.unpack(mine)
        if read and read[-1][0] == KIND_STATE:
            load.state = payloads[-1]
        self._done.put(load)

    def poll(self, gate: AbstractContextManager[object]) -> None:
        """Promote every finished read (engine thread, each loop turn)."""
        while True:
            try:
                load = self._done.get_nowait()
            except queue.Empty:
                return
            self.num_loading -= 1
            group = load.group
            group.loading = False
            if (load.cols or load.state is not None) and group.seqs and \
                    group.seqs[0].finish is None:
                with gate:
                    self._promote(load)
                bs = self.kv.block_size
                group.disk_span = (load.start_block * bs, load.end_block * bs)

    def _promote(self, load: _Load) -> None:
        """Put what was read into RAM as cached blocks and a bound snapshot (rule 4)."""
        kept = self._protect(load)  # our own RAM prefix must not be evicted for its continuation
        try:
            self._promote_blocks(self.parts.full, self.kv.pool, load, KIND_BLOCK)
            windows = self.kv.windows
            if windows is not None and self.parts.window is not None:
                self._promote_blocks(self.parts.window, windows.pool, load, KIND_WINDOW)
            if load.state is not None:
                self._promote_state(load)
        finally:
            for pool, blocks in kept:
                pool.free_blocks(reversed(blocks))

    def _protect(self, load: _Load) -> list[tuple[BlockPool, list[KVBlock]]]:
        """Touch the hit's blocks already in RAM, in both pools (released after)."""
        pools = [(self.kv.pool, load.hashes)]
        if (windows := self.kv.windows) is not None:
            lo = windows.first_needed(load.end_block * self.kv.block_size)
            pools.append((windows.pool, load.hashes[lo:]))
        kept: list[tuple[BlockPool, list[KVBlock]]] = []
        for pool, hashes in pools:
            blocks = [b for b in map(pool.get_cached_block, hashes) if b is not None]
            pool.touch(blocks)
            kept.append((pool, blocks))
        return kept

    def _promote_blocks(self, part: PoolPart, pool: BlockPool, load: _Load, kind: int) -> None:
        cols, arrays = load.cols.get(kind), load.blocks.get(kind)
        if not cols or arrays is None:
            return
        todo = [j for j, i in enumerate(cols) if pool.get_cached_block(load.hashes[i]) is None]
        blocks = pool.get_new_blocks(min(len(todo), pool.num_free_blocks)) or []
        if blocks:
            part.scatter(self._store(), [b.block_id for b in blocks], todo[:len(blocks)], arrays)
        for block, j in zip(blocks, todo):
            pool.cache_full_block(block, load.hashes[cols[j]])
        pool.free_blocks(reversed(blocks))

    def _promote_state(self, load: _Load) -> None:
        snaps, states, part = self.kv.snapshots, self._states(), self.parts.state
        if snaps is None or states is None or part is None or load.state is None:
            return
        index = load.end_block - 1
        snap_id = snaps.reserve(FROM_DISK, (index + 1) * self.kv.block_size, load.hashes[index])
        if snap_id is not None:  # ready from the next step (kv/snapshots.py rule 3)
            states.put_snapshot(snap_id, part.unpack(load.state))
