"""Reading a row's K/V where it lies in the pool: runs of adjacent blocks as slices.

Why: paged.py rule 2's read gathers every row's whole context out of the pool
on every step, for every layer, so a decode step's cost grows with the
context twice: once for the gather (a copy of the whole context, through
MLX's CPU gather at a few GB/s) and once for attention itself. A row's blocks
mostly sit next to each other in the pool (the block pool hands out ids in
order from a fresh pool, and a sequence's blocks are freed, hence re-used, as
one run: block_pool.py rules 2-3), and a run of adjacent blocks is one
contiguous range of slots in every head of the head-major pool, so a plain
slice `pool[:, a:b]` is a view of it: no copy at all.

This module plans such a read once per forward (host-side integers, shared by
every layer); paged.py rule 7 hands it to an attention kernel that can score
a row over several key segments (the CPU backend's: backend/cpu/kernels.py).
The stock path, and Metal, never ask for it and keep rule 2's gather.

Rules:
1. Only rows with at least `min_tokens` positions, and rows rule 5 reads
   together (at any length: the shared blocks streamed once beat a gather of
   them per row), are read directly; the others are gathered together as one
   batch, as rule 2 does, but only as wide as the longest of *them* (not
   padded to the long rows' width). No row read directly: no plan (None), and
   the caller keeps rule 2's read untouched.
2. Attention does not care in which order it sees a row's keys, so a row's
   blocks are sorted by id and cut into runs of consecutive ids; a run of k
   blocks starting at block b is the slice of slots [b*bs, (b+k)*bs). The
   `max_runs` longest runs of at least `min_run_blocks` blocks are read as
   slices; the rest of the row's blocks (a fragmented pool) are gathered into
   one more segment, so the cost of a scattered row is bounded by rule 2's.
3. Each segment's columns carry the positions of their slots. The mask is
   paged.py rule 4's over those positions: query i of the row (position
   start + i) sees key position p iff p <= start + i (and, with a sliding
   window w, p > start + i - w); slots of the last, partly filled block past
   the row's end are never visible; padding queries (a row shorter than the
   call's L) see only position 0. A block no query of the row can see (outside
   every query's window) is not read at all. The mask is additive, `masked` where hidden (the kernel's
   convention), shaped (1, 1, 1, L, n) to broadcast over KV heads and query
   groups, and None when every column is visible. A plain decode row (one
   row, one query, no window: every slot before its end is visible) needs
   none: the slots past its end are cut out of the run that holds its last
   block (splitting it in two when that block is not the run's last) or out
   of its gathered rest, so the plan builds no per-column arrays and the
   kernel adds no bias (`_decode_read`). For one row at 32k tokens, the
   layout and its plan took 1.26 ms of host time a step before (measured
   alone), 0.18 ms after; and every layer's scores lost a bias pass.
4. Nothing here keeps a pool array: the plan holds slot ranges and index
   arrays; each layer's views are made from the store when asked
   (paged.py rule 1).
5. Rows that share their leading blocks (n > 1 forks, agents' requests over
   one cached prompt) are read as one: without a sliding window, rows whose
   tables begin with the same block ids share the common prefix's blocks
   that lie wholly before every one of their first queries (each query sees
   all of them), and when those are at least `min_run_blocks` blocks and at
   least as many as the rows' other blocks together, the rows become one
   read (`RowRead.rows`): the shared blocks once, then each row's own, runs
   cut as in rule 2 over them all; the mask is rule 3's per row, over the
   call's queries stacked row after row, and hides every row's own columns
   from the other rows' queries. So the kernel streams the shared keys once
   for all of them instead of once per row (a decode step at a long context
   is bound by that stream); the price, the rows' own columns scored for
   every row's queries, is bounded by the second condition. The masked
   columns weigh exactly 0, so each row's attention is the one it has alone,
   but for the order in which its products add up.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import mlx.core as mx
import numpy as np


@dataclass(frozen=True, slots=True)
class RowRead:
    """Where one row's keys lie (rules 2-3), or several rows' that share blocks (rule 5)."""

    rows: tuple[int, ...]
    runs: tuple[tuple[int, int], ...]  # [start, stop) slot ranges, read as slices
    rest: mx.array | None              # (H, 1, n) pool rows of the remaining blocks (rule 2)
    bias: mx.array | None              # (1, 1, 1, R * L, n) additive, None: all visible


@dataclass(frozen=True, slots=True)
class ReadPlan:
    """One forward's reads: rows read where they lie, and the rest gathered (rule 1)."""

    direct: tuple[RowRead, ...]
    batched: tuple[int, ...]           # the other rows, in batch order
    batched_rows: mx.array | None      # (H, Bs, Ts) pool rows of the batched rows
    batched_bias: mx.array | None      # (Bs, 1, 1, L, Ts) additive


@dataclass(frozen=True, slots=True)
class ReadShape:
    """What a plan needs to know of the store and the call."""

    block_size: int
    heads: int
    slots_per_head: int   # the pool's slots per head, trash slot included
    length: int           # the call's L (queries per row, padded)


def plan_reads(starts: np.ndarray, num_new: np.ndarray, tables: list[np.ndarray],
               slot_of: Callable[[], np.ndarray], shape: ReadShape, *, window: int | None,
               min_tokens: int, max_runs: int, min_run_blocks: int, masked: float
               ) -> ReadPlan | None:
    """The plan of module rules 1-3; `slot_of` gives the layout's (B, width) slot matrix
    (asked only when some rows are gathered)."""
    ends = starts + num_new
    every = list(range(len(starts)))
    groups = [((r,), 0) for r in every] if window is not None else \
        _share_groups(every, starts, ends, tables, shape.block_size, min_run_blocks)
    groups = [(rows, shared) for rows, shared in groups            # rule 1, and rule 5's
              if len(rows) > 1 or ends[rows[0]] >= min_tokens]     # groups at any length
    if not groups:
        return None
    direct = tuple(
        _row_read(rows, shared, starts, num_new, tables, shape, window=window,
                  max_runs=max_runs, min_run_blocks=min_run_blocks, masked=masked)
        for rows, shared in groups)
    read = {r for rows, _ in groups for r in rows}
    batched = tuple(r for r in every if r not in read)
    if not batched:
        return ReadPlan(direct, (), None, None)
    sub = np.array(batched)
    width = int(ends[sub].max())
    allowed = _allowed(starts[sub], num_new[sub], np.arange(width)[None, :], shape.length, window)
    bias = np.where(allowed, 0.0, masked).astype(np.float32)[:, None, None]
    return ReadPlan(direct, batched, _pool_rows(slot_of()[sub, :width], shape), mx.array(bias))


def _pool_rows(slots: np.ndarray, shape: ReadShape) -> mx.array:
    """(H, *slots.shape) rows of the pool's (H * slots_per_head, D) view (paged.py rule 2)."""
    base = np.arange(shape.heads, dtype=np.int64).reshape(-1, *([1] * slots.ndim))
    return mx.array((base * shape.slots_per_head + slots[None]).astype(np.int32))


def _share_groups(rows: list[int], starts: np.ndarray, ends: np.ndarray,
                  tables: list[np.ndarray], block_size: int, min_blocks: int
                  ) -> list[tuple[tuple[int, ...], int]]:
    """Rule 5: the rows as (rows, shared leading blocks) groups, in order of their first row;
    a row that shares nothing worth it is a group of one sharing 0."""
    by_first: dict[int, list[int]] = {}
    for r in rows:
        key = int(tables[r][0]) if starts[r] >= block_size * min_blocks else -1 - r
        by_first.setdefault(key, []).append(r)
    groups: list[tuple[tuple[int, ...], int]] = []
    for members in by_first.values():
        shared = _shared_blocks(members, starts, tables, block_size) if len(members) > 1 else 0
        own = sum(-(-int(ends[r]) // block_size) - shared for r in members)
        if shared >= min_blocks and shared >= own:
            groups.append((tuple(members), shared))
        else:
            groups.extend(((r,), 0) for r in members)
    return sorted(groups, key=lambda g: g[0][0])


def _shared_blocks(members: list[int], starts: np.ndarray, tables: list[np.ndarray],
                   block_size: int) -> int:
    """How many leading blocks the members' tables have in common, wholly before every
    member's first query (rule 5)."""
    cap = min(int(starts[r]) // block_size for r in members)
    heads = np.stack([tables[r][:cap] for r in members])
    same = (heads == heads[0]).all(axis=0)
    return cap if same.all() else int(np.argmin(same))


def _row_read(rows: tuple[int, ...], shared: int, starts: np.ndarray, num_new: np.ndarray,
              tables: list[np.ndarray], shape: ReadShape, *, window: int | None,
              max_runs: int, min_run_blocks: int, masked: float) -> RowRead:
    block_size, length = shape.block_size, shape.length
    if len(rows) == 1 and window is None and length == 1 and num_new[rows[0]] == 1:
        return _decode_read(rows[0], int(starts[rows[0]]) + 1, tables[rows[0]], shape,
                            max_runs=max_runs, min_run_blocks=min_run_blocks)
    parts, owners_of, poses = [], [], []
    for i, r in enumerate(rows):   # rule 5: the shared blocks once (owner -1), then each row's
        end = int(starts[r] + num_new[r])
        lo = shared if i else 0
        parts.append(tables[r][lo:-(-end // block_size)])
        poses.append(np.arange(lo, lo + len(parts[-1])) * block_size)  # each block's slot 0
        owners_of.append(np.where(np.arange(lo, lo + len(parts[-1])) < shared, -1, i))
    blocks, first_pos, owner = (np.concatenate(x) for x in (parts, poses, owners_of))
    if window is not None:  # rule 3 (one row): blocks no real query can see are not read
        start, new = int(starts[rows[0]]), int(num_new[rows[0]])
        lowest = start - window + 1                            # the first query's first key
        seen = first_pos + block_size > lowest
        seen[0] |= length > new                                # padding queries see position 0
        blocks, first_pos, owner = blocks[seen], first_pos[seen], owner[seen]
    order = np.argsort(blocks, kind="stable")
    blocks, first_pos, owner = blocks[order], first_pos[order], owner[order]
    sliced, picked = _spans(blocks, max_runs, min_run_blocks)
    runs = tuple((int(blocks[a]) * block_size, int(blocks[b - 1] + 1) * block_size)
                 for a, b in sliced)
    offsets = np.arange(block_size)
    columns: list[slice | np.ndarray] = [slice(a, b) for a, b in sliced]
    rest = None
    if not picked.all():
        columns.append(~picked)
        rest = _pool_rows((blocks[~picked, None] * block_size + offsets).reshape(1, -1), shape)
    k_pos = np.concatenate([(first_pos[c, None] + offsets).reshape(-1) for c in columns])
    k_owner = np.concatenate([np.repeat(owner[c], block_size) for c in columns])
    allowed = np.concatenate([
        _allowed(starts[r:r + 1], num_new[r:r + 1], k_pos[None, :], length, window)
        & ((k_owner == -1) | (k_owner == i))[None, None, :]
        for i, r in enumerate(rows)], axis=1)                 # (1, R * L, n)
    bias = None
    if not allowed.all():
        bias = mx.array(np.where(allowed, 0.0, masked).astype(np.float32)[:, None, None])
    return RowRead(rows, runs, rest, bias)


def _spans(blocks: np.ndarray, max_runs: int, min_run_blocks: int
           ) -> tuple[list[tuple[int, int]], np.ndarray]:
    """Rule 2 over sorted block ids: the [a, b) index spans read as slices, and which
    blocks they cover (the others are the gathered rest)."""
    cuts = np.flatnonzero(np.diff(blocks) != 1) + 1
    bounds = np.concatenate([[0], cuts, [len(blocks)]])
    spans = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
    spans.sort(key=lambda ab: ab[0] - ab[1])                   # longest first
    sliced = sorted(ab for ab in spans[:max_runs] if ab[1] - ab[0] >= min_run_blocks)
    picked = np.zeros(len(blocks), dtype=bool)
    for a, b in sliced:
        picked[a:b] = True
    return sliced, picked


def _decode_read(row: int, end: int, table: np.ndarray, shape: ReadShape, *, max_runs: int,
                 min_run_blocks: int) -> RowRead:
    """Rule 3's plain decode row: its runs and rest without the slots past `end`, no mask."""
    block_size = shape.block_size
    blocks = np.sort(table[:-(-end // block_size)])
    sliced, picked = _spans(blocks, max_runs, min_run_blocks)
    last = int(table[(end - 1) // block_size])
    hide = (last * block_size + (end - 1) % block_size + 1,
            (last + 1) * block_size)                           # empty when the block is full
    runs: list[tuple[int, int]] = []
    for a, b in sliced:
        lo, hi = int(blocks[a]) * block_size, int(blocks[b - 1] + 1) * block_size
        if hide[0] < hide[1] and lo <= hide[0] < hi:
            runs.extend(r for r in ((lo, hide[0]), (hide[1], hi)) if r[0] < r[1])
        else:
            runs.append((lo, hi))
    rest = None
    if not picked.all():
        slots = (blocks[~picked, None] * block_size + np.arange(block_size)).reshape(-1)
        slots = slots[(slots < hide[0]) | (slots >= hide[1])]
        rest = _pool_rows(slots.reshape(1, -1), shape)
    return RowRead((row,), tuple(runs), rest, None)


def _allowed(starts: np.ndarray, num_new: np.ndarray, k_pos: np.ndarray, length: int,
             window: int | None) -> np.ndarray:
    """(B, L, n) visibility of key positions `k_pos` ((B or 1, n)) to each row's queries (rule 3)."""
    cols = np.arange(length)[None, :]
    q_pos = (starts[:, None] + cols)[:, :, None]                # (B, L, 1)
    k = k_pos[:, None, :]                                       # (B or 1, 1, n)
    allowed = k <= q_pos
    if window is not None:
        allowed &= k > q_pos - window
    real_q = (cols < num_new[:, None])[:, :, None]
    return np.where(real_q, allowed, k == 0)


@dataclass(frozen=True, slots=True)
class SegmentedRow:
    """One row's keys and values in one layer, as segments (views where they lie); or the
    rows of one rule-5 read, their queries stacked row after row."""

    rows: tuple[int, ...]
    keys: list[mx.array]     # each (1, H, n_i, D)
    values: list[mx.array]
    bias: mx.array | None    # (1, 1, 1, R * L, sum n_i) additive


@dataclass(frozen=True, slots=True)
class LayerRead:
    """One layer's K/V for a kernel that scores rows over segments (paged.py rule 7)."""

    direct: list[SegmentedRow]
    batched: tuple[int, ...]
    batched_keys: mx.array | None    # (Bs, H, Ts, D)
    batched_values: mx.array | None
    batched_bias: mx.array | None    # (Bs, 1, 1, L, Ts)


def layer_read(plan: ReadPlan, keys: mx.array, values: mx.array) -> LayerRead:
    """`plan` over one layer's (H, S, D) pools: slices for runs, gathers for the rest (rule 4:
    the views are made now, from the pools the store holds after this layer's writes)."""
    direct = []
    for read in plan.direct:
        ks = [keys[None, :, a:b] for a, b in read.runs]
        vs = [values[None, :, a:b] for a, b in read.runs]
        if read.rest is not None:
            ks.append(take_rows(keys, read.rest).transpose(1, 0, 2, 3))
            vs.append(take_rows(values, read.rest).transpose(1, 0, 2, 3))
        direct.append(SegmentedRow(read.rows, ks, vs, read.bias))
    bk = bv = None
    if plan.batched_rows is not None:
        bk = take_rows(keys, plan.batched_rows).transpose(1, 0, 2, 3)
        bv = take_rows(values, plan.batched_rows).transpose(1, 0, 2, 3)
    return LayerRead(direct, plan.batched, bk, bv, plan.batched_bias)


def take_rows(pool: mx.array, rows: mx.array) -> mx.array:
    """pool[:, slots] for (H, S, D) `pool`, as a row gather on its (H*S, D) view (paged.py rule 2)."""
    heads, slots, dim = pool.shape
    return mx.take(pool.reshape(heads * slots, dim), rows, axis=0)
