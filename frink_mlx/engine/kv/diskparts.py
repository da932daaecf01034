"""What the SSD tier's files of one engine hold, and how pool and state arrays become
their bytes and back.

Why its own module: spill.py decides *which* blocks go out and come back (the
engine's bookkeeping, rules about idle blocks and hits); this module says *what*
a file holds for a model whose layers are not all alike: full-attention layers
beside sliding-window ones (kv/window.py), pools in 8 or 4 bits
(kv/quantized.py), recurrent layers whose prefix cache is a state snapshot
(kv/snapshots.py), layers with their own head dims (Gemma 4).

    block i of a prompt ─┬─ KIND_BLOCK   the full-attention layers' K/V, read from the full
                         │               pool's block (named by the block's chained hash)
                         ├─ KIND_WINDOW  the windowed layers' K/V, from the window pool's
                         │               block (models with sliding windows only)
                         └─ KIND_STATE   the recurrent state after the block (hybrids only,
                                         where a snapshot was bound to the block)

Rules:
1. Namespace: one digest per engine over everything a file's bytes depend
   on: the weights as loaded (models/identity.py), the backend, the block
   size, every pool's per-layer shape and dtype (packed words, scales and
   biases when quantized, with the bits and group sizes), which layers are
   windowed, and each recurrent layer's array shapes and dtypes. Never the
   pool's size, which changes with the memory budget. It is also the
   scheduler's extra key (spill.py rule 1), so it is in every block hash.
2. Keys: a block's KIND_BLOCK file is named by its chained hash; its window
   part and the state after it by keys derived from that hash (xxh3-128 of a
   tag and the hash), so the three never share a name and each is found
   from the block hash alone; the header's kind tells them apart as well.
3. Which files a hit of k blocks (n = k * block_size tokens) needs, the rule
   spill.py reads by: the KIND_BLOCK parts of blocks 0..k-1; with windowed
   layers the KIND_WINDOW parts of the blocks the first new query reads,
   lo(n) .. k-1 (kv/window.py rule 3: the older ones were freed and are never
   read again); with recurrent layers the KIND_STATE file after block k-1
   (kv/snapshots.py rule 3: without a state there, a run of blocks is only
   usable up to the last snapshot in it). What is read is put back into the
   RAM pools and the snapshot index as ordinary cached entries, and the
   manager's own rules (kv/manager.py rules 1, 10, 11) then decide the hit, so
   a partial read is never a wrong hit, only a shorter one.
4. Each part is written from its own pool when that pool's block goes idle
   with its hash (block_pool.py rule 7): a window block goes idle when it
   leaves its row's window, long before the full block does. A state file is
   written once the full block it follows went idle, if a snapshot is bound
   to that block and ready (kv/snapshots.py rule 3).
5. Bytes: pools and states are copied as raw bits (unsigned ints of each
   dtype's width: numpy has no bfloat16). Consecutive layers of one pool list
   with the same shape are one run, gathered and copied as one array.

No file I/O here (disk.py) and no bookkeeping (spill.py): arrays in, bytes out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
import numpy as np
import xxhash

from ...models.identity import weights_digest
from .blockfile import KIND_BLOCK, KIND_STATE, KIND_WINDOW, BlockLayout
from .paged import PagedKVStore
from .specs import StateSpec

_BITS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_MX_BITS = {1: mx.uint8, 2: mx.uint16, 4: mx.uint32, 8: mx.uint64}
Rows = list[list[mx.array]]  # a state snapshot: per recurrent layer, its arrays (1, ...)


def _name(dtype: mx.Dtype) -> str:
    return str(dtype).rpartition(".")[2]


def _dtypes(dtypes: Sequence[mx.Dtype]) -> str:
    return "+".join(sorted({_name(d) for d in dtypes}))[:16]


@dataclass(frozen=True, slots=True)
class _Run:
    """Consecutive layers of one pool list with one shape (rule 5)."""

    pool_list: int
    layers: tuple[int, ...]
    heads: int
    dim: int
    itemsize: int

    def nbytes(self, num_tokens: int) -> int:
        return len(self.layers) * self.heads * num_tokens * self.dim * self.itemsize


class BlockPayloads:
    """Block payloads of one gather, read on the writer thread (spill.py rule 3)."""

    def __init__(self, arrays: list[mx.array], block_size: int) -> None:
        self._arrays, self._bs = arrays, block_size
        self._hosts: list[np.ndarray] | None = None

    def __call__(self, index: int) -> bytes:
        if self._hosts is None:  # waits for the gather, then reads host memory: no MLX op
            self._hosts = [np.asarray(a) for a in self._arrays]
        cols = slice(index * self._bs, (index + 1) * self._bs)
        return b"".join(host[:, :, cols].tobytes() for host in self._hosts)


class StatePayload:
    """One snapshot's payload, read on the writer thread."""

    def __init__(self, arrays: list[mx.array]) -> None:
        self._arrays = arrays

    def __call__(self, index: int) -> bytes:
        return b"".join(np.asarray(a).tobytes() for a in self._arrays)


class PoolPart:
    """The slabs of some layers of every pool list, for blocks of one pool (rule 3)."""

    def __init__(self, namespace: bytes, kind: int, store: PagedKVStore,
                 layers: Sequence[int]) -> None:
        self.kind, self.layers = kind, tuple(layers)
        self.block_size = store.block_size
        self.runs = _runs(store, self.layers)
        per_token = sum(r.nbytes(1) for r in self.runs)
        dtypes = [store.pool_lists()[r.pool_list][r.layers[0]].dtype for r in self.runs]
        groups = getattr(store, "group_sizes", None) or [0]
        self.layout = BlockLayout(
            namespace=namespace, kind=kind,
            dims=(len(self.layers), store.block_size, store.bits or 0, groups[0],
                  len(store.pool_lists()), per_token),
            dtype=_dtypes(dtypes or [store.dtype]), payload_nbytes=per_token * store.block_size)

    def key(self, block_hash: int) -> int:
        return block_hash if self.kind == KIND_BLOCK else derived_key(self.kind, block_hash)

    def gather(self, store: PagedKVStore, block_ids: Sequence[int]) -> BlockPayloads:
        """The blocks' slabs as raw bits, evaluating asynchronously (engine thread)."""
        bs, slots_per_head = self.block_size, store.num_slots + 1
        slots = (np.asarray(block_ids)[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        index: dict[int, mx.array] = {}
        arrays: list[mx.array] = []
        lists = store.pool_lists()
        for run in self.runs:
            if run.heads not in index:
                rows = np.arange(run.heads)[:, None] * slots_per_head + slots[None, :]
                index[run.heads] = mx.array(rows.astype(np.int32))
            pools = lists[run.pool_list]
            taken = [mx.take(pools[j].reshape(-1, run.dim), index[run.heads], axis=0)
                     for j in run.layers]
            arrays.append(mx.view(mx.stack(taken), _MX_BITS[run.itemsize]))  # (L, H, n*bs, D)
        if arrays:  # a part with no layers (every layer windowed) is its header alone
            mx.async_eval(*arrays)
        return BlockPayloads(arrays, bs)

    def unpack(self, payloads: Sequence[memoryview]) -> list[np.ndarray]:
        """Checked payloads as one (L, H, n * bs, D) array of raw bits per run (reader thread)."""
        bs, n = self.block_size, len(payloads)
        out = [np.empty((len(r.layers), r.heads, n * bs, r.dim), _BITS[r.itemsize])
               for r in self.runs]
        for j, payload in enumerate(payloads):
            offset = 0
            for run, host in zip(self.runs, out):
                size = run.nbytes(bs)
                flat = np.frombuffer(payload[offset:offset + size], _BITS[run.itemsize])
                host[:, :, j * bs:(j + 1) * bs] = flat.reshape(len(run.layers), run.heads, bs, -1)
                offset += size
        return out

    def scatter(self, store: PagedKVStore, block_ids: Sequence[int], cols: Sequence[int],
                arrays: Sequence[np.ndarray]) -> None:
        """Copy read blocks `cols` (of `unpack`'s arrays) into `block_ids` (engine thread)."""
        bs = self.block_size
        slots = (np.asarray(block_ids)[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        index = mx.array(slots.astype(np.int32))
        picks = (np.asarray(cols)[:, None] * bs + np.arange(bs)[None, :]).reshape(-1)
        lists = store.pool_lists()
        for run, host in zip(self.runs, arrays):
            part = host if len(picks) == host.shape[2] else host[:, :, picks]
            pools = lists[run.pool_list]
            for i, layer in enumerate(run.layers):
                pools[layer][:, index] = mx.view(mx.array(part[i]), pools[layer].dtype)
        mx.eval(store.arrays())


class StatePart:
    """A recurrent-state snapshot as one file (rules 2 and 5)."""

    def __init__(self, namespace: bytes, specs: Sequence[StateSpec], block_size: int) -> None:
        self.specs = tuple(specs)
        nbytes = sum(s.nbytes for s in self.specs)
        self.layout = BlockLayout(
            namespace=namespace, kind=KIND_STATE,
            dims=(len(self.specs), sum(len(s.shapes) for s in self.specs), block_size, 0, 0,
                  nbytes),
            dtype=_dtypes([d for s in self.specs for d in s.dtypes]), payload_nbytes=nbytes)

    @staticmethod
    def key(block_hash: int) -> int:
        return derived_key(KIND_STATE, block_hash)

    def pack(self, rows: Rows) -> StatePayload:
        """A snapshot's arrays as raw bits, evaluating asynchronously (engine thread)."""
        arrays = [mx.view(mx.contiguous(a), _MX_BITS[a.dtype.size]) for row in rows for a in row]
        mx.async_eval(*arrays)
        return StatePayload(arrays)

    def unpack(self, payload: memoryview) -> Rows:
        """A checked payload back as a snapshot's arrays, evaluated (engine thread)."""
        rows: Rows = []
        offset = 0
        for spec in self.specs:
            row: list[mx.array] = []
            for shape, dtype in zip(spec.shapes, spec.dtypes):
                size = int(np.prod(shape, dtype=np.int64)) * dtype.size
                bits = np.frombuffer(payload[offset:offset + size], _BITS[dtype.size])
                row.append(mx.view(mx.array(bits.reshape((1, *shape))), dtype))
                offset += size
            rows.append(row)
        mx.eval([a for row in rows for a in row])
        return rows


@dataclass(frozen=True, slots=True)
class DiskParts:
    """One engine's kinds of file (module docstring)."""

    namespace: bytes
    full: PoolPart
    window: PoolPart | None = None
    state: StatePart | None = None


def disk_parts(model: object, store: PagedKVStore, backend_name: str, *,
               windowed: Sequence[int] = (), states: Sequence[StateSpec] = ()) -> DiskParts:
    """Rule 1's namespace and the parts of `store`'s blocks (`windowed`: the layers that
    read window tables; `states`: the recurrent layers, when snapshots are kept)."""
    shapes = [[(int(a.shape[0]), int(a.shape[-1]), _name(a.dtype)) for a in pools]
              for pools in store.pool_lists()]
    identity = (f"frink-kv-disk-2|weights={weights_digest(model)}|backend={backend_name}|"
                f"block_size={store.block_size}|dtype={_name(store.dtype)}|bits={store.bits}|"
                f"groups={getattr(store, 'group_sizes', None)}|pools={shapes}|"
                f"windowed={sorted(windowed)}|states="
                f"{[(s.shapes, [_name(d) for d in s.dtypes]) for s in states]}")
    namespace = hashlib.blake2b(identity.encode(), digest_size=16).digest()
    full = [j for j in range(store.num_layers) if j not in set(windowed)]
    return DiskParts(
        namespace=namespace, full=PoolPart(namespace, KIND_BLOCK, store, full),
        window=PoolPart(namespace, KIND_WINDOW, store, windowed) if windowed else None,
        state=StatePart(namespace, states, store.block_size) if states else None)


def derived_key(kind: int, block_hash: int) -> int:
    """Rule 2: the name of the `kind` file that goes with block `block_hash`."""
    digest = xxhash.xxh3_128_digest(kind.to_bytes(2, "little") + block_hash.to_bytes(16, "little"))
    return int.from_bytes(digest, "little")


def _runs(store: PagedKVStore, layers: Sequence[int]) -> list[_Run]:
    """Rule 5: each pool list's `layers` in runs of one shape, lists in order."""
    runs: list[_Run] = []
    for li, pools in enumerate(store.pool_lists()):
        for j in layers:
            heads, dim, size = int(pools[j].shape[0]), int(pools[j].shape[-1]), pools[j].dtype.size
            last = runs[-1] if runs else None
            if last is not None and last.pool_list == li and (last.heads, last.dim, last.itemsize) \
                    == (heads, dim, size) and last.layers[-1] < j and pools[last.layers[-1]].dtype \
                    == pools[j].dtype:
                runs[-1] = _Run(li, last.layers + (j,), heads, dim, size)
            else:
                runs.append(_Run(li, (j,), heads, dim, size))
    return runs
