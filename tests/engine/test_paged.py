"""Paged KV storage: slot arithmetic, masks, in-place writes, parity through stock llama."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm import load
from mlx_lm.generate import generate_step

from frink_mlx.engine.kv.layout import BatchLayout, RowSpan
from frink_mlx.engine.kv.paged import (
    PagedKVStore,
    _take_rows,
    make_layer_caches,
    model_kv_geometry,
)


@pytest.fixture(scope="module")
def tiny(tiny_llama_dir):
    model, _ = load(str(tiny_llama_dir))
    return model


def _store(model, num_blocks=64, block_size=4):
    layers, heads, head_dim = model_kv_geometry(model)
    return PagedKVStore(num_layers=layers, num_blocks=num_blocks, block_size=block_size,
                        n_kv_heads=heads, head_dim=head_dim, dtype=mx.float32)


def test_layout_slots_follow_block_tables():
    lay = BatchLayout([RowSpan(0, 10, [7, 2, 5]), RowSpan(3, 2, [1, 4])], block_size=4, trash_slot=99)
    read = np.array(lay.read_slots)
    assert read[0].tolist() == [28, 29, 30, 31, 8, 9, 10, 11, 20, 21]
    assert read[1].tolist() == [4, 5, 6, 7, 16] + [99] * 5
    write = np.array(lay.write_slots).reshape(2, 10)
    assert write[0].tolist() == read[0].tolist()
    assert write[1].tolist() == [7, 16] + [99] * 8   # positions 3, 4 then padding
    assert np.array(lay.offsets).tolist() == [0, 3]


def test_reads_gather_every_head_of_each_rows_slots():
    lay = BatchLayout([RowSpan(0, 10, [7, 2, 5]), RowSpan(3, 2, [1, 4])], block_size=4, trash_slot=99)
    rows = np.array(lay.read_rows(3, 100))
    slots = np.array(lay.read_slots)
    assert rows.shape == (3, 2, 10)
    assert all((rows[h] == h * 100 + slots).all() for h in range(3))
    assert lay.read_rows(3, 100) is lay.read_rows(3, 100)  # built once per forward
    pool = mx.array(np.random.default_rng(0).standard_normal((3, 100, 8)).astype(np.float32))
    assert np.array_equal(np.array(_take_rows(pool, lay.read_rows(3, 100))),
                          np.array(pool[:, lay.read_slots]))


def test_mask_is_causal_per_row_and_padding_sees_key_zero():
    lay = BatchLayout([RowSpan(2, 2, [0]), RowSpan(0, 1, [1])], block_size=4, trash_slot=8)
    mask = np.array(lay.mask())
    assert mask.shape == (2, 1, 2, 4)
    assert mask[0, 0].tolist() == [[True, True, True, False], [True, True, True, True]]
    assert mask[1, 0].tolist() == [[True, False, False, False], [True, False, False, False]]
    windowed = np.array(lay.mask(window_size=2))
    assert windowed[0, 0, 1].tolist() == [False, False, True, True]


def test_single_row_uses_mlx_lm_fast_masks():
    assert BatchLayout([RowSpan(5, 1, [0, 1])], block_size=4, trash_slot=8).mask() is None
    assert BatchLayout([RowSpan(0, 5, [0, 1])], block_size=4, trash_slot=8).mask() == "causal"


def test_short_block_table_is_refused():
    with pytest.raises(ValueError, match="block table"):
        BatchLayout([RowSpan(0, 9, [0, 1])], block_size=4, trash_slot=8)


def test_ragged_batch_matches_generate_step(tiny):
    prompts = [[5, 6, 7, 8, 9, 10, 11], [20, 21, 22], [30 + i for i in range(13)]]
    num_tokens = 8
    expected = [[int(t) for t, _ in generate_step(mx.array(p), tiny, max_tokens=num_tokens)]
                for p in prompts]
    store = _store(tiny)
    tables = [list(range(i * 16, i * 16 + 16))[::-1] for i in range(3)]
    lay = BatchLayout([RowSpan(0, len(p), tables[i]) for i, p in enumerate(prompts)],
                      block_size=4, trash_slot=store.trash_slot)
    inputs = mx.array([p + [0] * (lay.length - len(p)) for p in prompts])
    logits = tiny(inputs, cache=make_layer_caches(store, lay))
    tokens = mx.argmax(mx.stack([logits[i, len(p) - 1] for i, p in enumerate(prompts)]), -1).tolist()
    got = [[t] for t in tokens]
    lengths = [len(p) for p in prompts]
    for _ in range(num_tokens - 1):
        lay = BatchLayout([RowSpan(lengths[i], 1, tables[i]) for i in range(3)],
                          block_size=4, trash_slot=store.trash_slot)
        logits = tiny(mx.array(tokens)[:, None], cache=make_layer_caches(store, lay))
        tokens = mx.argmax(logits[:, -1], -1).tolist()
        for i in range(3):
            got[i].append(tokens[i])
            lengths[i] += 1
    assert got == expected


def _data_pointer(a: mx.array) -> int:
    return np.asarray(memoryview(a)).__array_interface__["data"][0]


def test_writes_update_the_pool_in_place(tiny):
    """Rule 1: a decode step must not copy the pool (decode time independent of num_blocks)."""
    store = _store(tiny, num_blocks=256)
    before = [_data_pointer(a) for a in store.keys]
    lay = BatchLayout([RowSpan(0, 3, [9])], block_size=4, trash_slot=store.trash_slot)
    mx.eval(tiny(mx.array([[4, 5, 6]]), cache=make_layer_caches(store, lay)), store.arrays())
    for _ in range(3):
        lay = BatchLayout([RowSpan(3, 1, [9, 10])], block_size=4, trash_slot=store.trash_slot)
        mx.eval(tiny(mx.array([[7]]), cache=make_layer_caches(store, lay)), store.arrays())
    assert [_data_pointer(a) for a in store.keys] == before
    assert float(mx.abs(store.keys[0][:, 36:40]).sum()) > 0  # block 9 was written


def test_copy_blocks_copies_slots(tiny):
    store = _store(tiny, num_blocks=8)
    heads, _, dim = store.keys[0].shape
    store.keys[0][:, 4:6] = mx.ones((heads, 2, dim))
    mx.eval(store.keys)
    store.copy_blocks([(1, 3, 2)])
    assert float(store.keys[0][:, 12:14].sum()) == float(store.keys[0][:, 4:6].sum()) > 0
    assert float(store.keys[0][:, 14:16].sum()) == 0
