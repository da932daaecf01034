"""Sliding-window block tables: the blocks a windowed layer still reads, in plain ints.

Why: a sliding-window layer (Gemma 3 and 4, gpt-oss's alternating layers;
kv/specs.py `AttentionSpec.window`) attends to its last w positions, so a
row far past its window needs only the window's blocks for those layers,
not its whole history. Like vLLM v1's `SlidingWindowManager`
(single_type_kv_cache_manager.py), the windowed layers get their own block
table per row over their own `BlockPool` (same ids as their paged pools in
kv/paged.py), and blocks wholly outside the window go back to that pool.
The full-attention layers keep kv/manager.py's table, unchanged.

A row's window table runs beside its full table, one entry per block; a
freed entry is None (the runner reads the trash slot there, and the mask
hides it, paged.py rule 4):

    positions   0..3 | 4..7 | 8..11 | 12..15 | 16.. (block_size 4, window 6)
    full table     5 |    2 |     7 |      9 |  ...
    window table None| None |     3 |      8 |  ...  next query at 14: needs 9..14

Rules:
1. Before a forward whose first query of a row sits at position q, every
   block i with (i + 1) * block_size <= q - w + 1 is freed (`free_outside`):
   no query at q or later reads it (query q sees keys q-w+1 .. q). The
   scheduler calls it when it plans a chunk or a decode row; a step still in
   flight may read the block, which is safe because the device runs steps in
   order (scheduler rule 5's argument).
2. Blocks are allocated with the full table's (all or nothing across both
   pools, kv/manager.py rule 2), so the two tables have the same length.
3. The prefix cache: a windowed block gets the same chained hash as the full
   block at its index (published together) and, freed, keeps it like any
   cached block (block_pool.py): its K/V is intact until the pool hands it
   out again, which forgets the hash. A hit of k blocks (n = k * block_size
   tokens) needs, besides the full blocks 0..k-1, the windowed blocks the
   first new query reads: those holding positions n-w+1 .. n-1, i.e. block
   indices lo(n) = max(0, n-w+1) // block_size .. k-1, still findable by
   hash. The hit is the longest k for which they are (`longest_hit`); blocks
   before lo(n) open the row's window table as None. A freed block no longer
   findable (handed out again) can therefore never be a hit: only what the
   pool still maps is.
4. `w` is the largest window among the model's windowed layers plus one: a
   layer with a smaller window reads a subset, and its mask hides the rest;
   the one more position is for model files that ask their mask for one
   more key than their rotating cache keeps (plamo3: `window_size + 1`; it is
   now refused at load, kv/specs.py rule 4, but a file like it must still
   never see a freed block).
"""

from __future__ import annotations

from collections.abc import Sequence

from ...errors import EngineFailure
from .block_pool import BlockPool, KVBlock


class WindowTables:
    """The windowed layers' pool and the rules above; rows' tables live on `SeqBlocks`."""

    def __init__(self, num_blocks: int, block_size: int, window: int) -> None:
        self.pool = BlockPool(num_blocks)
        self.block_size = block_size
        self.window = window

    def first_needed(self, position: int) -> int:
        """Index of the first block a query at `position` reads (rules 1 and 3)."""
        return max(0, position - self.window + 1) // self.block_size

    def longest_hit(self, hits: Sequence[KVBlock]) -> int:
        """Rule 3: how many of the full pool's hit blocks the window pool can serve."""
        k = len(hits)
        while k > 0:
            lo = self.first_needed(k * self.block_size)
            if all(self.pool.get_cached_block(_hash(b)) is not None for b in hits[lo:k]):
                return k
            k -= 1
        return 0

    def opened(self, hits: Sequence[KVBlock]) -> list[KVBlock | None]:
        """A new row's window table over `hits` (rule 3), its blocks touched."""
        lo = self.first_needed(len(hits) * self.block_size) if hits else 0
        found = [self.pool.get_cached_block(_hash(b)) for b in hits[lo:]]
        blocks = [b for b in found if b is not None]
        if len(blocks) != len(found):
            raise EngineFailure("a window block of a prefix hit was evicted before "
                                "allocate_slots (call it right after get_computed_blocks)")
        self.pool.touch(blocks)
        return [None] * lo + list(blocks)

    def num_revived(self, hits: Sequence[KVBlock]) -> int:
        """Window blocks `opened(hits)` takes off the free queue."""
        lo = self.first_needed(len(hits) * self.block_size) if hits else 0
        found = [self.pool.get_cached_block(_hash(b)) for b in hits[lo:]]
        return sum(1 for b in found if b is not None and b.ref_cnt == 0)

    def free_outside(self, table: list[KVBlock | None], position: int) -> int:
        """Rule 1 for a row whose next query sits at `position`; returns blocks freed."""
        stop = min(len(table), self.first_needed(position))
        freed = [b for b in table[:stop] if b is not None]
        for i in range(stop):
            table[i] = None
        self.pool.free_blocks(reversed(freed))  # the later block is kept longer (LRU)
        return len(freed)

    def release(self, table: Sequence[KVBlock | None]) -> None:
        """Every held block of a table, tail first (kv/manager.py rule 6)."""
        self.pool.free_blocks(b for b in reversed(table) if b is not None)


def window_ids(table: Sequence[KVBlock | None]) -> list[int]:
    """Block ids of a window table, -1 where freed (the runner reads trash there)."""
    return [-1 if b is None else b.block_id for b in table]


def _hash(block: KVBlock) -> int:
    return -1 if block.block_hash is None else block.block_hash
