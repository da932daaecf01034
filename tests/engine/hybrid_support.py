"""Tiny random checkpoints of the hybrid and mixed-attention families (issue 29).

Each config is the smallest the family's own `ModelArgs` accepts with every
kind of layer present: attention and recurrent layers side by side (GatedDeltaNet
in qwen3_5 / qwen3_5_moe / qwen3_next, short convolutions in lfm2, Mamba2 in
nemotron_h / granitemoehybrid / falcon_h1), sliding windows shorter than the
test prompts (gemma3_text, gpt_oss, gemma4_text) and Gemma 4's KV-shared
layers with their own head dims. `build(family)` makes the model with small
random weights (norms at one), warmed up as the loader does; `write(family, path)` saves it as a checkpoint
mlx-lm loads.
"""

from __future__ import annotations

import functools
import importlib
import json
import random
import shutil
import types
from pathlib import Path
from typing import Any

import mlx.core as mx
from mlx.utils import tree_flatten, tree_unflatten

VOCAB = 300
_GDN = dict(linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8,
            linear_value_head_dim=8, linear_conv_kernel_dim=4, full_attention_interval=2)
_QWEN35_TEXT = dict(model_type="qwen3_5_text", hidden_size=64, intermediate_size=96,
                    num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                    head_dim=16, vocab_size=VOCAB, max_position_embeddings=512,
                    rms_norm_eps=1e-6, tie_word_embeddings=True, **_GDN)
_MOE = dict(num_experts=4, num_experts_per_tok=2, decoder_sparse_step=1,
            shared_expert_intermediate_size=32, moe_intermediate_size=32)

CONFIGS: dict[str, dict[str, Any]] = {
    "qwen3_5": dict(model_type="qwen3_5", text_config=_QWEN35_TEXT),
    "qwen3_5_moe": dict(model_type="qwen3_5_moe",
                        text_config={**_QWEN35_TEXT, "model_type": "qwen3_5_moe_text", **_MOE}),
    "qwen3_next": dict(model_type="qwen3_next", hidden_size=64, num_hidden_layers=4,
                       intermediate_size=96, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, rms_norm_eps=1e-6, vocab_size=VOCAB, rope_theta=10000.0,
                       partial_rotary_factor=0.5, max_position_embeddings=512,
                       mlp_only_layers=[], tie_word_embeddings=True, **_GDN, **_MOE),
    "lfm2": dict(model_type="lfm2", vocab_size=VOCAB, hidden_size=64, num_hidden_layers=4,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                 norm_eps=1e-5, conv_bias=False, conv_L_cache=3, block_dim=64,
                 block_ff_dim=96, block_multiple_of=16, block_ffn_dim_multiplier=1.0,
                 block_auto_adjust_ff_dim=False, rope_theta=10000.0,
                 layer_types=["conv", "full_attention", "conv", "full_attention"]),
    "nemotron_h": dict(model_type="nemotron_h", vocab_size=VOCAB, hidden_size=64,
                       intermediate_size=96, max_position_embeddings=512,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                       attention_bias=False, mamba_num_heads=4, mamba_head_dim=16,
                       mamba_proj_bias=False, ssm_state_size=16, conv_kernel=4, n_groups=2,
                       mlp_bias=False, layer_norm_epsilon=1e-5, use_bias=False,
                       use_conv_bias=True, hybrid_override_pattern=["M", "*", "-", "M"],
                       time_step_limit=[0.001, 100.0]),
    "granitemoehybrid": dict(model_type="granitemoehybrid", vocab_size=VOCAB, hidden_size=64,
                             intermediate_size=96, num_hidden_layers=4,
                             max_position_embeddings=512, num_attention_heads=4,
                             num_key_value_heads=2, attention_bias=False,
                             embedding_multiplier=1.0, attention_multiplier=0.25,
                             logits_scaling=1.0, residual_multiplier=1.0,
                             layer_types=["mamba", "attention", "mamba", "attention"],
                             rms_norm_eps=1e-5, mamba_n_heads=4, mamba_d_head=16,
                             mamba_proj_bias=False, mamba_d_state=16, mamba_d_conv=4,
                             mamba_n_groups=2, mamba_conv_bias=True,
                             mamba_expand=1,  # read by transformers' config check only
                             shared_intermediate_size=96, rope_theta=10000.0),
    "falcon_h1": dict(model_type="falcon_h1", hidden_size=64, num_hidden_layers=2,
                      intermediate_size=96, head_dim=16, num_attention_heads=4,
                      num_key_value_heads=2, mamba_d_conv=4, mamba_d_head=16,
                      mamba_d_ssm=64, mamba_d_state=16, mamba_n_groups=1, mamba_n_heads=4,
                      mamba_chunk_size=16, vocab_size=VOCAB, max_position_embeddings=512,
                      rope_theta=10000.0),
    "gemma4_text": dict(model_type="gemma4_text", hidden_size=64, num_hidden_layers=5,
                        intermediate_size=96, num_attention_heads=4, head_dim=16,
                        global_head_dim=32, num_key_value_heads=2,
                        num_global_key_value_heads=1, num_kv_shared_layers=2,
                        hidden_size_per_layer_input=8, vocab_size=VOCAB,
                        vocab_size_per_layer_input=VOCAB, sliding_window=6,
                        sliding_window_pattern=3, max_position_embeddings=512,
                        final_logit_softcapping=30.0),
    "gemma3_text": dict(model_type="gemma3_text", hidden_size=64, num_hidden_layers=3,
                        intermediate_size=96, num_attention_heads=4, head_dim=16,
                        num_key_value_heads=2, vocab_size=VOCAB, sliding_window=6,
                        sliding_window_pattern=3, query_pre_attn_scalar=16,
                        max_position_embeddings=512),
    "gpt_oss": dict(model_type="gpt_oss", num_hidden_layers=2, num_local_experts=4,
                    num_experts_per_tok=2, vocab_size=VOCAB, hidden_size=64,
                    intermediate_size=64, head_dim=16, num_attention_heads=4,
                    num_key_value_heads=2, sliding_window=6, rope_theta=10000,
                    layer_types=["sliding_attention", "full_attention"]),
}
# A model file the engine refuses at load: llama4's chunked-attention layers
# (ChunkedKVCache) have no paged equivalent (engine/kv/specs.py rule 3).
REFUSED: dict[str, dict[str, Any]] = {
    "llama4": dict(model_type="llama4", text_config=dict(
        model_type="llama4_text", attention_bias=False, attention_chunk_size=8, head_dim=16,
        hidden_size=64, interleave_moe_layer_step=2, intermediate_size=64,
        intermediate_size_mlp=96, max_position_embeddings=512, num_attention_heads=4,
        num_experts_per_tok=1, num_hidden_layers=4, num_key_value_heads=2,
        num_local_experts=2, rms_norm_eps=1e-5, rope_scaling=None, rope_theta=10000.0,
        use_qk_norm=True, vocab_size=VOCAB)),
}
RECURRENT = ("qwen3_5", "qwen3_5_moe", "qwen3_next", "lfm2", "nemotron_h", "granitemoehybrid",
             "falcon_h1")
WINDOWED = ("gemma3_text", "gpt_oss", "gemma4_text")


def config(family: str, vocab_size: int = VOCAB) -> dict[str, Any]:
    """The family's config with `vocab_size` (in its text_config where it nests one)."""
    cfg = json.loads(json.dumps(CONFIGS.get(family) or REFUSED[family]))
    for part in (cfg, cfg.get("text_config")):
        if isinstance(part, dict) and "vocab_size" in part:
            part["vocab_size"] = vocab_size
        if isinstance(part, dict) and "vocab_size_per_layer_input" in part:
            part["vocab_size_per_layer_input"] = vocab_size
    return cfg


def build(family: str, seed: int = 3, vocab_size: int = VOCAB) -> Any:
    """The family's model with small random weights (norm weights one)."""
    cfg = config(family, vocab_size)
    module = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(cfg))
    mx.random.seed(seed)
    params = [(k, mx.ones(v.shape) if k.endswith("norm.weight") else
               mx.random.normal(v.shape) * 0.2) for k, v in tree_flatten(model.parameters())]
    model.update(tree_unflatten(params))
    mx.eval(model.parameters())
    mx.eval(model(mx.array([[1, 2]])))  # as the loader's warm-up: lazy buffers (rope) computed here
    return model


def write(family: str, path: Path, vocab_size: int = VOCAB) -> Path:
    """Save `build(family)` as an mlx-lm checkpoint at `path` (config + weights)."""
    model = build(family, vocab_size=vocab_size)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config(family, vocab_size)))
    weights: dict[str, mx.array] = dict(tree_flatten(model.parameters()))  # type: ignore[arg-type]
    mx.save_safetensors(str(path / "model.safetensors"), weights)
    return path


def checkpoint(family: str, tokenizer_dir: Path, out: Path) -> Path:
    """`write(family, out)` with the vocabulary and tokenizer of the checkpoint at
    `tokenizer_dir`, so a daemon can serve it."""
    vocab = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    write(family, out, vocab_size=vocab)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tokenizer_dir / name, out / name)
    return out


# --- what the family tests share (test_hybrid_families.py, test_window_blocks.py) ---------

@functools.cache
def model(family: str) -> Any:
    return build(family)


@functools.cache
def reference(family: str, prompt: tuple[int, ...], n: int) -> list[int]:
    """mlx-lm's own greedy ids for `prompt` (generate_step over its own caches)."""
    from mlx_lm.generate import generate_step

    return [int(t) for t, _ in generate_step(mx.array(prompt), model(family), max_tokens=n)]


def prompts(seed: int, lengths: tuple[int, ...]) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(1, 300) for _ in range(n)] for n in lengths]


def engine_for(make_engine: Any, family: str, **overrides: Any) -> Any:
    loaded = types.SimpleNamespace(model=model(family), dtype=mx.float32, context_length=512)
    return make_engine(loaded, **overrides)
