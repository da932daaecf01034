"""The CPU kernels' attention over keys where they lie (kv/paged.py rule 7): the numbers of
rule 2's gathered read, for every shape of row the engine sends."""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest

from frink_mlx.backend.cpu import kernels as cpu_kernels
from frink_mlx.engine.kv.layout import BatchLayout, RowSpan
from frink_mlx.engine.kv.paged import PagedKVStore, PagedLayerCache

HEADS, KV_HEADS, DIM = 6, 2, 16
READ = dict(masked=cpu_kernels.MASKED)


def _store(num_blocks=64, seed=0):
    store = PagedKVStore(num_layers=1, num_blocks=num_blocks, block_size=4, n_kv_heads=KV_HEADS,
                         head_dim=DIM, dtype=mx.float32)
    rng = np.random.default_rng(seed)
    shape = store.keys[0].shape
    store.keys[0] = mx.array(rng.standard_normal(shape).astype(np.float32))
    store.values[0] = mx.array(rng.standard_normal(shape).astype(np.float32))
    mx.eval(store.arrays())
    return store


def _both(rows, *, window=None, min_tokens=1, max_runs=8, min_run_blocks=1, seed=1):
    """(in place, gathered) outputs of one layer's attention over `rows`."""
    store = _store()
    layout = BatchLayout(rows, block_size=4, trash_slot=store.trash_slot)
    cache = PagedLayerCache(store, 0, layout)
    rng = np.random.default_rng(seed)
    length = layout.length
    new_k, new_v, q = (mx.array(rng.standard_normal(s).astype(np.float32)) for s in (
        (len(rows), KV_HEADS, length, DIM), (len(rows), KV_HEADS, length, DIM),
        (len(rows), HEADS, length, DIM)))
    keys, values = cache.update_and_fetch(new_k, new_v)
    mask = cache.make_mask(length, window_size=window)
    read = cache.read_in_place(keys, values, mask, min_tokens=min_tokens, max_runs=max_runs,
                               min_run_blocks=min_run_blocks, **READ)
    assert read is not None
    got = cpu_kernels.paged_attention(q, read, 0.25)
    full = mx.array(layout._mask_np(window))
    want = mx.fast.scaled_dot_product_attention(q, keys, values, scale=0.25, mask=full)
    real = np.array([[i < r.num_new for i in range(length)] for r in rows])
    return np.array(got)[real.nonzero()[0], :, real.nonzero()[1]], \
        np.array(want)[real.nonzero()[0], :, real.nonzero()[1]], read


@pytest.mark.parametrize("table", [[5, 6, 7, 2, 3], [9, 8, 7, 6, 5], [1, 11, 2, 12, 3, 13]])
def test_one_decode_row_over_its_runs_matches_the_gathered_read(table):
    got, want, read = _both([RowSpan(18, 1, table)])
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_runs_and_a_gathered_rest_match_the_gathered_read():
    table = [3, 4, 5, 6, 20, 30, 31, 40, 41, 42, 43, 50]
    got, want, read = _both([RowSpan(45, 1, table)], max_runs=2, min_run_blocks=3)
    assert len(read.direct[0].keys) == 3                  # two slices + the gathered rest
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_verify_rows_padding_and_short_rows_batched_match_the_gathered_read():
    rows = [RowSpan(30, 4, [10, 11, 12, 13, 14, 15, 16, 17, 18]), RowSpan(6, 1, [1, 2]),
            RowSpan(21, 2, [30, 31, 33, 32, 34, 35]), RowSpan(2, 3, [40, 41])]
    got, want, read = _both(rows, min_tokens=20)
    assert [seg.rows for seg in read.direct] == [(0,), (2,)] and read.batched == (1, 3)
    assert read.batched_keys.shape == (2, KV_HEADS, 7, DIM)   # as wide as the short rows
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_rows_read_together_over_shared_blocks_match_the_gathered_read():
    """kv/reads.py rule 5: a decode row, a 3-query verify row and a padded decode row over
    the same 8 leading blocks are one read; a row over other blocks stays alone."""
    shared = list(range(10, 18))
    rows = [RowSpan(40, 1, shared + [20, 21, 22]), RowSpan(36, 3, shared + [30, 31]),
            RowSpan(33, 1, shared + [40]), RowSpan(30, 1, list(range(50, 58)))]
    got, want, read = _both(rows)
    assert [seg.rows for seg in read.direct] == [(0, 1, 2), (3,)]
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_sliding_window_matches_the_gathered_read():
    rows = [RowSpan(37, 1, list(range(20, 30))), RowSpan(12, 2, [3, 1, 2, 4])]
    got, want, read = _both(rows, window=9)
    assert read.direct[0].keys[0].shape[2] < 40           # hidden blocks are not read
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_dispatch_reads_in_place_only_for_short_calls_over_long_rows(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "MIN_SCORES", 1)
    monkeypatch.setattr(cpu_kernels, "DIRECT_MIN_TOKENS", 16)
    calls = []
    real = cpu_kernels.paged_attention
    monkeypatch.setattr(cpu_kernels, "paged_attention",
                        lambda q, read, scale: calls.append(q.shape) or real(q, read, scale))
    sdpa = cpu_kernels.make_dispatch(lambda *a, **k: pytest.fail("stock path"))
    for start, num_new in ((20, 1), (4, 1), (0, 40)):
        store = _store()
        layout = BatchLayout([RowSpan(start, num_new, list(range(12)))], block_size=4,
                             trash_slot=store.trash_slot)
        cache = PagedLayerCache(store, 0, layout)
        new = mx.ones((1, KV_HEADS, num_new, DIM))
        keys, values = cache.update_and_fetch(new, new)
        q = mx.ones((1, HEADS, num_new, DIM))
        before = len(calls)
        out = sdpa(q, keys, values, cache=cache, scale=0.25, mask=cache.make_mask(num_new))
        mx.eval(out)
        taken = len(calls) - before
        # a 21-token row is read in place; a 5-token row and a 40-query prefill are not
        assert taken == (1 if (start, num_new) == (20, 1) else 0)


def test_columns_cut_over_side_streams_give_the_same_numbers(monkeypatch):
    """segments.py rule 2: each range's products on its own stream, same result."""
    from frink_mlx.backend.cpu import segments

    rng = np.random.default_rng(3)
    q = mx.array(rng.standard_normal((1, HEADS, 2, DIM)).astype(np.float32))
    keys = [mx.array(rng.standard_normal((1, KV_HEADS, n, DIM)).astype(np.float32)) for n in (40, 7, 29)]
    values = [mx.array(rng.standard_normal((1, KV_HEADS, n, DIM)).astype(np.float32)) for n in (40, 7, 29)]
    bias = mx.array(np.where(rng.random((1, 1, 1, 2, 76)) < 0.2, cpu_kernels.MASKED, 0.0)
                    .astype(np.float32))
    whole = segments.segment_attention(q, keys, values, 0.25, bias)
    monkeypatch.setattr(segments, "SPLIT_COLUMNS", 10)
    ranges = segments._column_ranges(keys, values, 3)
    assert [[k.shape[2] for k in ks] for ks, _ in ranges] == [[25], [15, 7, 3], [26]]
    streams = [mx.new_thread_local_stream(mx.cpu) for _ in range(2)]
    split = segments.segment_attention(q, keys, values, 0.25, bias, streams)
    assert np.allclose(np.array(split), np.array(whole), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(segments, "SPLIT_COLUMNS", 40)          # 76 columns: one range of 40+
    assert len(segments._column_ranges(keys, values, 3)) == 1


def test_narrow_rows_dealt_over_side_streams_give_the_same_numbers(monkeypatch):
    """segments.py rule 3: rows each run whole on one stream, widest first to the lightest,
    when that balances the streams; otherwise rows too narrow to split are dealt in turn
    and a row wide enough keeps rule 2's split; the output is the one-stream call's."""
    from frink_mlx.backend.cpu import segments, split

    assert segments.row_lanes([10, 10, 10], 1) == [0, 1, 0]        # 20:10, not balanced
    assert segments.row_lanes([10, 5000, 10], 1) == [0, None, 1]
    assert segments.row_lanes([8000] * 4, 1) == [0, 1, 0, 1]      # wide rows dealt whole
    assert segments.row_lanes([5000, 4000, 1000], 1) == [0, 1, 1]
    assert segments.row_lanes([8000] * 3, 1) == [None] * 3         # 2:1: each row split
    assert segments.row_lanes([10], 1) == [None] and segments.row_lanes([10, 10], 0) == [None, None]
    rows = [RowSpan(30, 1, list(range(10, 18))), RowSpan(26, 2, list(range(20, 27))),
            RowSpan(40, 1, list(range(30, 41))), RowSpan(6, 1, [1, 2])]
    alone, want, read = _both(rows, min_tokens=20)
    assert [seg.rows for seg in read.direct] == [(0,), (1,), (2,)]
    streams = [mx.new_thread_local_stream(mx.cpu)]
    dealt = []
    real = segments.row_lanes
    monkeypatch.setattr(cpu_kernels, "row_lanes", lambda w, n: dealt.append(real(w, n)) or dealt[-1])
    with split.split_forward(streams):
        got, _, _ = _both(rows, min_tokens=20)
    assert dealt == [[1, 1, 0]]  # widths 31, 28, 41: 41 | 31 + 28
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert np.allclose(got, alone, rtol=1e-6, atol=1e-6)


def test_a_gathered_batch_cut_over_side_streams_gives_the_same_numbers(monkeypatch):
    """segments.py rule 3, gathered: a batch of rows cut into one part per stream."""
    from frink_mlx.backend.cpu import segments

    rng = np.random.default_rng(5)
    q = mx.array(rng.standard_normal((3, HEADS, 1, DIM)).astype(np.float32))
    k, v = (mx.array(rng.standard_normal((3, KV_HEADS, 50, DIM)).astype(np.float32))
            for _ in range(2))
    bias = mx.array(np.where(rng.random((3, 1, 1, 1, 50)) < 0.3, cpu_kernels.MASKED, 0.0)
                    .astype(np.float32))
    streams = [mx.new_thread_local_stream(mx.cpu)]
    whole = cpu_kernels.attention(q, k, v, 0.25, bias)
    monkeypatch.setattr(cpu_kernels, "SPLIT_COLUMNS", 10)
    parts = []
    real = cpu_kernels.attention
    monkeypatch.setattr(cpu_kernels, "attention",
                        lambda q, *a: parts.append(q.shape[0]) or real(q, *a))
    cut = cpu_kernels.batch_attention(q, k, v, 0.25, bias, streams)
    assert parts == [1, 2]
    assert np.allclose(np.array(cut), np.array(whole), rtol=1e-6, atol=1e-6)
    quant = (32, 8)                                            # kv_bits triples, cut the same
    q32 = mx.array(rng.standard_normal((3, HEADS, 1, 32)).astype(np.float32))
    qk, qv = (mx.quantize(mx.array(rng.standard_normal((3, KV_HEADS, 50, 32)).astype(np.float32)),
                          group_size=32, bits=8) for _ in range(2))
    parts.clear()
    cut = cpu_kernels.batch_attention(q32, qk, qv, 0.25, bias, streams, quant)
    assert parts == [1, 2]
    assert np.allclose(np.array(cut), np.array(real(q32, qk, qv, 0.25, bias, quant)),
                       rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(cpu_kernels, "SPLIT_COLUMNS", 100)     # 150 columns: not worth a cut
    parts.clear()
    cpu_kernels.batch_attention(q, k, v, 0.25, bias, streams)
    assert parts == [3] and segments.SPLIT_COLUMNS == 1024


def _data_pointer(a: mx.array) -> int:
    return np.asarray(memoryview(a)).__array_interface__["data"][0]


def test_reads_in_place_keep_the_writes_in_place(tiny_llama_dir, monkeypatch):
    """kv/paged.py rule 1 under rule 7: the slices attention reads are views of the pool,
    gone once the step is evaluated, so the next step's scatter still writes in place."""
    from mlx_lm import load

    from frink_mlx.backend.cpu.backend import CpuBackend
    from frink_mlx.engine.kv.paged import make_layer_caches, model_kv_geometry

    monkeypatch.setattr(cpu_kernels, "MIN_SCORES", 1)
    monkeypatch.setattr(cpu_kernels, "DIRECT_MIN_TOKENS", 1)
    read = []
    real = cpu_kernels.segment_attention
    monkeypatch.setattr(cpu_kernels, "segment_attention", lambda *a: read.append(1) or real(*a))
    model, _ = load(str(tiny_llama_dir))
    scope = CpuBackend(matmul_parts=1).prepare_decoder(model)
    layers, heads, head_dim = model_kv_geometry(model)
    store = PagedKVStore(num_layers=layers, num_blocks=256, block_size=4, n_kv_heads=heads,
                         head_dim=head_dim, dtype=mx.float32)
    before = [_data_pointer(a) for a in store.keys + store.values]
    for pos in range(3, 7):
        lay = BatchLayout([RowSpan(pos, 1, [9, 10])], block_size=4, trash_slot=store.trash_slot)
        with scope():
            mx.eval(model(mx.array([[7]]), cache=make_layer_caches(store, lay)), store.arrays())
    assert read and [_data_pointer(a) for a in store.keys + store.values] == before
