"""KVCacheManager with block_size=4, num_blocks=8: tables, prefix hits, forks, slots."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from frink_mlx.engine.kv.hashing import hash_block, make_extra_key
from frink_mlx.engine.kv.manager import KVCacheManager
from frink_mlx.errors import EngineFailure

X = make_extra_key(0, None)


def refs(kv: KVCacheManager) -> list[int]:
    return [block.ref_cnt for block in kv.pool.blocks]


def run_prompt(kv: KVCacheManager, seq: str, tokens: list[int], extra: tuple = X) -> list[int]:
    """Admit `tokens` as a prompt (with prefix reuse), 'compute' it and publish its blocks."""
    computed, num_computed = kv.get_computed_blocks(tokens, extra)
    new_ids = kv.allocate_slots(seq, len(tokens) - num_computed, computed)
    assert new_ids is not None
    kv.cache_blocks(seq, tokens, extra)
    return kv.block_table(seq)


def test_allocation_grows_one_block_per_block_size_tokens() -> None:
    kv = KVCacheManager(num_blocks=8, block_size=4)
    assert kv.allocate_slots("a", 10) == [0, 1, 2]
    assert kv.block_table("a") == [0, 1, 2]
    assert kv.num_tokens("a") == 10
    assert kv.allocate_slots("a", 1) == []  # token 11 fits block 2
    assert kv.allocate_slots("a", 1) == []  # token 12 fills it
    assert kv.allocate_slots("a", 1) == [3]  # token 13 opens block 3
    assert (kv.num_free_blocks, kv.num_used_blocks, kv.usage) == (4, 4, 0.5)
    assert (kv.num_blocks, kv.block_size, kv.num_seqs) == (8, 4, 1)


def test_prefix_hit_reuses_blocks_and_counts_refs() -> None:
    kv = KVCacheManager(8, 4)
    prompt = list(range(100, 110))  # 10 tokens: 2 full blocks + 2
    assert run_prompt(kv, "a", prompt) == [0, 1, 2]
    assert kv.num_cached_blocks == 2
    computed, n = kv.get_computed_blocks(prompt, X)
    assert ([b.block_id for b in computed], n) == ([0, 1], 8)
    assert kv.allocate_slots("b", 2, computed) == [3]
    assert kv.block_table("b") == [0, 1, 3]
    assert refs(kv)[:4] == [2, 2, 1, 1]
    kv.free("a")
    assert refs(kv)[:4] == [1, 1, 0, 1]
    # a's partial block 2 held nothing findable: it is first in line for reuse
    assert kv.pool.free_block_ids() == [2, 4, 5, 6, 7]


def test_prefix_hit_never_covers_the_last_prompt_token() -> None:
    kv = KVCacheManager(8, 4)
    run_prompt(kv, "a", list(range(12)))
    kv.free("a")
    assert kv.num_cached_blocks == 3
    for length, expected in [(12, 8), (13, 12), (9, 8), (8, 4), (5, 4), (4, 0), (1, 0), (0, 0)]:
        _, n = kv.get_computed_blocks(list(range(length)), X)
        assert n == expected, length


def test_freed_blocks_keep_hashes_and_a_revived_hit_comes_off_the_free_queue() -> None:
    kv = KVCacheManager(8, 4)
    prompt = list(range(10))
    run_prompt(kv, "a", prompt)
    kv.free("a")
    assert kv.pool.free_block_ids() == [2, 3, 4, 5, 6, 7, 1, 0]
    assert run_prompt(kv, "b", prompt) == [0, 1, 2]
    assert refs(kv) == [1, 1, 1, 0, 0, 0, 0, 0]
    assert kv.pool.free_block_ids() == [3, 4, 5, 6, 7]


def test_eviction_order_is_lru_and_tail_first() -> None:
    kv = KVCacheManager(8, 4)
    prompt_a, prompt_b = list(range(8)), list(range(50, 58))
    assert run_prompt(kv, "a", prompt_a) == [0, 1]
    assert run_prompt(kv, "b", prompt_b) == [2, 3]
    kv.free("a")
    kv.free("b")
    assert kv.pool.free_block_ids() == [4, 5, 6, 7, 1, 0, 3, 2]
    assert kv.allocate_slots("c", 5 * 4) == [4, 5, 6, 7, 1]  # evicts a's tail block
    assert kv.get_computed_blocks(prompt_a + [0], X)[1] == 4  # a's head survives
    assert kv.allocate_slots("c", 4) == [0]
    assert kv.get_computed_blocks(prompt_a + [0], X)[1] == 0
    assert kv.get_computed_blocks(prompt_b + [0], X)[1] == 8  # b freed later: still whole


def test_hash_chain_a_shared_later_block_after_a_different_first_block_misses() -> None:
    kv = KVCacheManager(8, 4)
    run_prompt(kv, "a", [1, 2, 3, 4, 5, 6, 7, 8, 9])
    computed, n = kv.get_computed_blocks([0, 0, 0, 0, 5, 6, 7, 8, 9], X)
    assert (computed, n) == ([], 0)
    block1 = kv.pool.blocks[1]
    assert block1.block_hash == hash_block(hash_block(None, [1, 2, 3, 4], X), [5, 6, 7, 8], X)
    assert block1.block_hash != hash_block(hash_block(None, [0, 0, 0, 0], X), [5, 6, 7, 8], X)


def test_salts_and_generations_never_share_blocks() -> None:
    kv = KVCacheManager(8, 4)
    prompt = list(range(9))
    run_prompt(kv, "alice", prompt, make_extra_key(0, "alice"))
    assert kv.get_computed_blocks(prompt, make_extra_key(0, "alice"))[1] == 8
    assert kv.get_computed_blocks(prompt, make_extra_key(0, "bob"))[1] == 0
    assert kv.get_computed_blocks(prompt, make_extra_key(0, None))[1] == 0
    assert kv.get_computed_blocks(prompt, make_extra_key(1, "alice"))[1] == 0


def test_exhaustion_returns_none_and_changes_nothing() -> None:
    kv = KVCacheManager(8, 4)
    prompt = list(range(9))
    run_prompt(kv, "a", prompt)  # blocks 0, 1 cached, 2 partial
    kv.free("a")
    assert kv.allocate_slots("big", 4 * 4) == [2, 3, 4, 5]
    computed, n = kv.get_computed_blocks(prompt, X)
    assert [b.block_id for b in computed] == [0, 1]
    before = (kv.pool.free_block_ids(), refs(kv), kv.num_cached_blocks)
    # 8 computed + 12 new tokens = 5 blocks: 2 revived + 3 new > 4 free
    assert kv.allocate_slots("b", 12, computed) is None
    assert "b" not in kv
    assert (kv.pool.free_block_ids(), refs(kv), kv.num_cached_blocks) == before
    assert kv.allocate_slots("big", 17) is None  # needs 5 more, 4 free
    assert kv.num_tokens("big") == 16 and kv.block_table("big") == [2, 3, 4, 5]
    # 2 revived + 2 new == 4 free: exactly fits, evicting nothing that is reused
    assert kv.allocate_slots("b", 8, computed) == [6, 7]
    assert kv.block_table("b") == [0, 1, 6, 7]
    assert kv.num_free_blocks == 0 and kv.usage == 1.0


def test_cached_free_blocks_count_as_free_and_are_evicted_on_demand() -> None:
    kv = KVCacheManager(8, 4)
    run_prompt(kv, "a", list(range(32)))  # fills the whole pool, 8 hashes
    kv.free("a")
    assert (kv.num_free_blocks, kv.num_cached_blocks) == (8, 8)
    assert kv.allocate_slots("b", 32) == [7, 6, 5, 4, 3, 2, 1, 0]  # tail-first eviction
    assert kv.num_cached_blocks == 0


def test_stale_computed_blocks_raise() -> None:
    kv = KVCacheManager(8, 4)
    prompt = list(range(9))
    run_prompt(kv, "a", prompt)
    kv.free("a")
    computed, _ = kv.get_computed_blocks(prompt, X)
    kv.allocate_slots("hog", 32)  # evicts everything
    kv.free("hog")
    with pytest.raises(EngineFailure):
        kv.allocate_slots("b", 1, computed)


def test_cache_blocks_is_incremental_and_bounded_by_slots() -> None:
    kv = KVCacheManager(8, 4)
    kv.allocate_slots("a", 6)
    tokens = list(range(6))
    assert kv.cache_blocks("a", tokens, X) == 1
    assert kv.cache_blocks("a", tokens, X) == 0
    with pytest.raises(EngineFailure):
        kv.cache_blocks("a", tokens + [6], X)  # no slot for token 7 yet
    kv.allocate_slots("a", 3)
    assert kv.cache_blocks("a", list(range(9)), X) == 1
    assert kv.num_cached_blocks == 2
    with pytest.raises(EngineFailure):
        kv.cache_blocks("nobody", tokens, X)


def test_multi_turn_history_including_generated_tokens_is_reused() -> None:
    kv = KVCacheManager(8, 4)
    turn1 = list(range(6))
    run_prompt(kv, "t1", turn1)
    generated = [40, 41, 42, 43, 44, 45, 46, 47]
    with_kv = list(turn1)
    for token in generated[:-1]:  # the final sampled token never gets K/V
        assert kv.allocate_slots("t1", 1) is not None
        with_kv.append(token)
        kv.cache_blocks("t1", with_kv, X)
    assert len(with_kv) == 13 and kv.num_cached_blocks == 3
    kv.free("t1")
    turn2 = turn1 + generated + [90, 91, 92]
    computed, n = kv.get_computed_blocks(turn2, X)
    assert ([b.block_id for b in computed], n) == ([0, 1, 2], 12)


def test_fork_shares_full_blocks_only() -> None:
    kv = KVCacheManager(8, 4)
    run_prompt(kv, "p", list(range(10)))  # table [0, 1, 2], block 2 partial
    assert kv.fork("p", "c") == 8
    assert kv.block_table("c") == [0, 1]
    assert kv.num_tokens("c") == 8
    assert refs(kv)[:3] == [2, 2, 1]
    assert kv.allocate_slots("c", 2) == [3]  # the child recomputes tokens 8, 9 itself
    assert kv.fork("p", "c2", num_tokens=7) == 4
    assert kv.block_table("c2") == [0]
    assert refs(kv)[:4] == [3, 2, 1, 1]
    kv.free("p")
    assert refs(kv)[:4] == [2, 1, 0, 1]
    assert kv.cache_blocks("c", list(range(10)), X) == 0  # inherited chain: nothing new
    with pytest.raises(EngineFailure):
        kv.fork("c", "c2")
    with pytest.raises(EngineFailure):
        kv.fork("c", "c3", num_tokens=99)


def test_cache_prompt_false_neither_reads_nor_publishes() -> None:
    kv = KVCacheManager(8, 4)
    prompt = list(range(9))
    computed, n = kv.get_computed_blocks(prompt, X, cache_prompt=False)
    assert kv.allocate_slots("private", 9 - n, computed) == [0, 1, 2]
    assert kv.cache_blocks("private", prompt, X, cache_prompt=False) == 0
    assert kv.num_cached_blocks == 0
    run_prompt(kv, "public", prompt)
    assert kv.get_computed_blocks(prompt, X)[1] == 8
    assert kv.get_computed_blocks(prompt, X, cache_prompt=False) == ([], 0)


def test_caching_disabled_manager() -> None:
    kv = KVCacheManager(8, 4, enable_caching=False)
    assert run_prompt(kv, "a", list(range(9))) == [0, 1, 2]
    kv.free("a")
    assert kv.num_cached_blocks == 0
    assert kv.get_computed_blocks(list(range(9)), X) == ([], 0)


def test_reset_prefix_cache() -> None:
    kv = KVCacheManager(8, 4)
    run_prompt(kv, "a", list(range(9)))
    run_prompt(kv, "live", list(range(50, 55)))
    kv.free("a")
    assert kv.num_cached_blocks == 3
    assert kv.reset_prefix_cache() == 2
    assert kv.num_cached_blocks == 1  # the live sequence's block keeps its hash
    assert kv.get_computed_blocks(list(range(9)), X) == ([], 0)
    assert kv.get_computed_blocks(list(range(50, 55)), X)[1] == 4


def test_free_is_idempotent_and_unknown_sequences_raise() -> None:
    kv = KVCacheManager(8, 4)
    kv.allocate_slots("a", 3)
    assert kv.free("a") is True
    assert kv.free("a") is False
    assert kv.num_free_blocks == 8
    with pytest.raises(EngineFailure):
        kv.block_table("a")
    with pytest.raises(EngineFailure):
        kv.allocate_slots("a", -1)
    kv.allocate_slots("b", 1)
    with pytest.raises(EngineFailure):
        kv.allocate_slots("b", 1, [kv.pool.blocks[0]])  # computed blocks only on the first call


def test_slot_mapping_over_a_scattered_table() -> None:
    kv = KVCacheManager(8, 4)
    kv.allocate_slots("a", 4)  # [0]
    kv.allocate_slots("b", 4)  # [1]
    kv.allocate_slots("a", 4)  # [0, 2]
    kv.allocate_slots("b", 4)  # [1, 3]
    kv.allocate_slots("a", 2)  # [0, 2, 4]
    assert kv.block_table("a") == [0, 2, 4]
    assert kv.slot_mapping("a", 3, 6) == [3, 8, 9, 10, 11, 16]
    assert kv.slots_for("a", 10) == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17]
    assert kv.slot_mapping("b", 7, 1) == [15]
    assert kv.slot_mapping("a", 10, 0) == []
    with pytest.raises(EngineFailure):
        kv.slot_mapping("a", 8, 3)  # position 10 has no slot yet
    with pytest.raises(EngineFailure):
        kv.slot_mapping("a", -1, 1)


def test_accounting_modules_never_import_mlx() -> None:
    code = (
        "import sys; import frink_mlx.engine.kv.manager, frink_mlx.engine.kv.block_pool, "
        "frink_mlx.engine.kv.hashing; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('mlx', 'mlx_lm', 'numpy')))"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"


# -- randomized: every prefix hit must point at slots holding exactly those tokens ----

class Model:
    """Drives a manager like the engine does and 'writes' (extra, token) into each slot."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv
        self.storage: dict[int, tuple[tuple, int]] = {}
        self.tokens: dict[int, list[int]] = {}
        self.extras: dict[int, tuple] = {}
        self.next_id = 0

    def write(self, seq: int, start: int) -> None:
        tokens = self.tokens[seq]
        slots = self.kv.slot_mapping(seq, start, len(tokens) - start)
        for slot, token in zip(slots, tokens[start:]):
            self.storage[slot] = (self.extras[seq], token)
        self.kv.cache_blocks(seq, tokens, self.extras[seq])

    def admit(self, prompt: list[int], extra: tuple) -> None:
        computed, num_hit = self.kv.get_computed_blocks(prompt, extra)
        assert num_hit < len(prompt) and num_hit == len(computed) * self.kv.block_size
        for i, block in enumerate(computed):  # the hit really holds this prefix
            for offset in range(self.kv.block_size):
                slot = block.block_id * self.kv.block_size + offset
                assert self.storage[slot] == (extra, prompt[i * self.kv.block_size + offset])
        seq, snapshot = self.next_id, self.snapshot()
        self.next_id += 1
        if self.kv.allocate_slots(seq, len(prompt) - num_hit, computed) is None:
            assert self.snapshot() == snapshot
            return
        self.tokens[seq], self.extras[seq] = list(prompt), extra
        self.write(seq, num_hit)

    def decode(self, seq: int, token: int) -> None:
        if self.kv.allocate_slots(seq, 1) is not None:
            self.tokens[seq].append(token)
            self.write(seq, len(self.tokens[seq]) - 1)

    def fork(self, parent: int) -> None:
        child = self.next_id
        self.next_id += 1
        shared = self.kv.fork(parent, child)
        self.tokens[child], self.extras[child] = list(self.tokens[parent]), self.extras[parent]
        if self.kv.allocate_slots(child, len(self.tokens[child]) - shared) is None:
            self.free(child)
        else:
            self.write(child, shared)

    def free(self, seq: int) -> None:
        self.kv.free(seq)
        del self.tokens[seq], self.extras[seq]

    def snapshot(self) -> tuple:
        return (self.kv.pool.free_block_ids(), refs(self.kv), dict(self.kv.pool.cached))

    def check_invariants(self) -> None:
        pool = self.kv.pool
        holders = [0] * pool.num_blocks
        for seq in self.tokens:
            table = self.kv.block_table(seq)
            assert len(table) == -(-self.kv.num_tokens(seq) // self.kv.block_size)
            for block_id in table:
                holders[block_id] += 1
        assert refs(self.kv) == holders
        free_ids = pool.free_block_ids()
        assert sorted(free_ids) == [i for i, n in enumerate(holders) if n == 0]
        for block_hash, block in pool.cached.items():
            assert block.block_hash == block_hash
        assert sum(b.block_hash is not None for b in pool.blocks) == len(pool.cached)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_random_workloads_keep_accounting_and_content_consistent(data: st.DataObject) -> None:
    model = Model(KVCacheManager(8, 4))
    for _ in range(data.draw(st.integers(5, 40))):
        live = sorted(model.tokens)
        op = data.draw(st.sampled_from(["admit", "admit", "decode", "free", "fork", "reset"]))
        if op == "admit" or not live:
            prompt = data.draw(st.lists(st.integers(0, 2), min_size=1, max_size=14))
            model.admit(prompt, data.draw(st.sampled_from([(0, None), (0, "s"), (1, None)])))
        elif op == "decode":
            model.decode(data.draw(st.sampled_from(live)), data.draw(st.integers(0, 2)))
        elif op == "free":
            model.free(data.draw(st.sampled_from(live)))
        elif op == "fork":
            model.fork(data.draw(st.sampled_from(live)))
        else:
            model.kv.reset_prefix_cache()
        model.check_invariants()
