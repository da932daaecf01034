"""The block pool: ref counts, an LRU free queue and the prefix cache, in plain ints.

Why: KV memory is carved into `num_blocks` fixed blocks up front (the paged
storage in `paged.py` mirrors the ids). Everything about *who holds which
block* lives here, in pure Python, so the scheduler can plan with integers and
the accounting is testable without MLX.

The prefix cache is not a separate structure. A full block gets a hash when its
K/V is complete; when its last holder frees it, the block goes onto the free
queue *still carrying its hash*. Until `get_new_blocks` pops it for someone
else, `get_cached_block(hash)` finds it and `touch` revives it (vLLM v1's
design). Eviction is therefore just "pop the head of the free queue".

Free-queue order (head is evicted first):

    head -> [hashless blocks ...] [cached blocks, least recently freed ... most recently freed] <- tail

Rules, in order:
 1. A block is on the free queue if and only if its `ref_cnt` is 0.
 2. `free_blocks(ordered)` appends in the order given; callers pass a sequence's
    blocks tail-first, so a sequence's last blocks (shared by fewer prompts)
    are evicted before its first blocks (shared system prompts, history).
 3. A block freed later is evicted later (LRU among cached blocks).
 4. Refinement over vLLM: a block freed *without* a hash holds nothing anyone
    can find, so it goes to the head instead of the tail; evicting it first
    never costs a cache hit. Order among hashless blocks is irrelevant.
 5. Running out is a value: `get_new_blocks` returns None and changes nothing.
 6. The hash map keeps the first block registered for a hash; a later block
    with identical content (two sequences prefilled the same prompt at once)
    stays hashless, so block tables stay append-only and never move.
 7. `on_idle(block_id, block_hash)`, when set, hears of every cached block
    whose last holder freed it (the SSD tier writes such blocks: spill.py).

Misuse (freeing a block twice, re-hashing a block) raises `EngineFailure`:
those are engine bugs, not shortages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import cast

from ...errors import EngineFailure


@dataclass(slots=True, eq=False)
class KVBlock:
    """One block of `block_size` token slots. Compared by identity."""

    block_id: int
    ref_cnt: int = 0
    block_hash: int | None = None
    # Links of the free queue; meaningful only while ref_cnt == 0.
    prev_free: KVBlock | None = field(default=None, repr=False)
    next_free: KVBlock | None = field(default=None, repr=False)


class FreeBlockQueue:
    """A doubly linked list of free blocks with O(1) pop, push and removal.

    Two sentinels make every operation branch-free:

        _head <-> b3 <-> b7 <-> b1 <-> _tail
                  ^ popleft()          ^ append() inserts before _tail
    """

    def __init__(self, blocks: Iterable[KVBlock]) -> None:
        self._head = KVBlock(-1)
        self._tail = KVBlock(-1)
        self._head.next_free = self._tail
        self._tail.prev_free = self._head
        self._len = 0
        for block in blocks:
            self.append(block)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[KVBlock]:
        """Blocks in eviction order (head first)."""
        node = self._head.next_free
        while node is not None and node is not self._tail:
            yield node
            node = node.next_free

    def _link_after(self, anchor: KVBlock, block: KVBlock) -> None:
        nxt = cast(KVBlock, anchor.next_free)  # sentinels guarantee a successor
        block.prev_free, block.next_free = anchor, nxt
        anchor.next_free = block
        nxt.prev_free = block
        self._len += 1

    def append(self, block: KVBlock) -> None:
        """Put `block` at the tail (evicted last)."""
        self._link_after(cast(KVBlock, self._tail.prev_free), block)

    def appendleft(self, block: KVBlock) -> None:
        """Put `block` at the head (evicted first)."""
        self._link_after(self._head, block)

    def remove(self, block: KVBlock) -> None:
        prev, nxt = block.prev_free, block.next_free
        if prev is None or nxt is None:
            raise EngineFailure(f"block {block.block_id} is not on the free queue")
        prev.next_free = nxt
        nxt.prev_free = prev
        block.prev_free = block.next_free = None
        self._len -= 1

    def popleft(self) -> KVBlock:
        first = self._head.next_free
        if first is None or first is self._tail:
            raise EngineFailure("free queue is empty")
        self.remove(first)
        return first


class BlockPool:
    """`num_blocks` KV blocks: who holds them, which are free, which are cached."""

    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise EngineFailure(f"num_blocks must be positive, got {num_blocks}", param="num_blocks")
        self.num_blocks = num_blocks
        self.blocks: list[KVBlock] = [KVBlock(i) for i in range(num_blocks)]
        # Initially every block is free and hashless: ids are handed out 0, 1, 2, ...
        self.free_queue = FreeBlockQueue(self.blocks)
        self.cached: dict[int, KVBlock] = {}
        self.on_idle: Callable[[int, int], None] | None = None  # rule 7

    # -- counters ----------------------------------------------------------

    @property
    def num_free_blocks(self) -> int:
        """Blocks nobody holds, including cached ones that may be evicted."""
        return len(self.free_queue)

    @property
    def num_used_blocks(self) -> int:
        return self.num_blocks - len(self.free_queue)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by hash, whether held or free."""
        return len(self.cached)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences (cached free blocks count as free)."""
        return self.num_used_blocks / self.num_blocks

    # -- allocation ----------------------------------------------------------

    def get_new_blocks(self, num_blocks: int) -> list[KVBlock] | None:
        """Take `num_blocks` blocks off the free queue (ref_cnt 1), or None if too few.

        Algorithm: refuse up front when the queue is shorter than asked (so a
        refusal has no side effects); otherwise pop from the head, and if a
        popped block still carries a hash, evict it from the hash map first.
        """
        if num_blocks < 0:
            raise EngineFailure(f"num_blocks must be >= 0, got {num_blocks}", param="num_blocks")
        if num_blocks > len(self.free_queue):
            return None
        taken: list[KVBlock] = []
        for _ in range(num_blocks):
            block = self.free_queue.popleft()
            self._evict(block)
            block.ref_cnt = 1
            taken.append(block)
        return taken

    def _evict(self, block: KVBlock) -> None:
        """Forget `block`'s hash (its slots are about to be overwritten)."""
        if block.block_hash is None:
            return
        if self.cached.get(block.block_hash) is block:
            del self.cached[block.block_hash]
        block.block_hash = None

    def get_cached_block(self, block_hash: int) -> KVBlock | None:
        return self.cached.get(block_hash)

    def touch(self, blocks: Iterable[KVBlock]) -> None:
        """A new holder takes cached blocks: ref++, and revive free ones off the queue."""
        for block in blocks:
            if block.ref_cnt == 0:
                self.free_queue.remove(block)
            block.ref_cnt += 1

    def free_blocks(self, ordered_blocks: Iterable[KVBlock]) -> None:
        """Drop one reference to each block; the first block listed is evicted first.

        A block whose count reaches 0 joins the free queue: at the tail if it
        carries a hash (LRU), at the head if it does not (rule 4).
        """
        for block in ordered_blocks:
            if block.ref_cnt <= 0:
                raise EngineFailure(f"block {block.block_id} freed more often than taken")
            block.ref_cnt -= 1
            if block.ref_cnt > 0:
                continue
            if block.block_hash is None:
                self.free_queue.appendleft(block)
            else:
                self.free_queue.append(block)
                if self.on_idle is not None:
                    self.on_idle(block.block_id, block.block_hash)

    # -- the prefix cache ------------------------------------------------------

    def cache_full_block(self, block: KVBlock, block_hash: int) -> bool:
        """Register a held, now full block under `block_hash`.

        Returns True if the block is now findable by that hash, False if another
        block already holds it (rule 6; this block stays hashless). Registering
        the same hash twice is a no-op, so a forked child and its parent may
        both publish a shared block.
        """
        if block.ref_cnt <= 0:
            raise EngineFailure(f"block {block.block_id} is free; only held blocks can be cached")
        if block.block_hash is not None:
            if block.block_hash != block_hash:
                raise EngineFailure(f"block {block.block_id} already has a different hash")
            return True
        holder = self.cached.get(block_hash)
        if holder is not None:
            return holder is block
        block.block_hash = block_hash
        self.cached[block_hash] = block
        return True

    def reset_prefix_cache(self) -> int:
        """Forget the hashes of all free blocks; returns how many were dropped.

        Held blocks keep theirs: their holders are still writing and reading them,
        and they become plain cache entries again when freed.
        """
        dropped = 0
        for block in self.free_queue:
            if block.block_hash is not None:
                self._evict(block)
                dropped += 1
        return dropped

    def free_block_ids(self) -> list[int]:
        """Free block ids in eviction order (head first); for stats and tests."""
        return [block.block_id for block in self.free_queue]
