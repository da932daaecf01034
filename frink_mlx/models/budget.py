"""The context ceiling: how many KV blocks this machine can afford for a model.

Why at load time: a daemon that runs out of memory mid-request kills every
stream; one that knows its pool size can refuse a prompt that can never fit
(400 context_length_exceeded) and queue one that only has to wait (503).

The arithmetic, in order:
1. device budget: an explicit override (config.kv_budget_bytes, else the
   model's models.toml kv_budget_bytes); else what the backend reports
   (`Backend.memory_budget`: Metal's recommended working set, or physical RAM).
2. KV budget = device budget - weight bytes - headroom * device budget
   - bytes held by the other resident models (config.reserved_bytes; each
   newcomer's pool is planned against what is left, serving/residency.py).
3. bytes per token = 2 (K and V) * layers * kv heads * head dim * dtype size;
   a block holds block_size tokens. With the model's cache spec
   (`loaded.cache_spec`, engine/kv/specs.py) it is the sum over its attention
   entries, each at its own geometry (KV-shared and recurrent layers hold no
   K/V).
4. num_blocks = floor(KV budget / block bytes), capped so the pool is no
   larger than max_batch full trained contexts, nor than
   config.max_kv_pool_bytes (a 135M model must not grab 20 GB), nor than the
   entry's own `max_kv_bytes`.
5. context ceiling = min(trained context length, num_blocks * block_size).
6. A draft model (registry rule 10, engine/speculative/ rule 7) is priced with its
   target: its weights come off the KV budget of rule 2, and so does its own
   KV pool, `draft_rows` (setting spec_draft_rows) contexts of the target's
   ceiling at the draft's bytes per token, before the target's blocks are
   counted.
7. Recurrent state (a spec with recurrent entries): one slot per row of the
   batch (`max_batch`), each the spec's state bytes per row, comes off the
   KV budget and off the pool caps of rule 4 before blocks are counted; the
   plan's `num_state_slots` and `state_bytes` say so.
8. Recurrent-state snapshots (the hybrid prefix cache, engine/kv/snapshots.py):
   up to SNAPSHOT_SHARE of what rule 7 leaves (budget and caps alike) buys
   `num_snapshots` snapshots of one row's state each, never more than could
   be used: one per interval of a pool with no snapshots (snapshots rule 6's
   bytes bound) plus one tail per row. They come off the budget and the caps
   like the slots and `state_bytes` counts them (the engine spaces them by
   snapshots rule 6).
   A state too large for its share gets none: that model's prefix cache is off.
9. KV bits (the entry's `kv_bits`, else config.kv_bits; engine/kv/quantized.py):
   rule 3's bytes per token become the quantized layout's, per head and token
   head_dim * bits / 8 packed bytes plus a scale and a bias (the float dtype)
   per group of 64 (or 32) features, so the same budget holds more blocks;
   recurrent state and a draft model's pool stay float. A head dim no group
   divides is refused here, at load (`ConfigError`, one line).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..backend import MemoryBudget
from ..config import BudgetConfig
from ..engine.kv.geometry import model_kv_geometry
from ..engine.kv.quantized import check_kv_bits, row_nbytes
from ..engine.kv.snapshots import interval_blocks
from ..errors import ConfigError

SNAPSHOT_SHARE = 0.25  # rule 8: of the KV budget left after the state slots


@dataclass(frozen=True, slots=True)
class KVPlan:
    num_blocks: int
    block_size: int
    context_ceiling: int
    bytes_per_token: int
    budget_bytes: int      # the device budget the plan started from (rule 1)
    weights_bytes: int
    budget_source: str = "ram"   # "override" | "metal" | "ram"
    draft_num_blocks: int = 0    # rule 6: the draft model's pool (0: no draft)
    draft_bytes: int = 0         # rule 6: its weights + its pool
    num_state_slots: int = 0     # rule 7: recurrent-state slots (0: no recurrent layers)
    state_bytes: int = 0         # rules 7 and 8: their bytes and the snapshots'
    num_snapshots: int = 0       # rule 8: recurrent-state snapshots
    kv_bits: int | None = None   # rule 9: the pool's bits (None: float)

    @property
    def pool_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.bytes_per_token


def device_budget_bytes(config: BudgetConfig, spec: Any, device: MemoryBudget) -> tuple[int, str]:
    """Rule 1: (bytes, source); `device` is the backend's `memory_budget()`."""
    override = config.kv_budget_bytes or getattr(spec, "kv_budget_bytes", None)
    if override:
        return int(override), "override"
    return device.nbytes, device.source


def weights_nbytes(model: Any) -> int:
    from mlx.utils import tree_flatten

    params: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return sum(v.nbytes for _, v in params)


def kv_bytes_per_token(model: Any, dtype: Any, bits: int | None = None) -> int:
    """Rule 3 (rule 9 with `bits`), from the model's attention geometry."""
    layers, kv_heads, head_dim = model_kv_geometry(model)
    return 2 * layers * kv_heads * row_nbytes(head_dim, bits, int(dtype.size))


def kv_bits_of(loaded: Any, config: BudgetConfig) -> int | None:
    """Rule 9: the bits `loaded`'s pool is stored in, checked against its head dims."""
    bits = getattr(getattr(loaded, "spec", None), "kv_bits", None) or config.kv_bits
    if bits is not None:
        cache_spec = getattr(loaded, "cache_spec", None)
        dims = cache_spec.head_dims() if cache_spec is not None else \
            [model_kv_geometry(loaded.model)[2]]
        check_kv_bits(bits, dims, getattr(cache_spec, "family", None) or
                      type(loaded.model).__module__.rsplit(".", 1)[-1])
    return bits


def plan_kv(loaded: Any, config: BudgetConfig, device: MemoryBudget, *,
            draft: Any = None, draft_rows: int = 0) -> KVPlan:
    """Size the block pool and the context ceiling for `loaded` (rules 1-6);
    `device` is the backend's `memory_budget()`; `draft` a loaded draft model."""
    block_size = config.block_size
    if block_size < 1:
        raise ConfigError(f"block_size must be >= 1, got {block_size}")
    budget, source = device_budget_bytes(config, getattr(loaded, "spec", None), device)
    weights = weights_nbytes(loaded.model)
    cache_spec = getattr(loaded, "cache_spec", None)
    bits = kv_bits_of(loaded, config)
    per_token = cache_spec.kv_bytes_per_token(loaded.dtype, bits) if cache_spec is not None \
        else kv_bytes_per_token(loaded.model, loaded.dtype, bits)
    num_slots = max(1, config.max_batch) if cache_spec is not None and cache_spec.has_state else 0
    state_bytes = num_slots * cache_spec.state_bytes_per_row if cache_spec and num_slots else 0
    kv_budget = (budget - weights - int(config.memory_headroom_fraction * budget)
                 - config.reserved_bytes - state_bytes)
    pool_cap = min(config.max_kv_pool_bytes,
                   getattr(loaded.spec, "max_kv_bytes", None) or config.max_kv_pool_bytes) \
        - state_bytes
    per_block = per_token * block_size
    trained = int(loaded.context_length)
    blocks_per_context = -(-trained // block_size)
    row_bytes = cache_spec.state_bytes_per_row if cache_spec is not None and num_slots else 0
    num_snaps = snapshot_count(row_bytes, per_block, min(kv_budget, pool_cap),
                               config.max_batch * blocks_per_context, config.max_batch)
    snap_bytes = num_snaps * row_bytes
    kv_budget, pool_cap, state_bytes = (kv_budget - snap_bytes, pool_cap - snap_bytes,
                                        state_bytes + snap_bytes)
    caps = (max(1, config.max_batch) * blocks_per_context, pool_cap // per_block)
    draft_blocks = draft_bytes = 0
    if draft is not None:  # rule 6
        kv_budget -= weights_nbytes(draft.model)
        ceiling = min(trained, min(kv_budget // per_block, *caps) * block_size)
        draft_blocks = max(1, draft_rows) * -(-max(ceiling, 1) // block_size)
        draft_pool = draft_blocks * block_size * kv_bytes_per_token(draft.model, draft.dtype)
        draft_bytes = weights_nbytes(draft.model) + draft_pool
        kv_budget -= draft_pool
    num_blocks = min(kv_budget // per_block, *caps)
    if num_blocks < 1:
        raise ConfigError(
            f"model {getattr(loaded.spec, 'name', '?')!r} leaves no room for its KV cache: "
            f"budget {budget} bytes ({source}), weights {weights} bytes"
            + (f", draft model {draft_bytes} bytes" if draft_bytes else "")
            + (f", recurrent state {state_bytes} bytes" if state_bytes else "") +
            f", headroom {config.memory_headroom_fraction:.0%}, held by other resident models "
            f"{config.reserved_bytes} bytes, one block {per_block} bytes")
    return KVPlan(num_blocks=int(num_blocks), block_size=block_size,
                  context_ceiling=min(trained, int(num_blocks) * block_size),
                  bytes_per_token=per_token, budget_bytes=budget, weights_bytes=weights,
                  budget_source=source, draft_num_blocks=int(draft_blocks),
                  draft_bytes=draft_bytes, num_state_slots=num_slots, state_bytes=state_bytes,
                  num_snapshots=num_snaps, kv_bits=bits)


def snapshot_count(row_bytes: int, block_bytes: int, room_bytes: int, max_blocks: int,
                   max_batch: int) -> int:
    """Rule 8: how many state snapshots `room_bytes` (what rule 7 leaves) buys."""
    if row_bytes <= 0 or room_bytes <= 0:
        return 0
    blocks = min(max_blocks, room_bytes // max(1, block_bytes))
    useful = max(1, max_batch) + -(-blocks // interval_blocks(blocks, blocks, row_bytes,
                                                               block_bytes))
    return int(min(useful, SNAPSHOT_SHARE * room_bytes // row_bytes))
