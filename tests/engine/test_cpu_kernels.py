"""The CPU attention fast path: same numbers as mlx's SDPA, and only where it is meant to run."""

from __future__ import annotations

import types

import mlx.core as mx
import numpy as np
import pytest

from frink_mlx.engine import cpu_kernels
from frink_mlx.engine.kv.paged import (
    BatchLayout,
    PagedKVStore,
    PagedLayerCache,
    RowSpan,
)


def test_exp2_matches_numpy_to_fp32_rounding():
    t = np.concatenate([np.linspace(-126, 0, 200001), [-1e30, -200.0, 0.0]]).astype(np.float32)
    got = np.array(cpu_kernels.exp2_nonpositive(mx.array(t)))
    want = np.exp2(np.maximum(t.astype(np.float64), -126))
    assert np.max(np.abs(got / want - 1)) < 3e-7


def _qkv(batch, heads, kv_heads, length, width, seed=0):
    rng = np.random.default_rng(seed)
    q = mx.array(rng.standard_normal((batch, heads, length, 16)).astype(np.float32))
    k = mx.array(rng.standard_normal((batch, kv_heads, width, 16)).astype(np.float32))
    v = mx.array(rng.standard_normal((batch, kv_heads, width, 16)).astype(np.float32))
    return q, k, v


@pytest.mark.parametrize("batch,heads,kv_heads,length,width", [
    (1, 4, 4, 1, 9), (3, 6, 2, 1, 20), (2, 9, 3, 7, 30), (1, 4, 1, 40, 40)])
def test_attention_matches_sdpa_with_a_ragged_mask(batch, heads, kv_heads, length, width):
    q, k, v = _qkv(batch, heads, kv_heads, length, width)
    rng = np.random.default_rng(1)
    ends = rng.integers(length, width + 1, size=batch)       # each row's own context length
    q_pos = ends[:, None] - length + np.arange(length)[None, :]
    allowed = np.arange(width)[None, None, :] <= q_pos[:, :, None]
    mask = mx.array(allowed[:, None])
    want = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.25, mask=mask)
    got = cpu_kernels.attention(q, k, v, 0.25, mx.where(mask, 0.0, -mx.inf)[:, :, None])
    assert np.allclose(np.array(got), np.array(want), rtol=1e-5, atol=1e-5)


def test_chunked_queries_give_the_same_result(monkeypatch):
    q, k, v = _qkv(1, 4, 2, 33, 33)
    bias = mx.where(mx.tril(mx.ones((33, 33), dtype=mx.bool_)), 0.0, -mx.inf)[None, None, None]
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


def test_install_patches_the_model_module_once():
    module = types.ModuleType("fake_model_module")
    module.scaled_dot_product_attention = lambda *a, **k: None
    module.swiglu = lambda g, x: None
    model_cls = type("Model", (), {"__module__": "fake_model_module"})
    import sys
    sys.modules["fake_model_module"] = module
    try:
        assert cpu_kernels.install(model_cls())
        first, act = module.scaled_dot_product_attention, module.swiglu
        assert cpu_kernels.install(model_cls()) and module.scaled_dot_product_attention is first
        assert module.swiglu is act and getattr(act, "_frink_cpu_kernel", False)
        assert not cpu_kernels.install(object())  # a module without the name
    finally:
        del sys.modules["fake_model_module"]


def test_swiglu_matches_mlx_lm_and_only_runs_inside_the_engine_forward(monkeypatch):
    from mlx_lm.models.activations import swiglu as stock_swiglu

    rng = np.random.default_rng(3)
    gate = mx.array((rng.standard_normal((3, 7, 96)) * 6).astype(np.float32))
    x = mx.array(rng.standard_normal((3, 7, 96)).astype(np.float32))
    want = np.array(stock_swiglu(gate, x))
    assert np.allclose(np.array(cpu_kernels.swiglu(gate, x)), want, rtol=1e-5, atol=1e-5)
    calls = []
    dispatch = cpu_kernels.make_swiglu_dispatch(lambda g, v: calls.append(1) or stock_swiglu(g, v))
    monkeypatch.setattr(cpu_kernels, "MIN_SWIGLU_SIZE", 1)
    dispatch(gate, x)                                   # outside: stock
    with cpu_kernels.engine_forward():
        got = dispatch(gate, x)                         # inside: ours
        dispatch(gate.astype(mx.float16), x.astype(mx.float16))  # not float32: stock
    dispatch(gate, x)
    assert len(calls) == 3 and np.allclose(np.array(got), want, rtol=1e-5, atol=1e-5)


def test_small_gates_keep_the_stock_swiglu():
    calls = []
    dispatch = cpu_kernels.make_swiglu_dispatch(lambda g, v: calls.append(g.size) or g)
    with cpu_kernels.engine_forward():
        dispatch(mx.zeros((8, 1, 1536)), mx.zeros((8, 1, 1536)))  # a decode batch
    assert calls == [8 * 1536]
