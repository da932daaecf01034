"""The cache list one forward hands the model: one object per entry of its `make_cache()`.

Why: the model file indexes the list it is given exactly as it indexes its
own `make_cache()` (kv/specs.py rule 1): nemotron_h's list skips its MLP
layers, Gemma 4's ends before its KV-shared layers, falcon_h1 nests a
(state, attention) pair per layer. So the engine mirrors that list entry by
entry: an attention entry becomes a `PagedLayerCache` over its own pool of
the `PagedKVStore` (whose per-pool geometry follows the spec), a recurrent
entry a `RecurrentLayerCache` over its pool of the `StateStore`, a list
entry mlx-lm's own `CacheList` of those.

Rules:
1. A KV-shared layer (Gemma 4's `num_kv_shared_layers`) has no entry: the
   model hands it the K/V its source layer's `update_and_fetch` returned, i.e.
   the source layer's pool as this forward read it; nothing is stored twice.
2. A sliding-window entry is a paged cache like any other: the model asks
   `make_mask(..., window_size=w)` and gets the windowed mask (paged.py rule 4).
   With `window_layout` (the rows' window tables, kv/window.py) it reads and
   writes through that layout instead: its blocks outside the window are freed.
3. With windowed tables on (`windowed`: the windowed entries' pools, set by
   the engine), a forked row's block copies go to the other pools, its
   `window_copies` to the windowed ones (their block ids are another pool's).
4. The store makes each attention entry's cache (`layer_cache`): a quantized
   store's speak the same protocol over its packed pools (quantized.py).
"""

from __future__ import annotations

from typing import Any

from mlx_lm.models.cache import CacheList

from .layout import BatchLayout, RowSpan
from .paged import PagedKVStore
from .recurrent import RecurrentLayerCache, RowSlots, StateStore
from .specs import CacheEntry, ModelCacheSpec


def make_model_caches(spec: ModelCacheSpec, store: PagedKVStore, states: StateStore | None,
                      layout: BatchLayout, rows: RowSlots | None,
                      grouped_mask: bool = False,
                      window_layout: BatchLayout | None = None) -> list[Any]:
    """The model's cache list for one forward over `layout` (and `rows`' state slots);
    windowed entries over `window_layout` where given (rule 2)."""

    def build(entry: CacheEntry) -> Any:
        if entry.kind == "list":
            return CacheList(*(build(part) for part in entry.parts))
        if entry.kind == "attention":
            windowed = window_layout is not None and spec.attention[entry.index].window
            return store.layer_cache(entry.index, window_layout if windowed and
                                     window_layout is not None else layout, grouped_mask)
        if states is None or rows is None:
            raise RuntimeError("a recurrent cache entry needs the state store and row slots")
        return RecurrentLayerCache(states, entry.index, rows)

    return [build(entry) for entry in spec.entries]


def window_layout(store: PagedKVStore, layout: BatchLayout, windowed: list[int] | None,
                  spans: list[RowSpan]) -> BatchLayout | None:
    """The layout of the rows' window tables (rule 2), or None when windows are off."""
    if windowed is None:
        return None
    window = BatchLayout(spans, block_size=store.block_size, trash_slot=store.trash_slot)
    window.rope_positions = layout.rope_positions
    return window


def copy_blocks(store: PagedKVStore, copies: list[tuple[int, int, int]],
                window_copies: list[tuple[int, int, int]], windowed: list[int] | None) -> None:
    """Rule 3: a forked row's partial blocks, each pool from its own table."""
    if windowed is None:
        store.copy_blocks(copies)
        return
    store.copy_blocks(copies, [i for i in range(store.num_layers) if i not in windowed])
    store.copy_blocks(window_copies, windowed)
