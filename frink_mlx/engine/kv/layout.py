"""One forward call's index arrays over the paged pool: where its tokens' K/V go, where
each row's positions lie, its RoPE offsets, masks and read plans.

Why a module of its own: the pool (paged.py's `PagedKVStore`) lives as long as the
engine, while a layout is made once per forward from the step's block tables and
dropped after it; every layer's cache (paged.py's `PagedLayerCache`) reads the same
layout. What it builds is what paged.py's rules say: write slots (paged.py rule 1),
read slots (paged.py rule 2), RoPE offsets and M-RoPE ids (paged.py rule 3), masks
(paged.py rule 4) and read plans (paged.py rule 7, made by reads.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
import numpy as np

from .reads import ReadPlan, ReadShape, plan_reads


@dataclass(frozen=True, slots=True)
class RowSpan:
    """One row of a forward call: `num_new` tokens starting at `start`."""

    start: int
    num_new: int
    block_table: Sequence[int]


class BatchLayout:
    """The index arrays of one forward call over `rows`, padded to length L.

    write_slots (B*L,): where each input token's K/V goes (trash for padding)
    read_slots  (B, T): slots of positions 0..T-1 per row (trash beyond the row), made
                        when a gather first asks (paged.py rule 7: rows read in place
                        need none)
    offsets     (B,):   RoPE start position of each row
    """

    def __init__(self, rows: Sequence[RowSpan], *, block_size: int, trash_slot: int) -> None:
        if not rows:
            raise ValueError("a forward call needs at least one row")
        self.batch = len(rows)
        self.length = max(r.num_new for r in rows)
        starts = np.array([r.start for r in rows], dtype=np.int64)
        num_new = np.array([r.num_new for r in rows], dtype=np.int64)
        ends = starts + num_new
        self.width = int(ends.max())
        self._starts, self._num_new = starts, num_new
        self._rows, self._block_size, self._trash = rows, block_size, trash_slot
        self._tables = _block_matrix(rows, block_size, self.width)
        cols = np.arange(self.length)[None, :]
        pos = np.minimum(starts[:, None] + cols, self.width - 1)
        blocks = np.take_along_axis(self._tables, pos // block_size, 1)
        slots = np.where(blocks < 0, trash_slot, blocks * block_size + pos % block_size)
        write = np.where(cols < num_new[:, None], slots, trash_slot)
        self.write_slots = mx.array(write.reshape(-1).astype(np.int32))
        self._slot_of: np.ndarray | None = None   # (B, width): only a gather needs them
        self._read_slots: mx.array | None = None
        self.offsets = mx.array(starts.astype(np.int32))
        self._memo: dict[Any, Any] = {}  # per forward: masks, biases, row indices
        self.rope_positions: mx.array | None = None  # paged.py rule 3: M-RoPE ids (3, B, L)

    @property
    def slot_of(self) -> np.ndarray:
        """(B, width) flat slots of positions 0..width-1 per row; trash past a row's end.
        Made when first asked: a step whose rows are all read in place never needs them."""
        if self._slot_of is None:
            self._slot_of = _slot_matrix(self._rows, self._tables, self._block_size,
                                         self._trash, self.width)
        return self._slot_of

    @property
    def read_slots(self) -> mx.array:
        """paged.py rule 2's (B, T) gather indices (`slot_of` as an MLX array)."""
        if self._read_slots is None:
            self._read_slots = mx.array(self.slot_of.astype(np.int32))
        return self._read_slots

    def read_rows(self, heads: int, slots_per_head: int) -> mx.array:
        """(H, B, T) rows of a pool viewed as (H * slots_per_head, D): paged.py rule 2's
        gather as a plain row gather, built once per forward and shared by
        every layer."""
        key = ("rows", heads, slots_per_head)
        rows = self._memo.get(key)
        if rows is None:  # lazy: computed only if a gather runs (paged.py rule 7)
            base = mx.arange(heads, dtype=mx.int32)[:, None, None] * slots_per_head
            rows = self._memo[key] = base + self.read_slots[None]
        return rows

    def window_of(self, mask: object) -> tuple[bool, int | None]:
        """(True, window) if `mask` is what `mask(window)` made for this layout (paged.py rule 7)."""
        for key, value in self._memo.items():
            if (key is None or isinstance(key, int)) and value is mask:
                return True, key
        return False, None

    def read_plan(self, window: int | None, shape: ReadShape, *, min_tokens: int,
                  max_runs: int, min_run_blocks: int, masked: float) -> ReadPlan | None:
        """paged.py rule 7's plan (reads.py), made once per forward and window."""
        key = ("plan", window, shape, min_tokens, max_runs, min_run_blocks, masked)
        if key not in self._memo:
            tables = [np.asarray(r.block_table, dtype=np.int64) for r in self._rows]
            windowed = any(t.size and t.min() < 0 for t in tables)  # freed blocks: gather
            self._memo[key] = None if windowed else plan_reads(
                self._starts, self._num_new, tables, lambda: self.slot_of, shape, window=window,
                min_tokens=min_tokens, max_runs=max_runs, min_run_blocks=min_run_blocks,
                masked=masked)
        plan: ReadPlan | None = self._memo[key]
        return plan

    def mask(self, window_size: int | None = None) -> mx.array | str | None:
        """The attention mask (paged.py rule 4), built once per window size."""
        if window_size in self._memo:
            return self._memo[window_size]
        value: mx.array | str | None
        single = self.batch == 1 and window_size is None
        if single and self.length == 1:
            value = None
        elif single and int(self._starts[0]) == 0:
            value = "causal"
        else:
            value = mx.array(self._mask_np(window_size))
        self._memo[window_size] = value
        return value

    def _mask_np(self, window_size: int | None) -> np.ndarray:
        cols = np.arange(self.length)[None, :]
        q_pos = self._starts[:, None] + cols                     # (B, L)
        k_pos = np.arange(self.width)[None, None, :]              # (1, 1, T)
        allowed = k_pos <= q_pos[:, :, None]
        if window_size is not None:
            allowed &= k_pos > (q_pos[:, :, None] - window_size)
        real_q = (cols < self._num_new[:, None])[:, :, None]
        allowed = np.where(real_q, allowed, k_pos == 0)
        return allowed[:, None, :, :]


def _block_matrix(rows: Sequence[RowSpan], block_size: int, width: int) -> np.ndarray:
    """(B, blocks) block ids of each row's positions, 0 past its table's needed part."""
    num_blocks_wide = (width + block_size - 1) // block_size
    tables = np.zeros((len(rows), num_blocks_wide), dtype=np.int64)
    for r, row in enumerate(rows):
        needed = (row.start + row.num_new + block_size - 1) // block_size
        if len(row.block_table) < needed:
            raise ValueError(
                f"row {r}: block table holds {len(row.block_table)} blocks, needs {needed}"
            )
        tables[r, :needed] = row.block_table[:needed]
    return tables


def _slot_matrix(rows: Sequence[RowSpan], tables: np.ndarray, block_size: int, trash_slot: int,
                 width: int) -> np.ndarray:
    """(B, width) flat slots of positions 0..width-1 per row; trash past a row's end."""
    pos = np.arange(width)
    blocks = tables[:, pos // block_size]  # -1: a block freed outside its window (window.py)
    slots = np.where(blocks < 0, trash_slot, blocks * block_size + (pos % block_size)[None, :])
    ends = np.array([row.start + row.num_new for row in rows])[:, None]
    return np.where(pos[None, :] < ends, slots, trash_slot)
