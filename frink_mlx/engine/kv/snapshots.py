"""Recurrent-state snapshots: the hybrid prefix cache's bookkeeping, in plain ints.

Why: a recurrent layer (kv/specs.py) folds every token it has seen into one
fixed-size state, so a prefix hit on the attention blocks alone would skip
the state of the tokens it covers. Snapshots of a row's state at block
boundaries, keyed by the same chained block hashes as the prefix cache
(kv/hashing.py), give a hit somewhere to restart the recurrent layers from:
the attention layers reuse their cached blocks up to the snapshot, the
recurrent layers restore it, prefill continues from there. This module says
which snapshot id holds what; kv/recurrent.py holds the arrays.

Terms: a *boundary* ends a block (a multiple of block_size); the *interval*
is `interval_blocks` K blocks, K * block_size tokens:

    positions  0 ........ 15 | 16 ........ 31 | 32 .. 37 | 38 ... 45   (block_size 4, K = 4)
    snapshots              16^             32^      36^          44^
                       kept (interval)     kept  kept (prompt end)  the row's tail (decode)
    a 38-token prompt's chunks stop at 16, 32 and 36; a later hit restarts at 44, 36, 32 or 16

Rules:
1. Taking. A row takes a snapshot whenever a forward leaves its state at a
   boundary b: a prefill chunk ending there (chunks stop at every multiple of
   the interval and at the prompt's last boundary: `stop`), or a decode step
   at position b - 1. A prefill snapshot is kept; a decode one is the row's
   *tail*: a row holds at most one, a new one releases the previous, so a
   decoding row costs one snapshot, not one per block, and a finished row
   leaves its last boundary behind. A chat's next turn restarts at that tail,
   or at the prompt's end where the history re-tokenizes differently from
   the tokens sampled (a detokenized reply rarely encodes back to the same
   ids).
2. Keys. A snapshot is bound to the hash of the block ending at b when the
   manager publishes that block: at once for prompt tokens, once its last
   token is read back for outputs. A row that is freed releases the
   snapshots it never bound, and those it took in the step being planned
   (a preempted row's step never runs).
3. Hits. The manager's walk over cached blocks (manager rule 1) is cut back
   to the deepest block whose hash has a ready snapshot. A snapshot is ready
   from the step after the one that took it: its arrays are set after that
   step's forward (runner.py), after the step's restores.
4. Eviction. There are `num_snapshots` ids, priced full in the memory budget
   (models/budget.py rule 8). When none is free, the least recently used
   bound snapshot whose block has left the prefix cache goes (it could never
   be hit again: the walk stops before it), else the least recently used
   bound one; a snapshot not yet bound is its row's and never goes.
5. Running out is a value: `reserve` returns None and no snapshot is taken.
6. The interval (`interval_blocks`), from memory: a snapshot costs no more
   than the K/V of the blocks it spans, and the snapshots can cover a pool
   full of cached blocks; and never shorter than the engine's largest
   prefill chunk, so a chunk is cut at most once (a hybrid's prefill keeps
   its step count; a chat's next turn restarts at the previous row's tail
   anyway): K = max(ceil(state bytes / block K/V bytes),
   ceil(num_blocks / num_snapshots), ceil(largest chunk / block_size)).
7. The SSD tier (kv/spill.py) writes a bound, ready snapshot out beside its
   block (`on_bound` tells it of each binding; `find` says whether one is
   ready), and one read back is `reserve`d and bound at once for its block's
   hash, like a prefill snapshot: ready from the next step, evicted by rule 4.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

SeqId = Hashable
ROLLBACK = -2  # a restore from the slot's own pre-verify state (engine/speculative/ rule 8)


def interval_blocks(num_blocks: int, num_snapshots: int, state_bytes: int,
                    block_kv_bytes: int, min_blocks: int = 1) -> int:
    """Rule 6: K, the blocks between two kept snapshots (`min_blocks`: the largest
    prefill chunk's)."""
    by_bytes = -(-state_bytes // max(1, block_kv_bytes))
    by_count = -(-num_blocks // max(1, num_snapshots))
    return max(1, min_blocks, by_bytes, by_count)


@dataclass(slots=True)
class _Snapshot:
    end: int                   # the tokens its state covers: positions [0, end)
    owner: SeqId | None        # the row that took it, while unbound or its tail
    seq_id: SeqId              # the row that took it
    step: int                  # the step that took it (rule 3)
    block_hash: int | None = None


class SnapshotIndex:
    """Which snapshot id holds the state after which block (module docstring)."""

    def __init__(self, num_snapshots: int, interval_blocks: int, block_size: int,
                 is_cached: Callable[[int], bool]) -> None:
        if num_snapshots < 1 or interval_blocks < 1:
            raise ValueError("num_snapshots and interval_blocks must be >= 1")
        self.num_snapshots = num_snapshots
        self.interval_tokens = interval_blocks * block_size
        self._block_size = block_size
        self._is_cached = is_cached
        self._free = list(range(num_snapshots))
        self._snaps: dict[int, _Snapshot] = {}
        self._by_hash: OrderedDict[int, int] = OrderedDict()  # LRU: oldest first
        self._tails: dict[SeqId, int] = {}
        self._unbound: dict[SeqId, list[int]] = {}
        self._step = 0
        self.on_bound: Callable[[int], None] | None = None  # rule 7: the SSD tier listens

    @property
    def num_used(self) -> int:
        return len(self._snaps)

    def new_step(self) -> None:
        """The scheduler plans a new step (rule 3)."""
        self._step += 1

    def stop(self, start: int, num_tokens: int, target: int) -> int:
        """A prefill chunk [start, start + num_tokens) of a prompt of `target` tokens, cut
        at the next multiple of the interval and at the prompt's last boundary (rule 1)."""
        edge = (start // self.interval_tokens + 1) * self.interval_tokens
        last = target // self._block_size * self._block_size
        return min(num_tokens, edge - start, last - start if last > start else num_tokens)

    def reserve(self, seq_id: SeqId, end: int, block_hash: int | None, *,
                tail: bool = False) -> int | None:
        """An id for `seq_id`'s state at boundary `end` (rule 1; `tail`: a decode step's),
        bound at once when the block's hash is known; None when it is cached already or
        no id is free (rule 5)."""
        if end <= 0 or end % self._block_size:
            return None
        if block_hash is not None and block_hash in self._by_hash:
            return None
        snap_id = self._take()
        if snap_id is None:
            return None
        snap = self._snaps[snap_id] = _Snapshot(end, seq_id, seq_id, self._step)
        if tail:  # the previous one goes
            previous = self._tails.get(seq_id)
            if previous is not None:
                self._release(previous)
            self._tails[seq_id] = snap_id
        if block_hash is None:
            self._unbound.setdefault(seq_id, []).append(snap_id)
        else:
            self._bind(snap_id, snap, block_hash)
        return snap_id

    def bind(self, seq_id: SeqId, end: int, block_hash: int) -> None:
        """The block ending at `end` was published under `block_hash` (rule 2)."""
        pending = self._unbound.get(seq_id)
        if not pending:
            return
        for snap_id in pending:
            snap = self._snaps[snap_id]
            if snap.end == end:
                pending.remove(snap_id)
                if block_hash in self._by_hash:
                    self._release(snap_id)
                else:
                    self._bind(snap_id, snap, block_hash)
                return

    def lookup(self, block_hashes: Sequence[int]) -> tuple[int, int]:
        """Rule 3: (blocks the hit keeps, the snapshot to restore); (0, -1) for none."""
        for index in range(len(block_hashes) - 1, -1, -1):
            snap_id = self._by_hash.get(block_hashes[index])
            if snap_id is not None and self._snaps[snap_id].step < self._step:
                self._by_hash.move_to_end(block_hashes[index])
                return index + 1, snap_id
        return 0, -1

    def find(self, block_hash: int) -> tuple[int, bool] | None:
        """The snapshot bound to `block_hash` and whether it is ready (rule 3), or None;
        not a hit (the LRU order stays): the SSD tier asks (kv/spill.py rule 2)."""
        snap_id = self._by_hash.get(block_hash)
        if snap_id is None:
            return None
        return snap_id, self._snaps[snap_id].step < self._step

    def release_seq(self, seq_id: SeqId, *, preempted: bool = False) -> None:
        """`seq_id` is freed (rule 2): its unbound snapshots go, and with `preempted`
        (freed while its step is planned) those of this step; its bound tail stays."""
        for snap_id in self._unbound.pop(seq_id, []):
            self._release(snap_id)
        tail = self._tails.pop(seq_id, None)
        if tail is not None:
            self._snaps[tail].owner = None
        if preempted:
            self.prune(this_step=True, owner=seq_id)

    def prune(self, *, this_step: bool = False, owner: SeqId | None = None) -> int:
        """Drop the bound snapshots whose blocks left the prefix cache, or with
        `this_step` those the step being planned took (its row's, given `owner`);
        how many went."""
        if this_step:
            gone = [snap_id for snap_id, snap in self._snaps.items()
                    if snap.step == self._step and (owner is None or snap.seq_id == owner)]
        else:
            gone = [snap_id for snap_id, snap in self._snaps.items()
                    if snap.block_hash is not None and not self._is_cached(snap.block_hash)]
        for snap_id in gone:
            self._release(snap_id)
        return len(gone)

    def _bind(self, snap_id: int, snap: _Snapshot, block_hash: int) -> None:
        snap.block_hash = block_hash
        self._by_hash[block_hash] = snap_id
        if self.on_bound is not None:  # rule 7
            self.on_bound(block_hash)
        if self._tails.get(snap.owner) != snap_id:
            snap.owner = None  # a kept snapshot belongs to the cache once bound

    def _take(self) -> int | None:
        """A free id, evicting by rule 4 when none is."""
        if self._free:
            return heapq.heappop(self._free)
        victim = next((i for i in self._by_hash.values()
                       if not self._is_cached(self._snaps[i].block_hash or 0)), None)
        if victim is None:
            victim = next(iter(self._by_hash.values()), None)
        if victim is None:
            return None
        self._release(victim)
        return heapq.heappop(self._free)

    def _release(self, snap_id: int) -> None:
        snap = self._snaps.pop(snap_id, None)
        if snap is None:
            return
        if snap.block_hash is not None and self._by_hash.get(snap.block_hash) == snap_id:
            del self._by_hash[snap.block_hash]
        if snap.owner is not None:
            if self._tails.get(snap.owner) == snap_id:
                del self._tails[snap.owner]
            pending = self._unbound.get(snap.owner)
            if pending and snap_id in pending:
                pending.remove(snap_id)
        heapq.heappush(self._free, snap_id)
