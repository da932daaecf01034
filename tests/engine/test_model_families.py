"""Stock mlx-lm model files run over the paged cache unchanged (greedy parity).

Each family is built from its own `ModelArgs` with small random weights; the
engine's batched, chunked, pipelined path must reproduce `generate_step`.
Covers: llama (also sliding-window layers, mistral's mapping), qwen2
(attention bias), qwen3 (q/k norms), gemma2 (queries reshaped per KV group,
soft-capped scores: kv/paged.py rule 5), and a llama with an untied LM head.
"""

from __future__ import annotations

import importlib
import random

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.generate import generate_step
from test_runner_parity import drive  # noqa: E402  (tests/engine is on sys.path under pytest)

from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.types import SeqRequest

COMMON = dict(hidden_size=64, num_hidden_layers=2, intermediate_size=96, num_attention_heads=4,
              num_key_value_heads=2, rms_norm_eps=1e-5, vocab_size=300, max_position_embeddings=512,
              tie_word_embeddings=True)
FAMILIES = {
    "llama": dict(model_type="llama", rope_theta=10000.0),
    "llama-untied": dict(model_type="llama", rope_theta=10000.0, tie_word_embeddings=False),
    "llama-sliding": dict(model_type="llama", rope_theta=10000.0, sliding_window=6,
                          layer_types=["sliding_attention", "full_attention"]),
    "qwen2": dict(model_type="qwen2", rope_theta=10000.0),
    "qwen3": dict(model_type="qwen3", rope_theta=10000.0, head_dim=16),
    "gemma2": dict(model_type="gemma2", rope_theta=10000.0, head_dim=16,
                   query_pre_attn_scalar=16.0),
}


def build(family: str):
    cfg = {**COMMON, **FAMILIES[family]}
    module = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(cfg))
    mx.random.seed(3)
    params = [(k, mx.ones(v.shape) if k.endswith("norm.weight") else mx.random.normal(v.shape) * 0.2)
              for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_family_parity(family):
    model = build(family)
    rng = random.Random(5)
    prompts = [[rng.randrange(1, 300) for _ in range(n)] for n in (9, 4, 15)]
    greedy = SamplingParams(temperature=0)
    arrivals = {0: [SeqRequest("a", prompts[0], greedy, 8), SeqRequest("b", prompts[1], greedy, 8)],
                3: [SeqRequest("c", prompts[2], greedy, 8)]}
    outs = drive(model, arrivals, chunk=5)
    for rid, prompt in zip("abc", prompts):
        want = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=8)]
        assert outs[rid][0] == want, rid


def test_gemma2_four_concurrent_requests_match_generate_step():
    """Four rows in one batch (prefill and decode together): each equals mlx-lm alone."""
    model = build("gemma2")
    assert model.layers[0].self_attn.repeats == 2  # the grouped-query path that broke batching
    rng = random.Random(11)
    prompts = [[rng.randrange(1, 300) for _ in range(n)] for n in (7, 12, 3, 9)]
    greedy = SamplingParams(temperature=0)
    arrivals = {0: [SeqRequest(str(i), p, greedy, 10) for i, p in enumerate(prompts)]}
    outs = drive(model, arrivals, chunk=64)
    for i, prompt in enumerate(prompts):
        want = [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=10)]
        assert outs[str(i)][0] == want, i
