"""Recurrent-state slots: which row owns which slot of the state pools, in plain ints.

Why: a recurrent layer (GatedDeltaNet, Mamba2, short convolution; kv/specs.py)
keeps one fixed-size state per row, however long the row is, so its memory
is not carved into blocks but into `num_slots` slots, one per running row
(kv/recurrent.py holds the arrays, indexed by slot). Like the block pool,
this accounting is pure Python so the scheduler plans with integers.

Rules:
1. A slot belongs to at most one holder; `take` hands out the lowest free
   slot (so tests can assert exact ids), `give` returns it.
2. Running out is a value: `take` returns None and changes nothing.
3. Giving back a slot that is not held raises `EngineFailure` (an engine bug).
"""

from __future__ import annotations

import heapq

from ...errors import EngineFailure


class SlotPool:
    """`num_slots` state slots, each free or held."""

    def __init__(self, num_slots: int) -> None:
        if num_slots <= 0:
            raise EngineFailure(f"num_slots must be positive, got {num_slots}", param="num_slots")
        self.num_slots = num_slots
        self._free = list(range(num_slots))  # a heap: lowest id first (rule 1)
        self._held: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._held)

    def take(self) -> int | None:
        """The lowest free slot, now held; None when every slot is held (rule 2)."""
        if not self._free:
            return None
        slot = heapq.heappop(self._free)
        self._held.add(slot)
        return slot

    def give(self, slot: int) -> None:
        if slot not in self._held:
            raise EngineFailure(f"state slot {slot} given back but not held")
        self._held.remove(slot)
        heapq.heappush(self._free, slot)
