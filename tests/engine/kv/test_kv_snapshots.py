"""Recurrent-state snapshots (kv/snapshots.py) and the hybrid prefix cache in KVCacheManager
(rule 10), with block_size 4: exact ids, hits cut back to a snapshot, tails, eviction."""

from __future__ import annotations

from frink_mlx.engine.kv.manager import KVCacheManager
from frink_mlx.engine.kv.snapshots import SnapshotIndex, interval_blocks

KEY = ("x",)


def manager(num_snapshots: int = 4, every: int = 2, num_blocks: int = 16) -> KVCacheManager:
    return KVCacheManager(num_blocks=num_blocks, block_size=4, num_state_slots=2,
                          num_snapshots=num_snapshots, snapshot_interval_blocks=every)


def run_prompt(kv: KVCacheManager, seq: str, tokens: list[int]) -> list[int]:
    """Prefill `tokens` as the scheduler does: chunks stop at the interval; every chunk
    end at a block boundary takes a snapshot. Returns the snapshot ids taken."""
    kv.begin_step()
    blocks, hit = kv.get_computed_blocks(tokens, KEY)
    assert kv.allocate_slots(seq, len(tokens) - hit, blocks) is not None
    taken, pos = [], hit
    while pos < len(tokens):
        pos += kv.snapshot_stop(pos, len(tokens) - pos, len(tokens))
        kv.cache_blocks(seq, tokens[:pos], KEY)
        snap = kv.plan_snapshot(seq, pos)
        if snap is not None:
            taken.append(snap)
    return taken


def test_the_interval_rule_takes_the_largest_of_its_bounds() -> None:
    assert interval_blocks(100, 50, state_bytes=10, block_kv_bytes=100) == 2    # the count
    assert interval_blocks(100, 500, state_bytes=900, block_kv_bytes=100) == 9  # the bytes
    assert interval_blocks(100, 500, 10, 100, min_blocks=64) == 64              # a chunk


def test_prefill_stops_at_the_interval_and_a_hit_is_cut_back_to_a_snapshot() -> None:
    kv = manager()
    prompt = list(range(1, 23))  # 22 tokens: kept at 8, 16 and the last boundary, 20
    assert kv.snapshot_stop(0, 22, 22) == 8 and kv.snapshot_stop(9, 22, 22) == 7
    assert kv.snapshot_stop(16, 6, 22) == 4 and kv.snapshot_stop(20, 2, 22) == 2
    assert run_prompt(kv, "a", prompt) == [0, 1, 2]
    kv.free("a")
    kv.begin_step()
    other = prompt[:18] + [99] * 8  # 4 blocks shared, the 5th differs: snapshot at 16
    blocks, hit = kv.get_computed_blocks(other, KEY)
    assert hit == 16 and len(blocks) == 4
    assert kv.allocate_slots("b", len(other) - 16, blocks) is not None
    assert kv.take_restore("b") == 1 and kv.take_restore("b") == -1
    assert kv.get_computed_blocks(prompt + [7], KEY)[1] == 20


def test_a_snapshot_is_ready_only_from_the_next_step() -> None:
    kv = manager()
    prompt = list(range(1, 12))
    run_prompt(kv, "a", prompt)  # kept at 8, in this step
    assert kv.get_computed_blocks(prompt, KEY) == ([], 0)
    kv.begin_step()
    assert kv.get_computed_blocks(prompt, KEY)[1] == 8


def test_a_row_keeps_one_tail_and_leaves_it_behind_when_freed() -> None:
    index = SnapshotIndex(4, interval_blocks=4, block_size=4, is_cached=lambda h: True)
    assert index.reserve("a", 4, block_hash=104, tail=True) == 0
    assert index.reserve("a", 8, block_hash=None, tail=True) == 1  # the next tail: 0 goes
    assert index.lookup([104]) == (0, -1)
    assert index.reserve("a", 16, block_hash=116) == 0  # kept (a prefill snapshot)
    index.bind("a", 8, block_hash=108)
    index.release_seq("a")
    index.new_step()
    assert index.lookup([104, 108]) == (2, 1) and index.lookup([116]) == (1, 0)
    assert index.reserve("b", 16, block_hash=116) is None  # cached already


def test_unbound_snapshots_go_with_their_row_and_a_preempted_row_loses_this_steps() -> None:
    index = SnapshotIndex(4, interval_blocks=1, block_size=4, is_cached=lambda h: True)
    index.reserve("a", 4, block_hash=None)
    index.release_seq("a")
    assert index.num_used == 0
    index.reserve("b", 4, block_hash=204)
    index.new_step()
    index.reserve("b", 8, block_hash=208)
    index.release_seq("b", preempted=True)  # its step never runs: 8 goes, 4 stays
    index.new_step()
    assert index.lookup([204, 208]) == (1, 0) and index.num_used == 1


def test_eviction_takes_a_snapshot_whose_block_left_the_cache_first_then_lru() -> None:
    cached = {1, 2, 3, 9, 10}
    index = SnapshotIndex(3, interval_blocks=1, block_size=4, is_cached=cached.__contains__)
    for n, block_hash in enumerate((1, 2, 3), 1):
        assert index.reserve("r", 4 * n, block_hash) == n - 1
    index.release_seq("r")
    index.new_step()
    index.lookup([1])           # 1 is now the most recently used
    cached.discard(3)
    assert index.reserve("s", 4, block_hash=9) == 2      # 3's block is gone: it goes first
    index.release_seq("s")
    assert index.reserve("t", 4, block_hash=10) == 1     # then the least recently used: 2
    index.release_seq("t")
    index.new_step()
    assert index.lookup([1]) == (1, 0) and index.lookup([2]) == (0, -1)


def test_running_out_is_a_value() -> None:
    index = SnapshotIndex(1, interval_blocks=1, block_size=4, is_cached=lambda h: True)
    assert index.reserve("a", 4, block_hash=None) == 0
    assert index.reserve("b", 4, block_hash=None) is None  # the only one is a's, unbound
    assert index.reserve("b", 6, block_hash=None) is None  # no boundary


def test_without_snapshots_a_recurrent_model_caches_nothing() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=False, num_state_slots=1)
    assert kv.snapshots is None and kv.plan_snapshot("a", 4) is None
    assert kv.snapshot_stop(0, 30, 30) == 30


def test_the_ssd_tier_hears_of_bindings_and_asks_without_touching_the_lru() -> None:
    """Rule 7: `on_bound` hears every binding; `find` says (id, ready) and leaves the LRU
    order alone; a snapshot read back is reserved and bound at once, ready next step."""
    from frink_mlx.engine.kv.hashing import iter_block_hashes

    kv = manager()
    snaps = kv.snapshots
    assert snaps is not None
    bound: list[int] = []
    snaps.on_bound = bound.append
    prompt = list(range(1, 23))
    taken = run_prompt(kv, "a", prompt)  # at 8, 16, 20
    hashes = list(iter_block_hashes(prompt, 4, KEY))
    assert bound == [hashes[1], hashes[3], hashes[4]]
    assert snaps.find(hashes[1]) == (taken[0], False) and snaps.find(hashes[0]) is None
    kv.begin_step()
    assert snaps.find(hashes[1]) == (taken[0], True)
    kv.free("a")
    read_back = snaps.reserve(("disk",), 24, 12345)  # a block hash the pool does not hold
    assert read_back is not None and snaps.find(12345) == (read_back, False) and bound[-1] == 12345
    kv.begin_step()
    assert snaps.find(12345) == (read_back, True)
