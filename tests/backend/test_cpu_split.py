"""cpu_split.py: matmuls cut by output rows over several MLX CPU streams."""

from __future__ import annotations

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx.utils import tree_flatten

from frink_mlx.backend.cpu import split as cpu_split

POOL = cpu_split.SideStreams()  # rule 5: one pool, as one CPU backend holds


def _model() -> nn.Module:
    model = nn.Module()
    model.up = nn.Linear(64, 192, bias=False)
    model.down = nn.Linear(192, 64)
    model.small = nn.Linear(64, 40)
    model.embed = nn.Embedding(320, 64)
    model.norm = nn.RMSNorm(64)
    mx.eval(model.parameters())
    return model


def _outputs(model: nn.Module, x: mx.array, h: mx.array) -> list[mx.array]:
    out = [model.up(x), model.down(h), model.small(x), model.embed.as_linear(x),
           model.embed(mx.array([3, 7]))]
    mx.eval(out)
    return out


def test_bounds_are_aligned_and_cover_every_row():
    assert cpu_split._bounds(1536, 2) == [0, 768, 1536]
    assert cpu_split._bounds(192, 2) == [0, 96, 192]
    cuts = cpu_split._bounds(49152, 3)
    assert cuts is not None and cuts[0] == 0 and cuts[-1] == 49152
    assert all(c % cpu_split.ROW_ALIGN == 0 for c in cuts) and cuts == sorted(set(cuts))
    assert cpu_split._bounds(40, 2) is None  # under MIN_ROWS per part: stock
    assert cpu_split._bounds(64, 3) == [0, 32, 64]  # a small weight takes fewer parts
    assert cpu_split._bounds(4096, 8) == [512 * i for i in range(9)]


def test_parts_setting():
    assert cpu_split.auto_parts(1) == 1
    assert cpu_split.auto_parts(0) == 1
    assert cpu_split.auto_parts(3) == 3
    assert 1 <= cpu_split.auto_parts(None) <= cpu_split.MAX_PARTS
    assert cpu_split.prepare(1, cpu_split.SideStreams()) == []


def test_install_swaps_plain_layers_and_shares_their_arrays():
    model = _model()
    before = dict(tree_flatten(model.parameters()))
    assert cpu_split.install(model) == 4
    assert type(model.up) is cpu_split.SplitLinear and type(model.embed) is cpu_split.SplitEmbedding
    assert type(model.norm) is nn.RMSNorm
    after = dict(tree_flatten(model.parameters()))
    assert after.keys() == before.keys()
    assert all(after[k] is before[k] for k in before)  # nothing copied
    assert cpu_split.install(model) == 0  # idempotent


@pytest.mark.parametrize("parts", [2, 3])
@pytest.mark.parametrize("rows", [1, 5, 8, 20])
def test_split_products_equal_stock(parts, rows):
    model = _model()
    x = mx.random.normal((2, rows, 64), key=mx.random.key(rows))
    h = mx.random.normal((rows, 192), key=mx.random.key(rows + 1))
    want = _outputs(model, x, h)
    cpu_split.install(model)
    assert all(mx.array_equal(a, b) for a, b in zip(_outputs(model, x, h), want))  # outside: stock
    with cpu_split.split_forward(cpu_split.prepare(parts, POOL)):
        got = _outputs(model, x, h)
    assert len(model.up._frink_ranges.parts) == min(parts, 192 // cpu_split.MIN_ROWS)
    assert not model.small._frink_ranges.parts  # 40 rows: stock
    for a, b in zip(got, want):
        assert a.shape == b.shape
        assert mx.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_other_dtypes_take_the_stock_path():
    model = _model()
    model.set_dtype(mx.float16)
    x = mx.random.normal((3, 64)).astype(mx.float16)
    want = model.up(x)
    cpu_split.install(model)
    with cpu_split.split_forward(cpu_split.prepare(2, POOL)):
        got = model.up(x)
    assert mx.array_equal(got, want)
    assert getattr(model.up, "_frink_ranges", None) is None  # not even looked at
