"""Reads where the keys lie (kv/reads.py, kv/paged.py rule 7): which slots, which mask."""

from __future__ import annotations

import mlx.core as mx
import numpy as np

from frink_mlx.engine.kv.layout import BatchLayout, RowSpan
from frink_mlx.engine.kv.paged import PagedKVStore, PagedLayerCache
from frink_mlx.engine.kv.reads import ReadShape

MASKED = -1e9


def _plan(rows, *, window=None, min_tokens=1, max_runs=8, min_run_blocks=1, slots_per_head=101):
    layout = BatchLayout(rows, block_size=4, trash_slot=slots_per_head - 1)
    shape = ReadShape(4, 2, slots_per_head, layout.length)
    return layout.read_plan(window, shape, min_tokens=min_tokens, max_runs=max_runs,
                            min_run_blocks=min_run_blocks, masked=MASKED)


def _visible(bias, num_columns):
    """(L, n) booleans of a row's bias (None: all visible)."""
    if bias is None:
        return None
    b = np.array(bias)
    assert b.shape[:3] == (1, 1, 1) and b.shape[-1] == num_columns
    return b[0, 0, 0] == 0


def test_a_rows_blocks_sorted_into_runs_of_adjacent_ids():
    # positions 0-3 in block 5, 4-7 in 6, 8-11 in 7, 12-15 in 2, 16-17 in 3 (partly filled);
    # a verify row (3 queries at 15-17) sees its columns through a mask
    plan = _plan([RowSpan(15, 3, [5, 6, 7, 2, 3])])
    (read,) = plan.direct
    assert read.runs == ((8, 16), (20, 32)) and read.rest is None
    visible = _visible(read.bias, 20)
    # columns: blocks 2, 3 (positions 12..19), then 5, 6, 7 (0..11); 18 and 19 unwritten
    assert visible[2].tolist() == [True] * 6 + [False, False] + [True] * 12
    assert visible[0].tolist() == [True] * 4 + [False] * 4 + [True] * 12
    assert plan.batched == () and plan.batched_rows is None


def test_a_decode_row_reads_only_its_visible_slots_and_needs_no_mask():
    # rule 3: the same table, one query at position 17: block 3's slots 14, 15 are cut off
    plan = _plan([RowSpan(17, 1, [5, 6, 7, 2, 3])])
    (read,) = plan.direct
    assert read.runs == ((8, 14), (20, 32)) and read.rest is None and read.bias is None
    # its last block (4: positions 8-9) inside the run of blocks 4-6: the run is cut in two
    plan = _plan([RowSpan(9, 1, [5, 6, 4])])
    assert plan.direct[0].runs == ((16, 18), (20, 28)) and plan.direct[0].bias is None
    # its last block (20: positions 16-17) in the gathered rest: its unwritten slots are left out
    plan = _plan([RowSpan(17, 1, [3, 4, 5, 6, 20])], max_runs=1, min_run_blocks=2)
    (read,) = plan.direct
    assert read.runs == ((12, 28),) and read.bias is None
    assert np.array(read.rest)[:, 0].tolist() == [[80, 81], [181, 182]]


def test_a_full_last_block_needs_no_mask_and_one_run_is_one_slice():
    plan = _plan([RowSpan(15, 1, [9, 10, 11, 12])])
    assert plan.direct[0].runs == ((36, 52),) and plan.direct[0].bias is None


def test_short_and_scattered_runs_are_gathered_into_one_segment():
    table = [3, 4, 5, 6, 20, 30, 31]   # runs: 3-6 (4 blocks), 20 (1), 30-31 (2)
    plan = _plan([RowSpan(27, 1, table)], max_runs=2, min_run_blocks=2)
    (read,) = plan.direct
    assert read.runs == ((12, 28), (120, 128))
    rest = np.array(read.rest)
    assert rest.shape == (2, 1, 4)
    assert rest[0, 0].tolist() == [80, 81, 82, 83] and rest[1, 0].tolist() == [181, 182, 183, 184]
    plan = _plan([RowSpan(27, 1, table)], max_runs=1, min_run_blocks=1)
    assert plan.direct[0].runs == ((12, 28),) and np.array(plan.direct[0].rest).shape == (2, 1, 12)


def test_verify_rows_see_causally_and_padding_queries_see_position_zero():
    rows = [RowSpan(6, 3, [0, 1, 2]), RowSpan(5, 1, [7, 8])]   # L = 3; row 1 padded
    plan = _plan(rows)
    first, second = plan.direct
    assert first.runs == ((0, 12),) and second.runs == ((28, 36),)
    v = _visible(first.bias, 12)
    assert [row.tolist().index(False) for row in v] == [7, 8, 9]   # query i sees 0..6+i
    v = _visible(second.bias, 8)
    assert v[0].tolist() == [True] * 6 + [False, False]
    assert v[1].tolist() == v[2].tolist() == [True] + [False] * 7


def test_rows_below_min_tokens_are_batched_over_their_own_width():
    rows = [RowSpan(40, 1, list(range(11))), RowSpan(2, 1, [20]), RowSpan(5, 1, [30, 31])]
    plan = _plan(rows, min_tokens=20)
    assert [r.rows for r in plan.direct] == [(0,)] and plan.batched == (1, 2)
    batched = np.array(plan.batched_rows)
    assert batched.shape == (2, 2, 6)                          # width 6, not the layout's 41
    assert batched[0].tolist() == [[80, 81, 82, 100, 100, 100], [120, 121, 122, 123, 124, 125]]
    assert (batched[1] == batched[0] + 101).all()
    bias = np.array(plan.batched_bias)
    assert bias.shape == (2, 1, 1, 1, 6)
    assert (bias[:, 0, 0, 0] == 0).tolist() == [[True] * 3 + [False] * 3, [True] * 6]
    assert _plan(rows, min_tokens=42) is None                  # nobody long enough: rule 2 as is


def test_a_window_skips_the_blocks_it_hides():
    plan = _plan([RowSpan(20, 1, [1, 2, 3, 4, 5, 6])], window=6)   # query 20 sees 15..20
    (read,) = plan.direct
    assert read.runs == ((16, 28),)                             # blocks 4, 5, 6: positions 12..23
    assert _visible(read.bias, 12)[0].tolist() == [False] * 3 + [True] * 6 + [False] * 3


def test_the_plan_is_made_once_per_forward():
    layout = BatchLayout([RowSpan(9, 1, [1, 2, 3])], block_size=4, trash_slot=100)
    shape = ReadShape(4, 2, 101, 1)
    kw = dict(min_tokens=1, max_runs=8, min_run_blocks=1, masked=MASKED)
    assert layout.read_plan(None, shape, **kw) is layout.read_plan(None, shape, **kw)


def _cache(rows, num_blocks=16):
    store = PagedKVStore(num_layers=1, num_blocks=num_blocks, block_size=4, n_kv_heads=2,
                         head_dim=8, dtype=mx.float32)
    layout = BatchLayout(rows, block_size=4, trash_slot=store.trash_slot)
    return store, layout, PagedLayerCache(store, 0, layout)


def test_only_the_fetched_arrays_and_this_layouts_masks_are_read_in_place():
    store, layout, cache = _cache([RowSpan(5, 1, [2, 3])])
    new = mx.ones((1, 2, 1, 8))
    keys, values = cache.update_and_fetch(new, new)
    kw = dict(min_tokens=1, max_runs=8, min_run_blocks=1, masked=MASKED)
    mask = cache.make_mask(1)
    read = cache.read_in_place(keys, values, mask, **kw)
    assert read is not None and [seg.rows for seg in read.direct] == [(0,)]
    (seg,) = read.direct
    assert [k.shape for k in seg.keys] == [(1, 2, 6, 8)]  # rule 3: slots 6, 7 are past its end
    assert np.array_equal(np.array(seg.keys[0][0, :, 5]), np.ones((2, 8)))  # this step's write
    assert cache.read_in_place(keys + 0, values, mask, **kw) is None        # not the fetched keys
    assert cache.read_in_place(keys, values, mx.array([[True]]), **kw) is None  # a foreign mask


def test_rows_over_the_same_leading_blocks_are_read_once_with_their_own_columns_masked():
    """kv/reads.py rule 5: two decode rows forked from one 24-token prompt (blocks 10-15),
    each with its own last block: one read, the shared run once, each row's queries blind
    to the other row's block."""
    shared = [10, 11, 12, 13, 14, 15]
    plan = _plan([RowSpan(25, 1, shared + [40]), RowSpan(26, 1, shared + [50])])
    (read,) = plan.direct
    assert read.rows == (0, 1) and read.rest is None
    assert read.runs == ((40, 64), (160, 164), (200, 204))   # blocks 10-15, 40, 50
    visible = _visible(read.bias, 32)
    assert visible.shape == (2, 32)                           # one query per row, stacked
    assert visible[0].tolist() == [True] * 24 + [True, True, False, False] + [False] * 4
    assert visible[1].tolist() == [True] * 24 + [False] * 4 + [True, True, True, False]


def test_rows_share_a_read_only_where_the_shared_blocks_outweigh_their_own():
    shared = [10, 11, 12]
    own = [[40, 41, 42, 43], [50, 51, 52, 53]]          # 3 shared blocks, 8 of their own
    plan = _plan([RowSpan(27, 1, shared + own[0]), RowSpan(27, 1, shared + own[1])])
    assert [r.rows for r in plan.direct] == [(0,), (1,)]
    long = list(range(10, 20))                            # 10 shared blocks, 2 of their own
    rows = [RowSpan(41, 1, long + [40]), RowSpan(41, 1, long + [50])]
    assert [r.rows for r in _plan(rows).direct] == [(0, 1)]
    assert [r.rows for r in _plan(rows, min_run_blocks=11).direct] == [(0,), (1,)]
    assert [r.rows for r in _plan(rows, window=64).direct] == [(0,), (1,)]  # windows: rule 3 alone
    a_row_alone = _plan([rows[0]]).direct[0]
    assert a_row_alone.rows == (0,) and a_row_alone.runs == ((40, 80), (160, 162))
    assert a_row_alone.bias is None                       # rule 3: a decode row alone


def test_rows_read_together_are_read_in_place_below_min_tokens():
    """kv/reads.py rule 1: a rule-5 group is read in place at any length (its shared blocks
    once beat a gather of them per row); a short row sharing nothing stays batched."""
    long = list(range(10, 20))                            # 10 shared blocks, 2 of their own
    rows = [RowSpan(41, 1, long + [40]), RowSpan(41, 1, long + [50]),
            RowSpan(9, 1, [60, 61, 62])]
    plan = _plan(rows, min_tokens=100)
    assert [r.rows for r in plan.direct] == [(0, 1)] and plan.batched == (2,)
    lone = _plan([rows[0], RowSpan(41, 1, list(range(70, 80)) + [50])], min_tokens=100)
    assert lone is None                                   # nothing shared, nothing long
