"""Sliding-window tables (engine/kv/window.py) in plain ints: block_size 4, window 6.

A query at position q reads keys q-5 .. q, so block i is freed once
(i + 1) * 4 <= q - 5; a row far past its window holds ceil(6 / 4) + 1 = 3
window blocks however long it is, and a prefix hit needs the window blocks
its first query reads, still findable by hash.
"""

from __future__ import annotations

from frink_mlx.engine.kv.manager import KVCacheManager

BS, W = 4, 6


def manager(num_blocks: int = 32) -> KVCacheManager:
    return KVCacheManager(num_blocks, BS, window=W)


def decode(kv: KVCacheManager, seq: str, start: int, steps: int) -> None:
    """The scheduler's order per decode step: free outside the window, then reserve."""
    for position in range(start, start + steps):
        kv.free_outside_window(seq, position)
        assert kv.allocate_slots(seq, 1) is not None


def test_a_row_at_four_windows_holds_the_window_blocks_plus_one():
    kv = manager()
    prompt = list(range(1, 25))  # 24 tokens = 4 x the window
    assert kv.allocate_slots("a", len(prompt)) == list(range(6))
    assert kv.window_table("a") == list(range(6))
    kv.free_outside_window("a", 24)  # next query at 24 reads 19..24: blocks 4, 5 (+ 6 new)
    assert kv.window_table("a") == [-1, -1, -1, -1, 4, 5]
    assert kv.windows is not None and kv.windows.pool.num_used_blocks == 2
    decode(kv, "a", 24, 40)
    assert kv.num_used_blocks == 16  # the full table keeps every block
    assert kv.windows.pool.num_used_blocks <= -(-W // BS) + 1
    table = kv.window_table("a")
    assert len(table) == len(kv.block_table("a")) == 16
    lo = (63 - W + 1) // BS  # the last query (63) reads 58..63: blocks 14, 15
    assert all(b >= 0 for b in table[lo:]) and all(b == -1 for b in table[:lo])
    kv.free("a")
    assert kv.windows.pool.num_used_blocks == 0 and kv.num_used_blocks == 0


def test_freed_window_blocks_keep_their_hash_and_an_evicted_one_shortens_the_hit():
    kv = manager(num_blocks=12)
    prompt = list(range(1, 25))
    kv.allocate_slots("a", 24)
    kv.cache_blocks("a", prompt, ())
    kv.free_outside_window("a", 24)
    # A longer prompt over the same 24 tokens: 5 full blocks hit (rule 1 of the manager
    # caps at (L-1)//4); the first new query (20) reads 15..19 -> window blocks 3, 4.
    longer = prompt + [99, 98, 97]
    blocks, n = kv.get_computed_blocks(longer, ())
    assert n == 24 and len(blocks) == 6
    kv.free("a")
    hits, n = kv.get_computed_blocks(longer, ())
    assert n == 24
    kv.allocate_slots("b", len(longer) - n, hits)
    assert kv.window_table("b")[:4] == [-1, -1, -1, -1]  # blocks 0-3 not needed at 24
    assert kv.window_table("b")[4:6] == [4, 5]
    kv.free("b")
    # Hand the freed window blocks out again (their hashes go): the hit shrinks to the
    # longest prefix whose window blocks are still findable -- here none.
    assert kv.windows is not None
    taken = kv.windows.pool.get_new_blocks(kv.windows.pool.num_free_blocks)
    assert taken is not None
    assert kv.get_computed_blocks(longer, ()) == ([], 0)


def test_fork_shares_window_blocks_and_copies_the_partial_one_in_the_window_pool():
    kv = manager()
    kv.allocate_slots("p", 14)  # blocks 0..3 in both pools
    kv.free_outside_window("p", 14)  # 14 reads 9..14: blocks 2, 3 kept
    assert kv.window_table("p") == [-1, -1, 2, 3]
    shared = kv.fork("p", "c", 14)
    assert shared == 12
    kv.allocate_slots("c", 2)
    # freed hashless blocks are handed out first (block_pool.py rule 4): block 0 again
    assert kv.window_table("c") == [-1, -1, 2, 0] and kv.block_table("c") == [0, 1, 2, 4]
    assert kv.window_fork_copy("p", "c", shared, 14) == [(3, 0, 2)]
    kv.free("p")
    kv.free("c")
    assert kv.windows is not None and kv.windows.pool.num_used_blocks == 0


def test_trim_gives_back_window_blocks_of_rejected_drafts():
    kv = manager()
    kv.allocate_slots("a", 8)
    kv.allocate_slots("a", 5)  # drafts: positions 8..12, blocks 2, 3
    assert kv.trim("a", 9) == 1
    assert kv.window_table("a") == [0, 1, 2]
    assert kv.windows is not None and kv.windows.pool.num_used_blocks == 3


def test_without_windowed_layers_nothing_changes():
    kv = KVCacheManager(8, BS)
    kv.allocate_slots("a", 20)
    assert kv.free_outside_window("a", 20) == 0 and kv.window_table("a") is None
