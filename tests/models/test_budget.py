"""plan_kv: pricing weights and KV bytes against the device budget."""

from __future__ import annotations

import types

import mlx.core as mx
import mlx.nn as nn
import pytest

from frink_mlx.backend import MemoryBudget, select_backend
from frink_mlx.config import BudgetConfig
from frink_mlx.errors import ConfigError
from frink_mlx.models import budget
from frink_mlx.models.budget import KVPlan
from frink_mlx.settings import Settings

DEVICE = select_backend(Settings().backend_config()).memory_budget()  # this machine's, as the hub asks


def plan_kv(loaded: object, config: BudgetConfig, device: MemoryBudget = DEVICE) -> KVPlan:
    return budget.plan_kv(loaded, config, device)


class _Attn(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.n_kv_heads, self.head_dim = 2, 8


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn = _Attn()


class _Model(nn.Module):
    """4 layers, 2 kv heads, head dim 8, 1000 float32 weights (4000 bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = [_Layer() for _ in range(4)]
        self.w = mx.zeros((1000,), mx.float32)


def _loaded(context_length=1024, dtype=mx.float32):
    return types.SimpleNamespace(model=_Model(), dtype=dtype, context_length=context_length,
                                 spec=types.SimpleNamespace(name="fake", kv_budget_bytes=None))


def test_bytes_per_token_and_blocks_from_an_override():
    # 2 * 4 layers * 2 heads * 8 dims * 4 bytes = 512 bytes/token; a block of 16 = 8192 bytes
    settings = Settings(kv_budget_bytes=1_004_000, memory_headroom_fraction=0.0, block_size=16,
                        max_batch=16)
    plan = plan_kv(_loaded(), settings.budget_config())
    assert plan.bytes_per_token == 512 and plan.weights_bytes == 4000
    assert plan.num_blocks == 1_000_000 // 8192 == 122
    assert plan.context_ceiling == min(1024, 122 * 16) and plan.budget_source == "override"


def test_pool_is_capped_by_max_batch_contexts_and_max_pool_bytes():
    plan = plan_kv(_loaded(context_length=64), Settings(block_size=16, max_batch=2).budget_config())
    assert plan.num_blocks == 2 * 4 and plan.context_ceiling == 64  # RAM is plenty; capped
    plan = plan_kv(_loaded(), Settings(block_size=16, max_kv_pool_bytes=8192 * 5).budget_config())
    assert plan.num_blocks == 5 and plan.context_ceiling == 80


def test_headroom_and_half_precision():
    settings = Settings(kv_budget_bytes=100_000, memory_headroom_fraction=0.5, block_size=4)
    plan = plan_kv(_loaded(dtype=mx.float16), settings.budget_config())
    assert plan.bytes_per_token == 256
    assert plan.num_blocks == (100_000 - 4000 - 50_000) // 1024


def test_a_model_that_leaves_no_room_is_a_config_error():
    with pytest.raises(ConfigError, match="no room"):
        plan_kv(_loaded(), Settings(kv_budget_bytes=5000, memory_headroom_fraction=0.0).budget_config())


def test_without_an_override_the_backends_budget_is_the_start():
    config = Settings(memory_headroom_fraction=0.0, block_size=16, max_batch=16).budget_config()
    plan = plan_kv(_loaded(), config, MemoryBudget(1_004_000, "metal"))
    assert plan.budget_bytes == 1_004_000 and plan.budget_source == "metal"
    assert plan.num_blocks == 1_000_000 // 8192
    assert DEVICE.nbytes > 0 and DEVICE.source in ("metal", "ram")


def test_a_draft_models_weights_and_pool_come_off_the_kv_budget():
    """Rule 6: the draft's 4000 weight bytes and its pool (2 rows x the 1024-token ceiling,
    at the same 512 bytes/token = 128 blocks of 8192 bytes) leave the target fewer blocks."""
    settings = Settings(kv_budget_bytes=2_004_000, memory_headroom_fraction=0.0, block_size=16,
                        max_batch=16)
    alone = budget.plan_kv(_loaded(), settings.budget_config(), DEVICE)
    paired = budget.plan_kv(_loaded(), settings.budget_config(), DEVICE, draft=_loaded(),
                            draft_rows=2)
    assert alone.num_blocks == 2_000_000 // 8192 and alone.draft_num_blocks == 0
    assert paired.draft_num_blocks == 2 * 1024 // 16 == 128
    assert paired.draft_bytes == 4000 + 128 * 8192
    assert paired.num_blocks == (2_000_000 - 4000 - 128 * 8192) // 8192


def test_recurrent_state_slots_are_priced_before_blocks():
    """Rule 7: max_batch state slots come off the budget; rule 3 from the cache spec."""
    from frink_mlx.engine.kv.specs import AttentionSpec, CacheEntry, ModelCacheSpec, StateSpec

    spec = ModelCacheSpec("fake", (CacheEntry("state", 0), CacheEntry("attention", 0)),
                          (AttentionSpec(2, 8, 8),), (StateSpec(((250,),), (mx.float32,)),))
    loaded = _loaded()
    loaded.cache_spec = spec  # 1 attention entry: 2 * 2 * 8 * 4 = 128 bytes/token
    settings = Settings(kv_budget_bytes=1_004_000, memory_headroom_fraction=0.0, block_size=16,
                        max_batch=16)
    plan = plan_kv(loaded, settings.budget_config())
    assert plan.bytes_per_token == 128 and plan.num_state_slots == 16
    # rule 8: a quarter of what the slots leave buys snapshots of 1000 bytes each
    left = 1_004_000 - 4000 - 16 * 1000  # weights, state slots
    assert plan.num_snapshots == left // 4 // 1000 == 246
    assert plan.state_bytes == 16 * 1000 + 246 * 1000
    assert plan.num_blocks == (left - 246 * 1000) // 2048 == 360


def test_snapshots_are_no_more_than_can_be_used_and_none_when_the_state_is_too_large():
    """Rule 8: at most one per interval of the pool plus a tail per row; a state larger
    than a quarter of the room gets none (that model's prefix cache is off)."""
    # 100 blocks of 2048 bytes; a 4096-byte state spans 2 blocks: 50 intervals + 4 tails
    assert budget.snapshot_count(4096, 2048, 2048 * 100, 100, 4) == 2048 * 100 // 4 // 4096 == 12
    assert budget.snapshot_count(64, 2048, 2048 * 100, 100, 4) == 100 + 4
    assert budget.snapshot_count(2048 * 30, 2048, 2048 * 100, 100, 4) == 0
