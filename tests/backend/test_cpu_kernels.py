"""The CPU attention fast path: same numbers as mlx's SDPA, and only where it is meant to run."""

from __future__ import annotations

import types

import mlx.core as mx
import numpy as np
import pytest

from frink_mlx.backend.cpu import kernels as cpu_kernels
from frink_mlx.backend.cpu import rope as cpu_rope
from frink_mlx.engine.kv.layout import BatchLayout, RowSpan
from frink_mlx.engine.kv.paged import PagedKVStore, PagedLayerCache


def test_exp_matches_numpy_within_stock_mlx_accuracy():
    # mx.exp itself is off by up to ~3.5e-6 relative here. Ours: within 1e-5
    # relative where weights matter (e^t > 5e-5), never more than 1e-5 relative
    # plus 4e-11 absolute (the value at the floor, subtracted so that masked
    # scores get exactly 0 without a select), and exactly 0 at and below the floor
    # (inputs are finite: masks are cpu_kernels.MASKED, not -inf).
    t = np.concatenate([np.linspace(-24, 0, 200001), [0.0]]).astype(np.float32)
    got = np.array(cpu_kernels.exp_nonpositive(mx.array(t))).astype(np.float64)
    want = np.exp(t.astype(np.float64))
    assert np.max(np.abs(got / want - 1)[t > -10]) < 1e-5
    assert np.max(np.abs(got / want - 1)[t > -1]) < 3e-6
    assert np.all(np.abs(got - want) <= 1e-5 * want + 4e-11)
    below = np.array(cpu_kernels.exp_nonpositive(mx.array([-24.0, -24.5, -1e9, -1e30], mx.float32)))
    assert below.tolist() == [0.0, 0.0, 0.0, 0.0]


def _qkv(batch, heads, kv_heads, length, width, seed=0):
    rng = np.random.default_rng(seed)
    q = mx.array(rng.standard_normal((batch, heads, length, 16)).astype(np.float32))
    k = mx.array(rng.standard_normal((batch, kv_heads, width, 16)).astype(np.float32))
    v = mx.array(rng.standard_normal((batch, kv_heads, width, 16)).astype(np.float32))
    return q, k, v


@pytest.mark.parametrize("batch,heads,kv_heads,length,width", [
    (1, 4, 4, 1, 9), (3, 6, 2, 1, 20), (2, 9, 3, 7, 30), (1, 4, 1, 40, 40), (1, 6, 2, 600, 640)])
def test_attention_matches_sdpa_with_a_ragged_mask(batch, heads, kv_heads, length, width):
    q, k, v = _qkv(batch, heads, kv_heads, length, width)
    rng = np.random.default_rng(1)
    ends = rng.integers(length, width + 1, size=batch)       # each row's own context length
    q_pos = ends[:, None] - length + np.arange(length)[None, :]
    allowed = np.arange(width)[None, None, :] <= q_pos[:, :, None]
    mask = mx.array(allowed[:, None])
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = cpu_kernels.attention(q, k, v, 0.25, mx.where(mask, 0.0, cpu_kernels.MASKED)[:, :, None])
    assert np.allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def test_chunked_queries_give_the_same_result(monkeypatch):
    q, k, v = _qkv(1, 4, 2, 33, 33)
    bias = mx.where(mx.tril(mx.ones((33, 33), dtype=mx.bool_)), 0.0, cpu_kernels.MASKED)[None, None, None]
    whole = cpu_kernels.attention(q, k, v, 0.25, bias)
    monkeypatch.setattr(cpu_kernels, "_SCORES_PER_CHUNK", 4 * 33 * 5)  # 5 query rows a chunk
    chunked = cpu_kernels.attention(q, k, v, 0.25, bias)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    assert np.allclose(np.array(chunked), np.array(whole), rtol=1e-6, atol=1e-6)
    assert np.allclose(np.array(chunked), np.array(want), rtol=1e-5, atol=1e-5)


def _paged_cache(length: int, start: int) -> PagedLayerCache:
    store = PagedKVStore(num_layers=1, num_blocks=8, block_size=4, n_kv_heads=2, head_dim=16,
                         dtype=mx.float32)
    layout = BatchLayout([RowSpan(start, length, [0, 1, 2, 3])], block_size=4,
                         trash_slot=store.trash_slot)
    return PagedLayerCache(store, 0, layout)


def test_dispatch_takes_the_fast_path_only_for_paged_fp32_calls(monkeypatch):
    monkeypatch.setattr(cpu_kernels, "MIN_SCORES", 1)
    calls = []

    def stock(q, k, v, cache, scale, mask, sinks=None):
        calls.append(type(cache).__name__)
        return mx.fast.scaled_dot_product_attention(q, k, v, scale=scale, mask=mask)

    sdpa = cpu_kernels.make_dispatch(stock)
    q, k, v = _qkv(1, 4, 2, 5, 5)
    paged = _paged_cache(5, 0)
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask="causal")
    got = sdpa(q, k, v, cache=paged, scale=0.25, mask="causal")
    assert calls == [] and np.allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)
    sdpa(q, k, v, cache=object(), scale=0.25, mask="causal")                  # mlx-lm's own caches
    sdpa(q.astype(mx.float16), k.astype(mx.float16), v.astype(mx.float16),
         cache=paged, scale=0.25, mask="causal")                              # not float32
    sdpa(q, k, v, cache=paged, scale=0.25, mask="causal", sinks=mx.zeros((4,)))  # sinks
    assert calls == ["object", "PagedLayerCache", "PagedLayerCache"]
    monkeypatch.setattr(cpu_kernels, "MIN_SCORES", 4 * 5 * 5 + 1)              # too little work
    sdpa(q, k, v, cache=paged, scale=0.25, mask="causal")
    assert calls[-1] == "PagedLayerCache"


def test_install_routes_the_models_own_layers_once_and_leaves_mlx_lm_alone(tiny_llama_dir):
    from mlx_lm import load
    from mlx_lm.models import llama

    stock_sdpa, stock_swiglu = llama.scaled_dot_product_attention, llama.swiglu
    model, _ = load(str(tiny_llama_dir))
    other, _ = load(str(tiny_llama_dir))
    ids = mx.array([[1, 30, 60, 90]])
    want = model(ids)
    assert cpu_kernels.install(model)
    attn, mlp = model.layers[0].self_attn, model.layers[0].mlp
    first = type(attn)
    assert first is not llama.Attention and isinstance(attn, llama.Attention)
    assert type(mlp) is not llama.MLP and isinstance(mlp, llama.MLP)
    assert getattr(first.__call__.__globals__["scaled_dot_product_attention"], "_frink_cpu_kernel", False)
    assert getattr(type(mlp).__call__.__globals__["swiglu"], "_frink_cpu_kernel", False)
    assert cpu_kernels.install(model) and type(attn) is first  # idempotent
    # the module and every other model keep the stock functions and classes
    assert llama.scaled_dot_product_attention is stock_sdpa and llama.swiglu is stock_swiglu
    assert type(other.layers[0].self_attn) is llama.Attention and type(other.layers[0].mlp) is llama.MLP
    assert np.array_equal(np.array(model(ids)), np.array(want))  # outside the engine: stock
    assert not cpu_kernels.install(object())  # nothing to route


def test_swiglu_matches_mlx_lm_and_only_runs_inside_the_engine_forward(monkeypatch):
    from mlx_lm.models.activations import swiglu as stock_swiglu

    rng = np.random.default_rng(3)
    gate = mx.array((rng.standard_normal((3, 7, 96)) * 6).astype(np.float32))
    x = mx.array(rng.standard_normal((3, 7, 96)).astype(np.float32))
    want = np.array(stock_swiglu(gate, x))
    assert np.allclose(np.array(cpu_kernels.swiglu(gate, x)), want, rtol=1e-5, atol=1e-5)
    calls = []
    dispatch = cpu_kernels.make_swiglu_dispatch(lambda g, v: calls.append(1) or stock_swiglu(g, v))
    dispatch(gate, x)                                   # outside: stock
    with cpu_rope.engine_forward():
        got = dispatch(gate, x)                         # inside: ours
        dispatch(gate.astype(mx.float16), x.astype(mx.float16))  # not float32: stock
    dispatch(gate, x)
    assert len(calls) == 3 and np.allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("traditional", [True, False])
@pytest.mark.parametrize("dims,base,scale", [(16, 10000.0, 1.0), (12, 1e6, 0.25)])
def test_rope_matches_mx_fast_rope_with_per_row_offsets(traditional, dims, base, scale):
    rng = np.random.default_rng(5)
    x = mx.array(rng.standard_normal((3, 4, 6, 16)).astype(np.float32))
    offsets = mx.array([0, 700, 5000])
    cos, sin = cpu_rope.rope_tables(offsets, 6, dims, base, scale)
    got = cpu_rope.rope(x, cos, sin, dims, traditional)
    want = mx.fast.rope(x, dims, traditional=traditional, base=base, scale=scale, offset=offsets)
    assert np.max(np.abs(np.array(got) - np.array(want))) < 1e-6


def test_rope_dispatch_runs_inside_the_engine_forward_and_shares_tables(monkeypatch):
    import mlx.nn as nn

    stock = nn.RoPE(16, traditional=True, base=10000.0)
    rope = cpu_rope.RoPEDispatch(stock)
    built = []
    real_tables = cpu_rope.rope_tables
    monkeypatch.setattr(cpu_rope, "rope_tables", lambda *a: built.append(a[1:]) or real_tables(*a))
    x = mx.array(np.random.default_rng(6).standard_normal((2, 4, 3, 16)).astype(np.float32))
    offsets = mx.array([4, 9])
    want = np.array(stock(x, offset=offsets))
    assert np.allclose(np.array(rope(x, offset=offsets)), want, atol=1e-6) and built == []
    with cpu_rope.engine_forward():
        first = rope(x, offset=offsets)
        second = rope(x[:, :1], offset=offsets)            # keys of another layer, fewer heads
        rope(x, offset=7)                                  # an int offset: stock
    assert built == [(3, 16, 10000.0, 1.0)]               # one table for both calls
    assert np.allclose(np.array(first), want, atol=1e-6)
    assert np.allclose(np.array(second), want[:, :1], atol=1e-6)
    with cpu_rope.engine_forward():
        rope(x, offset=offsets)
    assert len(built) == 2                                 # a new forward builds its own


def test_install_wraps_each_layers_rope_once():
    import mlx.nn as nn

    attn = types.SimpleNamespace(rope=nn.RoPE(16))
    model = types.SimpleNamespace(layers=[types.SimpleNamespace(self_attn=attn)])
    cpu_kernels.install(model)
    wrapped = attn.rope
    assert isinstance(wrapped, cpu_rope.RoPEDispatch)
    cpu_kernels.install(model)
    assert attn.rope is wrapped


def test_a_row_with_every_key_masked_stays_finite():
    """Padding rows of a right-padded prefill see no key; their output is unused but must not be NaN."""
    q, k, v = _qkv(1, 4, 2, 3, 8)
    allowed = np.ones((3, 8), dtype=bool)
    allowed[2] = False
    bias = mx.where(mx.array(allowed), 0.0, cpu_kernels.MASKED)[None, None, None]
    out = np.array(cpu_kernels.attention(q, k, v, 0.25, bias))
    assert np.isfinite(out).all()
