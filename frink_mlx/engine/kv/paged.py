"""Paged KV storage in MLX arrays, speaking mlx-lm's cache protocol.

Why: continuous batching needs every sequence's keys and values to live in
one fixed pool addressed by block tables (kv/manager.py decides which block
holds what), yet we want to run the *stock* mlx-lm model files (llama,
qwen2, qwen3, mistral, ...) unchanged. Those files only ever talk to a cache
object through a small duck-typed protocol:

    queries = rope(queries, offset=cache.offset)        # per-row positions
    keys, values = cache.update_and_fetch(keys, values)  # write new, read all
    mask = cache.make_mask(N, return_array=..., window_size=...)

so one `PagedLayerCache` per layer per forward call, backed by the shared
`PagedKVStore`, is all it takes; the call's index arrays (`BatchLayout`, the
rules below name them) are layout.py's.

Layout (head-major slots, one pool per layer for K and one for V):

    pool[layer]  shape (n_kv_heads, num_blocks * block_size + 1, head_dim)
                 flat slot = block_id * block_size + offset_in_block
                 the extra last slot is the *trash slot*: padding tokens
                 write there and padded read positions point there.

    block table [7, 2, 5]  (block_size 4), sequence length 10:
        position  0 1 2 3 | 4 5 6 7 | 8 9
        slot     28..31   |  8..11  | 20 21

Rules:
1. Writes are `pool[:, write_slots] = new_kv`, an in-place scatter. MLX only
   updates in place when the pool array has exactly one live reference, so
   the store is the sole owner of each pool array; never keep another
   reference (not in a test, not in a cache object) or every step becomes a
   full copy of the pool (decode time would then grow with num_blocks).
2. Reads gather `pool[:, read_slots]` with `read_slots` shaped (B, T): row
   r's positions 0..T-1, padded with the trash slot -> (H, B, T, D), viewed
   as (B, H, T, D). The gather runs as a row gather on the pool's
   (H * slots, D) view with (H, B, T) row indices: MLX's CPU gather along a
   non-leading axis is slower (benchmarks/results/design-notes.md, "KV reads").
   Head-major matters on the CPU backend: every (row, head) slab of T x D
   comes out of the gather contiguous, exactly the layout of mlx-lm's
   KVCache slice, so `mx.fast.scaled_dot_product_attention` reads it as is,
   where a slot-major pool's transposed gather must be copied first.
   Memory traffic per layer per step: the gather reads and writes
   B*T*H*D elements for K and again for V, which attention then reads once
   more; i.e. ~2x the bytes of the live context rows, against ~1x for
   mlx-lm's contiguous KVCache, and every row padded to the longest. Small
   next to the weights at a few hundred tokens (SmolLM2-135M: 46 KB of fp32
   KV per token vs 540 MB of weights), it is most of a step's growth at
   thousands: the CPU backend's attention reads long rows in place instead
   (rule 7); Metal still gathers.
3. Every row carries its own RoPE start position (`offset` is an int32
   array of shape (B,)); `mx.fast.rope` accepts an array offset. A model
   whose positions are not its indices (M-RoPE: models/vision.py rule 6)
   reads explicit ids instead, `rope_positions` (3, B, L), which the runner
   sets on the layout when a row of the forward needs them (None otherwise).
4. The boolean mask has shape (B, 1, L, T): query i of row r (absolute
   position start_r + i) may see key position j iff j <= start_r + i (and,
   with a sliding window w, j > start_r + i - w). Padding queries (i beyond
   the row's real tokens) see only key 0, so no softmax row is empty and
   no NaN can leak into the trash slot. A single unpadded row needs no mask
   array (None for one token, "causal" for a fresh prompt), which keeps the
   single-stream path on the same kernels as mlx-lm.
5. Model files that reshape queries per KV group and score them without
   SDPA (gemma2: scores (B, n_kv_heads, repeats, L, T)) ask for the mask with
   `return_array=True`; for them the caches are built with `grouped_mask`,
   which hands out the (B, 1, 1, L, T) view so it broadcasts over the group
   axis. One row never needed it (a leading 1 broadcasts); two or more did.
   `groups_queries_per_kv_head(model)` says which models need it.
6. A pipeline stage (mlx-lm's `PipelineMixin`, backend/distributed.py rule
   3) that sends its hidden state on ties the send to its last layer's pool:
   `cache[-1].keys = mx.depends(cache[-1].keys, h)`, so that evaluating the
   pools also runs the send (a non-final prefill chunk evaluates nothing
   else, and the next stage would wait forever). `keys` is that layer's K
   pool, read and replaced through the store; the replacement is the same
   array plus a dependency (same shape and dtype, checked), sharing the
   pool's buffer, so the next step's scatter still writes in place (rule 1).
7. Reads where the keys lie (reads.py): an attention kernel that can score a
   row over several key segments (the CPU backend's) may ask a layer's cache
   for `read_in_place(keys, values, mask, ...)` instead of using rule 2's
   gather: long rows, and rows read together over shared blocks, come back as
   slices of the pool (its runs of adjacent blocks) with the mask over their
   columns, the other rows gathered only as wide as they need. It answers
   only for the very arrays `update_and_fetch` just returned (compared by id,
   never kept: rule 1) and a mask this layout made (its window is read back
   from the memo); otherwise, or when no row is read in place (reads.py rule
   1), None. The gathers `update_and_fetch` returned are lazy and nothing
   else reads them, so MLX never runs them. Metal and the stock path
   never ask, and read as rule 2 says, as do tables with freed blocks (-1: window.py).
8. Quantized pools (`kv_bits`, quantized.py): a `QuantizedKVStore` holds each
   pool as packed words, scales and biases over the same slots and hands out
   its own layer caches (`layer_cache`); block tables, slots, masks and the
   trash slot are exactly as above.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from .geometry import groups_queries_per_kv_head, model_kv_geometry  # noqa: F401 (their old home)
from .layout import BatchLayout
from .reads import LayerRead, ReadShape, layer_read, take_rows

_take_rows = take_rows  # rule 2's gather; reads.py holds it so that both reads gather alike


class PagedKVStore:
    """The per-layer K/V pools. The only owner of the pool arrays (rule 1)."""

    bits: int | None = None  # rule 8: quantized pools (quantized.py) say how many bits

    def __init__(
        self,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        n_kv_heads: int,
        head_dim: int,
        dtype: mx.Dtype,
        v_head_dim: int | None = None,
        geometries: Sequence[tuple[int, int, int]] | None = None,
    ) -> None:
        """`geometries`: (n_kv_heads, head_dim, v_head_dim) per layer where layers
        differ (kv/specs.py: Gemma 4's full-attention layers); it overrides the
        uniform `num_layers` x (`n_kv_heads`, `head_dim`, `v_head_dim`)."""
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1 (got {num_blocks}, {block_size})")
        v_head_dim = v_head_dim or head_dim
        shapes = list(geometries) if geometries is not None else \
            [(n_kv_heads, head_dim, v_head_dim)] * num_layers
        self.num_layers = len(shapes)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.n_kv_heads, self.head_dim, self.v_head_dim = shapes[0] if shapes else \
            (n_kv_heads, head_dim, v_head_dim)
        self.dtype = dtype
        self.num_slots = num_blocks * block_size
        self.trash_slot = self.num_slots
        self.keys: list[mx.array] = []
        self.values: list[mx.array] = []
        self._allocate(shapes)
        mx.eval(self.arrays())

    def _allocate(self, shapes: Sequence[tuple[int, int, int]]) -> None:
        self.keys = [mx.zeros((h, self.num_slots + 1, d), self.dtype) for h, d, _ in shapes]
        self.values = [mx.zeros((h, self.num_slots + 1, dv), self.dtype) for h, _, dv in shapes]

    def pool_lists(self) -> list[list[mx.array]]:
        """Every list of per-layer pools (K and V here; their parts when quantized)."""
        return [self.keys, self.values]

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    def release(self) -> None:
        """Drop the pools (engine shutdown); the store is unusable afterwards."""
        for pools in self.pool_lists():
            pools.clear()

    def arrays(self) -> list[mx.array]:
        """The pools, for `mx.eval`/`mx.async_eval` (do not keep the list)."""
        return [a for pools in self.pool_lists() for a in pools]

    def layer_arrays(self, layer: int) -> list[mx.array]:
        """One layer's pools (turns.py evaluates layer by layer)."""
        return [pools[layer] for pools in self.pool_lists()]

    def layer_cache(self, layer: int, layout: BatchLayout,
                    grouped_mask: bool = False) -> PagedLayerCache:
        """The protocol object of one layer for a forward over `layout`."""
        return PagedLayerCache(self, layer, layout, grouped_mask)

    def copy_blocks(self, pairs: Sequence[tuple[int, int, int]], layers: Sequence[int] | None = None) -> None:
        """Copy the first `num` slots of block `src` into block `dst`, every layer (or `layers`).

        Used when forking n > 1 rows: children share full blocks but need
        their own copy of the partially filled last block. The gather is
        evaluated before the scatter so the scatter stays in place (rule 1).
        """
        if not pairs:
            return
        bs = self.block_size
        src = mx.array(np.concatenate([np.arange(s * bs, s * bs + n) for s, _, n in pairs]), mx.int32)
        dst = mx.array(np.concatenate([np.arange(d * bs, d * bs + n) for _, d, n in pairs]), mx.int32)
        for pools in self.pool_lists():
            for i in range(self.num_layers) if layers is None else layers:
                rows = pools[i][:, src]
                mx.eval(rows)
                pools[i][:, dst] = rows
        mx.eval(self.arrays())


class PagedLayerCache:
    """mlx-lm's per-layer cache protocol over one layer of a `PagedKVStore`.

    Built fresh for each forward call (cheap: it only holds indices). It
    never keeps a pool array itself (rule 1): it reaches through the store.
    """

    def __init__(self, store: PagedKVStore, layer: int, layout: BatchLayout,
                 grouped_mask: bool = False) -> None:
        self._store = store
        self._layer = layer
        self._layout = layout
        self._grouped_mask = grouped_mask
        self._fetched: tuple[int, int] | None = None  # ids of the last fetch (rule 7)
        self.offset = layout.offsets

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        batch, heads, length, _ = keys.shape
        lay, i, store = self._layout, self._layer, self._store
        k_new = keys.transpose(1, 0, 2, 3).reshape(heads, batch * length, keys.shape[-1])
        v_new = values.transpose(1, 0, 2, 3).reshape(heads, batch * length, values.shape[-1])
        store.keys[i][:, lay.write_slots] = k_new.astype(store.dtype)
        store.values[i][:, lay.write_slots] = v_new.astype(store.dtype)
        rows = lay.read_rows(heads, store.num_slots + 1)
        k_all = take_rows(store.keys[i], rows).transpose(1, 0, 2, 3)
        v_all = take_rows(store.values[i], rows).transpose(1, 0, 2, 3)
        self._fetched = (id(k_all), id(v_all))
        return k_all, v_all

    def read_in_place(self, keys: mx.array, values: mx.array, mask: object, *,
                      min_tokens: int, max_runs: int, min_run_blocks: int,
                      masked: float) -> LayerRead | None:
        """Rule 7: this layer's K/V where they lie, or None (read `keys`/`values` then)."""
        if self._fetched != (id(keys), id(values)):
            return None
        made, window = self._layout.window_of(mask)
        if not made:
            return None
        k_pool, v_pool = self._store.keys[self._layer], self._store.values[self._layer]
        shape = ReadShape(self._store.block_size, k_pool.shape[0], k_pool.shape[1],
                          self._layout.length)
        plan = self._layout.read_plan(window, shape, min_tokens=min_tokens, max_runs=max_runs,
                                      min_run_blocks=min_run_blocks, masked=masked)
        return None if plan is None else layer_read(plan, k_pool, v_pool)

    def make_mask(
        self, N: int, return_array: bool = False, window_size: int | None = None, **_: Any
    ) -> mx.array | str | None:
        value = self._layout.mask(window_size)
        if return_array and not isinstance(value, mx.array):
            value = mx.array(self._layout._mask_np(window_size))
        if return_array and self._grouped_mask and isinstance(value, mx.array):
            value = mx.expand_dims(value, 2)  # (B, 1, 1, L, T): rule 5
        return value

    def layout_memo(self, key: Any, value: Any = None) -> Any:
        """A memo shared by every layer of this forward (e.g. a mask's additive form)."""
        if value is not None:
            self._layout._memo[key] = value
        return self._layout._memo.get(key)

    @property
    def rope_positions(self) -> mx.array | None:
        """Rule 3: the forward's explicit M-RoPE position ids, or None."""
        return self._layout.rope_positions

    @property
    def keys(self) -> mx.array:
        """This layer's K pool as the store holds it now (rule 6)."""
        return self._store.keys[self._layer]

    @keys.setter
    def keys(self, value: mx.array) -> None:
        pool = self._store.keys[self._layer]
        if value.shape != pool.shape or value.dtype != pool.dtype:
            raise ValueError(f"a layer's keys may only be replaced by the pool itself plus a "
                             f"dependency (rule 6); got {value.shape} {value.dtype}")
        self._store.keys[self._layer] = value

    # --- the rest of the protocol: the pool, not this view, holds the state ---
    @property
    def state(self) -> list[mx.array]:
        return []

    @property
    def nbytes(self) -> int:
        return 0

    def is_trimmable(self) -> bool:
        return False

    def trim(self, n: int) -> int:
        return 0

    def empty(self) -> bool:
        return False

    def size(self) -> int:
        return self._layout.width


def make_layer_caches(store: PagedKVStore, layout: BatchLayout,
                      grouped_mask: bool = False) -> list[PagedLayerCache]:
    """One protocol object per layer for a forward call over `layout` (rule 5: `grouped_mask`)."""
    return [store.layer_cache(i, layout, grouped_mask) for i in range(store.num_layers)]
