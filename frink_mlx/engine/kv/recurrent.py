"""Recurrent state in MLX arrays, one slot per row, speaking mlx-lm's `ArraysCache`.

Why: GatedDeltaNet (qwen3_5, qwen3_next), Mamba2 (nemotron_h, granitemoehybrid,
falcon_h1) and short-convolution (lfm2) layers keep a fixed-size state per
row (a conv tail and, for the first two, an SSM / linear-attention matrix)
instead of per-token K/V. The stock model files read and write it through
`ArraysCache`'s protocol:

    conv_state = cache[0]          # None on a fresh row: the model starts from zeros
    cache[0] = new_conv_state      # (B, ...) after this call's tokens
    state = cache[1]; ...; cache[1] = new_state
    cache.advance(S); mask = cache.make_mask(S)   # lengths / left_padding: padding only

so one `RecurrentLayerCache` per recurrent layer per forward, backed by the
engine's `StateStore`, is all it takes (as PagedLayerCache is for attention).

Layout: no pool array. Row states are immutable MLX arrays; slot s holds,
per recurrent layer k and array i, a reference (value, index) to row `index`
of the (B, ...) array the forward that last ran row s set:

    step t   forward over slots [3, 0, 5]   cache[1] = value_t (3, ...)
             slot 3 -> (value_t, 0)   slot 0 -> (value_t, 1)   slot 5 -> (value_t, 2)
    step t+1 forward over slots [3, 0, 5]   cache[1] reads value_t as it is (no copy)
             forward over slots [0, 5]      cache[1] reads concat(value_t[1], value_t[2])

Why not one (num_slots, ...) pool per array scattered in place, as paged.py
does for K/V: a layer reads its rows' states *before* it writes them, so the
gather still holds the pool when the scatter runs, and MLX copies the whole
pool instead of updating it in place (measured: step time grew with the
slot count, 4 MB -> 275 MB of pool, 8 ms -> 282 ms). States are small next
to K/V, and a forward reads and writes each of its rows' states once
anyway, so references cost nothing extra; they also make a copy free
(rule 5) and a snapshot just another reference.

Rules:
1. A forward reads its rows' states when its cache objects are built; when
   every row's state is row i of one array in order, that array is handed
   over as it is, otherwise the rows are concatenated. Each array the model
   sets is recorded for every row of the call (rule "Layout").
2. A row whose forward starts at position 0 starts from zeros, whatever its
   slot held before (or, when every row of the call is fresh, None is handed
   over, so the model makes its own zeros as it does under mlx-lm).
3. The state carries over from chunk to chunk of a prompt and from step to
   step of a decode: each forward reads what the previous one wrote.
4. Padding along time would advance a row's state past its last real token
   (Mamba2's `ssm_attn` drops the prompt's contribution under a right-padded
   mask), so the runner never pads a recurrent model's rows: every call it
   makes has rows of one length (runner.py), and `lengths` / `left_padding`
   stay None.
5. `copy_slots` makes slot dst refer to what slot src refers to (a forked
   n > 1 row takes its parent's state after the prompt); nothing is copied,
   since no state is ever written in place.
6. A freed slot keeps its references until its next owner's first forward
   replaces them; the budget prices every slot full (models/budget.py).
7. Snapshots (the hybrid prefix cache, kv/snapshots.py): `snapshot` copies
   a slot's row out of the arrays it refers to, once its step's forward is
   built (a copy, so that a snapshot holds one row, not the batch it ran
   in; evaluated with the step: `arrays` lists it until `settle`);
   `restore` makes a slot refer to a snapshot's arrays before a forward,
   as `copy_slots` does. Ids are kv/snapshots.py's; freed ones keep their
   arrays until taken again, priced full like slots.
8. A verify step (engine/speculative/ rule 8) `checkpoint`s its rows' slots
   (references, as rule 5) before its forward; the next step may restore a
   slot from it (`restore` with ROLLBACK). Checkpoints last one step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import mlx.core as mx
from mlx_lm.models.cache import ArraysCache

from .snapshots import ROLLBACK
from .specs import StateSpec


@dataclass(frozen=True, slots=True)
class _Ref:
    value: mx.array  # (B, ...) as one forward set it
    index: int       # this slot's row in it


class StateStore:
    """Which state each slot holds now, per recurrent layer and array (module docstring)."""

    def __init__(self, specs: Sequence[StateSpec], num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"num_slots must be >= 1, got {num_slots}")
        self.specs = tuple(specs)
        self.num_slots = num_slots
        self._slots: dict[int, list[list[_Ref | None]]] = {}
        self._snapshots: dict[int, list[list[mx.array]]] = {}  # rule 7
        self._unsettled: list[mx.array] = []
        self._checkpoints: dict[int, list[list[_Ref | None]]] = {}  # rule 8

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.arrays())

    @property
    def snapshot_nbytes(self) -> int:
        return sum(a.nbytes for layers in self._snapshots.values() for row in layers for a in row)

    def arrays(self) -> list[mx.array]:
        """Every state array some slot refers to and the snapshots not yet settled, for
        `mx.eval`/`mx.async_eval`."""
        seen: dict[int, mx.array] = {id(a): a for a in self._unsettled}
        for layers in self._slots.values():
            for refs in layers:
                for ref in refs:
                    if ref is not None:
                        seen.setdefault(id(ref.value), ref.value)
        return list(seen.values())

    def layer_arrays(self, layer: int) -> list[mx.array]:
        """The arrays of one recurrent layer some slot refers to (turns.py's cut points)."""
        seen = {id(r.value): r.value for refs in self._slots.values()
                for r in refs[layer] if r is not None}
        return list(seen.values())

    def release(self) -> None:
        self._slots, self._snapshots, self._unsettled, self._checkpoints = {}, {}, [], {}

    def snapshot(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Rule 7: snapshot id <- slot's row, for each (slot, snapshot id)."""
        for slot, snap_id in pairs:
            layers = self._slots.get(slot)
            if layers is None:
                self._snapshots.pop(snap_id, None)
                continue
            rows = [[self._row_copy(k, i, ref) for i, ref in enumerate(refs)]
                    for k, refs in enumerate(layers)]
            self._snapshots[snap_id] = rows
            self._unsettled += [a for row in rows for a in row]

    def snapshot_rows(self, snap_id: int) -> list[list[mx.array]] | None:
        """Rule 7: a snapshot's arrays, per recurrent layer (the SSD tier writes them)."""
        return self._snapshots.get(snap_id)

    def put_snapshot(self, snap_id: int, rows: list[list[mx.array]]) -> None:
        """Rule 7: snapshot id holds `rows`, read back from the SSD tier (kv/spill.py)."""
        self._snapshots[snap_id] = rows

    def restore(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Rule 7: slot -> snapshot id's arrays, for each (snapshot id, slot)."""
        for snap_id, slot in pairs:
            if snap_id == ROLLBACK:  # rule 8
                layers = self._checkpoints.get(slot)
                if layers is None:
                    raise RuntimeError(f"state slot {slot} has no pre-verify checkpoint")
                self._slots[slot] = layers
                continue
            rows = self._snapshots.get(snap_id)
            if rows is None:
                raise RuntimeError(f"state snapshot {snap_id} was never taken")
            self._slots[slot] = [[_Ref(a, 0) for a in row] for row in rows]

    def checkpoint(self, slots: Sequence[int]) -> None:
        """Rule 8: this step's verify rows; the previous step's checkpoints go."""
        self._checkpoints = {slot: [list(refs) for refs in self._slots[slot]]
                             for slot in slots if slot in self._slots}

    def settle(self) -> None:
        """The step that took the snapshots is dispatched with them (rule 7)."""
        self._unsettled = []

    def _row_copy(self, layer: int, index: int, ref: _Ref | None) -> mx.array:
        if ref is None:
            spec = self.specs[layer]
            return mx.zeros((1, *spec.shapes[index]), spec.dtypes[index])
        if ref.value.shape[0] == 1:
            return ref.value
        return mx.contiguous(ref.value[ref.index:ref.index + 1])

    def copy_slots(self, pairs: Sequence[tuple[int, int]]) -> None:
        """Rule 5: slot dst refers to slot src's state (nothing is copied: no state is
    written in place)."""
        for src, dst in pairs:
            layers = self._slots.get(src)
            if layers is None:
                self._slots.pop(dst, None)
            else:
                self._slots[dst] = [list(refs) for refs in layers]

    def read(self, layer: int, index: int, rows: RowSlots) -> mx.array | None:
        """Array `index` of `layer` for the call's rows (rules 1 and 2)."""
        if rows.all_fresh:
            return None
        spec = self.specs[layer]
        refs = [None if fresh else self._ref(slot, layer, index)
                for slot, fresh in zip(rows.slots, rows.fresh)]
        first = refs[0]
        if first is not None and first.value.shape[0] == len(refs) and all(
                r is not None and r.value is first.value and r.index == i
                for i, r in enumerate(refs)):
            return first.value
        zeros = mx.zeros((1, *spec.shapes[index]), spec.dtypes[index])
        return mx.concatenate([zeros if r is None else r.value[r.index:r.index + 1]
                               for r in refs], axis=0)

    def write(self, layer: int, index: int, rows: RowSlots, value: mx.array) -> None:
        for i, slot in enumerate(rows.slots):
            layers = self._slots.get(slot)
            if layers is None:
                layers = self._slots[slot] = [[None] * len(s.shapes) for s in self.specs]
            layers[layer][index] = _Ref(value, i)

    def _ref(self, slot: int, layer: int, index: int) -> _Ref | None:
        layers = self._slots.get(slot)
        return layers[layer][index] if layers is not None else None


class RowSlots:
    """The rows of one forward call: their slots and which start fresh (rule 2)."""

    def __init__(self, slots: Sequence[int], fresh: Sequence[bool]) -> None:
        self.slots = [int(s) for s in slots]
        self.fresh = [bool(f) for f in fresh]
        self.all_fresh = all(self.fresh)


class RecurrentLayerCache(ArraysCache):
    """`ArraysCache`'s protocol over one recurrent layer of a `StateStore`.

    Built fresh for each forward call (rule 1). Subclassing ArraysCache keeps
    the model files' `isinstance` checks (a pipeline stage's `mx.depends` on
    `cache[-1][0]`) and `make_mask` / `advance` exactly as mlx-lm has them.
    """

    def __init__(self, store: StateStore, layer: int, rows: RowSlots) -> None:
        size = len(store.specs[layer].shapes)
        super().__init__(size)
        self._store, self._layer, self._rows = store, layer, rows
        self.cache = [store.read(layer, i, rows) for i in range(size)]  # type: ignore[misc]

    def __setitem__(self, idx: int, value: Any) -> None:
        self.cache[idx] = value
        self._store.write(self._layer, idx, self._rows, value)

    @property
    def batch_size(self) -> int:
        return len(self._rows.slots)
