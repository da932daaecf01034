"""kv/specs.py: each family's cache entries as its own make_cache() has them, or a refusal."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from mlx_lm.models.cache import QuantizedKVCache, RotatingKVCache

from frink_mlx.engine.kv.specs import UnsupportedModel, model_cache_spec

sys.path.insert(0, str(Path(__file__).parents[1]))
from hybrid_support import build  # noqa: E402


def test_gemma4_gets_a_pool_per_own_kv_layer_at_its_head_dim_and_none_for_shared_layers():
    spec = model_cache_spec(build("gemma4_text"))  # 5 layers, the last 2 share K/V
    assert [(a.n_kv_heads, a.head_dim, a.window) for a in spec.attention] == \
        [(2, 16, 6), (2, 16, 6), (2, 32, None)]
    assert [e.kind for e in spec.entries] == ["attention"] * 3 and not spec.has_state
    assert spec.kv_bytes_per_token(build("gemma4_text").model.embed_tokens.weight.dtype) == \
        4 * (2 * 2 * 16 * 2 + 2 * 2 * 32)


def test_recurrent_entries_carry_their_state_shapes_in_model_order():
    spec = model_cache_spec(build("nemotron_h"))  # pattern M * - M: the MLP layer has no entry
    assert [e.kind for e in spec.entries] == ["state", "attention", "state"]
    assert spec.states[0].shapes == ((3, 128), (4, 16, 16))
    assert spec.state_bytes_per_row == 2 * 4 * (3 * 128 + 4 * 16 * 16)
    falcon = model_cache_spec(build("falcon_h1"))
    assert [[p.kind for p in e.parts] for e in falcon.entries] == [["state", "attention"]] * 2


@pytest.mark.parametrize("cache, why", [
    (lambda: RotatingKVCache(max_size=8, keep=4), "sink tokens"),
    (lambda: QuantizedKVCache(), "QuantizedKVCache"),
])
def test_cache_kinds_without_a_paged_equivalent_are_refused_naming_them(cache, why):
    model = build("gemma3_text")
    model.make_cache = lambda: [cache() for _ in model.layers]
    with pytest.raises(UnsupportedModel) as err:
        model_cache_spec(model)
    assert str(err.value).startswith("gemma3_text: ") and why in str(err.value)


def test_llama4_chunked_attention_is_refused():
    with pytest.raises(UnsupportedModel, match="llama4: its ChunkedKVCache layers"):
        model_cache_spec(build("llama4"))


def test_afm7_kv_reuse_layers_are_refused_naming_why():
    """Its reuse layers' RoPE offset is the key length minus the query length: a ragged
    batch's padded keys give short rows the wrong positions (the family survey found its
    batched rows differ from generate_step), so it is refused at load (specs.py rule 4)."""
    from mlx_lm.models import afm7

    model = afm7.Model(afm7.ModelArgs.from_dict(dict(
        model_type="afm7", vocab_size=300, hidden_dim=64, num_layers=2, num_kv_reuse_layers=1,
        num_heads=4, num_kv_heads=2)))
    with pytest.raises(UnsupportedModel, match="afm7: its KV-reuse layers take RoPE positions"):
        model_cache_spec(model)


def test_gpt_bigcode_integer_offset_is_refused_naming_why():
    from mlx_lm.models import gpt_bigcode

    model = gpt_bigcode.Model(gpt_bigcode.ModelArgs.from_dict(dict(
        model_type="gpt_bigcode", n_embd=64, n_layer=2, n_inner=96, n_head=4, n_positions=512,
        layer_norm_epsilon=1e-5, vocab_size=300)))
    with pytest.raises(UnsupportedModel, match="gpt_bigcode: its learned position embeddings"):
        model_cache_spec(model)


def test_plamo3_window_mask_one_key_past_its_cache_is_refused_naming_why():
    """Its mask shows window_size + 1 keys, its RotatingKVCache keeps window_size: mlx-lm's
    own greedy ids for one prompt change with prefill_step_size (the family survey: 4
    differs from 1, 8 and 2048 on a 23-token prompt, window 6), so there are no ids to
    match and it is refused at load (specs.py rule 4)."""
    from mlx_lm.models import plamo3

    model = plamo3.Model(plamo3.ModelArgs.from_dict(dict(
        model_type="plamo3", hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, intermediate_size=96, vocab_size=300,
        sliding_window=6)))
    with pytest.raises(UnsupportedModel, match="plamo3: its sliding-window mask shows"):
        model_cache_spec(model)
