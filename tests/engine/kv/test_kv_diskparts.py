"""What a file of the SSD tier holds (kv/diskparts.py), without an engine: a block's
parts round-trip bit for bit through their bytes into other blocks of another store, for
float and quantized pools and layers of different shapes; the namespace moves with
everything the bytes depend on (rule 1) and never with the pool's size; a state
snapshot round-trips, bfloat16 included (rule 5)."""

from __future__ import annotations

import types

import mlx.core as mx
import numpy as np
import pytest

from frink_mlx.engine.kv.blockfile import KIND_BLOCK, KIND_STATE, KIND_WINDOW, decode, encode_header
from frink_mlx.engine.kv.diskparts import derived_key, disk_parts
from frink_mlx.engine.kv.paged import PagedKVStore
from frink_mlx.engine.kv.quantized import QuantizedKVStore
from frink_mlx.engine.kv.specs import StateSpec

GEOMETRIES = [(2, 64, 64), (1, 32, 32), (2, 64, 64)]  # layer 1 is windowed, its own dims
STATES = [StateSpec(((3, 8), (2, 4, 4)), (mx.bfloat16, mx.float32))]


class _Model:
    def __init__(self, seed: int) -> None:
        self.args = types.SimpleNamespace(seed=seed)

    def parameters(self) -> dict[str, mx.array]:
        return {"w": mx.arange(8, dtype=mx.float32) + self.args.seed}


def store(bits: int | None, num_blocks: int = 8, seed: int = 0) -> PagedKVStore:
    shape = dict(num_layers=3, num_blocks=num_blocks, block_size=4, n_kv_heads=0, head_dim=0,
                 dtype=mx.float16, geometries=GEOMETRIES)
    made = PagedKVStore(**shape) if bits is None else QuantizedKVStore(bits=bits, **shape)
    rng = np.random.default_rng(seed)
    for pools in made.pool_lists():
        for i, pool in enumerate(pools):
            if pool.dtype == mx.uint32:
                pools[i] = mx.array(rng.integers(0, 2**32, pool.shape, dtype=np.uint32))
            else:
                pools[i] = mx.array(rng.standard_normal(pool.shape).astype(np.float16))
    mx.eval(made.arrays())
    return made


def slots(block_id: int) -> np.ndarray:
    return np.arange(block_id * 4, block_id * 4 + 4)


@pytest.mark.parametrize("bits", [None, 8, 4])
def test_block_parts_round_trip_into_other_blocks_of_another_store(bits):
    src, dst = store(bits), store(bits, num_blocks=16, seed=1)
    parts = disk_parts(_Model(0), src, "cpu", windowed=[1])
    assert parts.window is not None and parts.full.layers == (0, 2) and parts.window.layers == (1,)
    for part in (parts.full, parts.window):
        payloads = part.gather(src, [5, 2])
        files = [encode_header(part.layout, 77 + i, payloads(i)) + payloads(i) for i in range(2)]
        read = part.unpack([decode(part.layout, 77 + i, f) for i, f in enumerate(files)])
        part.scatter(dst, [9, 3], [1, 0], read)  # block 2 -> 3, block 5 -> 9
        for pools_src, pools_dst in zip(src.pool_lists(), dst.pool_lists()):
            for layer in part.layers:
                a, b = np.asarray(pools_src[layer]), np.asarray(pools_dst[layer])
                assert np.array_equal(a[:, slots(5)], b[:, slots(9)])
                assert np.array_equal(a[:, slots(2)], b[:, slots(3)])
    assert parts.full.layout.kind == KIND_BLOCK and parts.window.layout.kind == KIND_WINDOW
    assert parts.full.layout.dims[2] == (bits or 0)


def test_the_namespace_follows_what_the_bytes_depend_on_not_the_pool_size():
    def namespace(bits=None, num_blocks=8, seed=0, windowed=(1,), states=()):
        made = store(bits, num_blocks)
        return disk_parts(_Model(seed), made, "cpu", windowed=windowed, states=states).namespace

    base = namespace()
    assert namespace(num_blocks=16) == base
    others = [namespace(bits=8), namespace(bits=4), namespace(seed=1), namespace(windowed=()),
              namespace(states=STATES)]
    assert len({base, *others}) == 6


def test_a_state_snapshot_round_trips_bfloat16_included():
    parts = disk_parts(_Model(0), store(None), "cpu", states=STATES)
    state = parts.state
    assert state is not None and state.layout.kind == KIND_STATE
    rows = [[(mx.arange(24, dtype=mx.float32).reshape(1, 3, 8) / 7).astype(mx.bfloat16),
             mx.arange(32, dtype=mx.float32).reshape(1, 2, 4, 4) - 3.5]]
    payload = state.pack(rows)(0)
    assert len(payload) == state.layout.payload_nbytes == 3 * 8 * 2 + 32 * 4
    back = state.unpack(decode(state.layout, 5, encode_header(state.layout, 5, payload) + payload))
    for want, got in zip(rows[0], back[0]):
        assert got.dtype == want.dtype and mx.array_equal(got, want).item()
    assert state.key(5) == derived_key(KIND_STATE, 5) != parts.full.key(5) == 5
