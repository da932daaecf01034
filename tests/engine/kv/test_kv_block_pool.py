"""BlockPool with num_blocks=8: exact ids, ref counts, LRU tail-first eviction."""

from __future__ import annotations

import pytest

from frink_mlx.engine.kv.block_pool import BlockPool, FreeBlockQueue, KVBlock
from frink_mlx.errors import EngineFailure


def ids(blocks: list[KVBlock] | None) -> list[int]:
    assert blocks is not None
    return [block.block_id for block in blocks]


def test_fresh_pool_hands_out_ids_in_order() -> None:
    pool = BlockPool(8)
    assert ids(pool.get_new_blocks(3)) == [0, 1, 2]
    assert ids(pool.get_new_blocks(2)) == [3, 4]
    assert [b.ref_cnt for b in pool.blocks] == [1, 1, 1, 1, 1, 0, 0, 0]
    assert pool.num_free_blocks == 3
    assert pool.num_used_blocks == 5
    assert pool.usage == 5 / 8
    assert pool.free_block_ids() == [5, 6, 7]
    assert pool.get_new_blocks(0) == []


def test_exhaustion_returns_none_without_side_effects() -> None:
    pool = BlockPool(8)
    taken = pool.get_new_blocks(6)
    assert taken is not None
    pool.cache_full_block(taken[0], 100)
    assert pool.get_new_blocks(3) is None
    assert pool.free_block_ids() == [6, 7]
    assert pool.num_cached_blocks == 1
    assert ids(pool.get_new_blocks(2)) == [6, 7]
    assert pool.get_new_blocks(1) is None
    with pytest.raises(EngineFailure):
        pool.get_new_blocks(-1)


def test_free_is_lru_with_tail_blocks_evicted_first() -> None:
    pool = BlockPool(8)
    seq_a = pool.get_new_blocks(3)
    seq_b = pool.get_new_blocks(2)
    assert seq_a is not None and seq_b is not None
    for i, block in enumerate(seq_a + seq_b):
        pool.cache_full_block(block, 1000 + i)
    pool.free_blocks(reversed(seq_a))  # a first: tail 2, then 1, then 0
    pool.free_blocks(reversed(seq_b))  # b later: 4, then 3
    assert pool.free_block_ids() == [5, 6, 7, 2, 1, 0, 4, 3]
    assert pool.num_cached_blocks == 5
    # Never-used blocks go first, then a's tail, then a's head, then b.
    assert ids(pool.get_new_blocks(4)) == [5, 6, 7, 2]
    assert pool.get_cached_block(1002) is None  # block 2 evicted: hash gone
    assert pool.blocks[2].block_hash is None
    assert pool.num_cached_blocks == 4
    assert ids(pool.get_new_blocks(2)) == [1, 0]
    assert pool.get_cached_block(1003) is pool.blocks[3]


def test_hashless_freed_blocks_go_to_the_head() -> None:
    pool = BlockPool(8)
    seq = pool.get_new_blocks(3)
    assert seq is not None
    pool.cache_full_block(seq[0], 7)  # blocks 1, 2 never became full
    pool.free_blocks(reversed(seq))
    assert pool.free_block_ids() == [1, 2, 3, 4, 5, 6, 7, 0]


def test_touch_revives_a_cached_free_block_and_shares_a_held_one() -> None:
    pool = BlockPool(8)
    seq = pool.get_new_blocks(2)
    assert seq is not None
    pool.cache_full_block(seq[0], 11)
    pool.cache_full_block(seq[1], 12)
    pool.touch([seq[0]])  # a second holder of a live block
    assert [b.ref_cnt for b in seq] == [2, 1]
    pool.free_blocks(reversed(seq))
    assert [b.ref_cnt for b in seq] == [1, 0]
    assert pool.free_block_ids() == [2, 3, 4, 5, 6, 7, 1]
    hit = pool.get_cached_block(12)
    assert hit is seq[1]
    pool.touch([hit])  # revived: off the free queue, O(1) from the middle
    assert hit.ref_cnt == 1
    assert pool.free_block_ids() == [2, 3, 4, 5, 6, 7]
    assert pool.num_free_blocks == 6


def test_double_free_and_bad_hashing_raise() -> None:
    pool = BlockPool(8)
    (block,) = pool.get_new_blocks(1) or []
    pool.cache_full_block(block, 5)
    assert pool.cache_full_block(block, 5) is True  # idempotent
    with pytest.raises(EngineFailure):
        pool.cache_full_block(block, 6)
    pool.free_blocks([block])
    with pytest.raises(EngineFailure):
        pool.free_blocks([block])
    with pytest.raises(EngineFailure):
        pool.cache_full_block(pool.blocks[3], 9)  # free blocks cannot be published
    with pytest.raises(EngineFailure):
        BlockPool(0)


def test_duplicate_content_keeps_the_first_block() -> None:
    pool = BlockPool(8)
    first, second = pool.get_new_blocks(2) or []
    assert pool.cache_full_block(first, 42) is True
    assert pool.cache_full_block(second, 42) is False
    assert second.block_hash is None
    assert pool.get_cached_block(42) is first
    assert pool.num_cached_blocks == 1


def test_reset_prefix_cache_drops_only_free_blocks_hashes() -> None:
    pool = BlockPool(8)
    held, freed = pool.get_new_blocks(2) or []
    pool.cache_full_block(held, 1)
    pool.cache_full_block(freed, 2)
    pool.free_blocks([freed])
    assert pool.reset_prefix_cache() == 1
    assert pool.get_cached_block(2) is None and freed.block_hash is None
    assert pool.get_cached_block(1) is held
    assert pool.num_cached_blocks == 1
    assert pool.reset_prefix_cache() == 0


def test_free_queue_links() -> None:
    blocks = [KVBlock(i) for i in range(4)]
    queue = FreeBlockQueue(blocks)
    queue.remove(blocks[2])
    queue.appendleft(blocks[2])
    assert [b.block_id for b in queue] == [2, 0, 1, 3]
    assert queue.popleft() is blocks[2]
    assert len(queue) == 3
    with pytest.raises(EngineFailure):
        queue.remove(blocks[2])
    for _ in range(3):
        queue.popleft()
    with pytest.raises(EngineFailure):
        queue.popleft()
