"""Recurrent-state slots (kv/slots.py) and their accounting in KVCacheManager (rule 9)."""

from __future__ import annotations

import pytest

from frink_mlx.engine.kv.manager import KVCacheManager
from frink_mlx.engine.kv.slots import SlotPool
from frink_mlx.errors import EngineFailure


def test_slot_pool_hands_out_the_lowest_free_slot_and_runs_out_as_none() -> None:
    pool = SlotPool(3)
    assert [pool.take(), pool.take(), pool.take(), pool.take()] == [0, 1, 2, None]
    pool.give(1)
    assert (pool.num_free, pool.num_used) == (1, 2)
    assert pool.take() == 1
    with pytest.raises(EngineFailure):
        SlotPool(2).give(0)


def test_a_sequence_takes_one_slot_with_its_first_blocks_and_frees_it() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, num_state_slots=2)
    assert kv.allocate_slots("a", 6) == [0, 1]
    assert kv.state_slot("a") == 0
    assert kv.allocate_slots("a", 3) == [2]  # growing takes no second slot
    assert kv.allocate_slots("b", 1) == [3] and kv.state_slot("b") == 1
    assert kv.state_slots is not None and kv.state_slots.num_used == 2
    kv.free("a")
    assert kv.state_slots.num_used == 1
    assert kv.allocate_slots("c", 1) is not None and kv.state_slot("c") == 0


def test_no_free_slot_refuses_the_allocation_with_no_side_effects() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, num_state_slots=1)
    assert kv.allocate_slots("a", 4) == [0]
    assert kv.allocate_slots("b", 4) is None
    assert "b" not in kv and kv.num_used_blocks == 1


def test_a_forked_child_takes_its_own_slot_and_copies_the_parents() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4, num_state_slots=2)
    kv.allocate_slots("p", 6)
    shared = kv.fork("p", "c", 6)
    assert shared == 4 and kv.state_slot("c") == -1
    assert kv.allocate_slots("c", 2) == [2]
    assert kv.state_slot("c") == 1
    assert kv.fork_copies("p", "c", shared, 6) == ([(1, 2, 2)], [(0, 1)])


def test_without_state_slots_nothing_changes() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    kv.allocate_slots("a", 3)
    assert kv.state_slot("a") == -1 and kv.state_slots is None
