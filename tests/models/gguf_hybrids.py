"""Tiny random hybrid / mixed-attention checkpoints written twice: as an MLX checkpoint
(mlx-lm's own layout) and as the GGUF llama.cpp's converter would make of the same
model, so import tests can compare the two.

The GGUF side is built in two steps, each mirroring a named piece of code:
1. `to_hf`: mlx-lm layout -> Hugging Face layout, the inverse of the model file's
   `sanitize` (Qwen3.5 norms back to zero-centred, conv kernels back to (C, 1, K)).
2. `CONVERTERS[family]`: HF -> GGUF as llama.cpp's `conversion/*.py` does it (the
   `modify_tensors` of each model class; cited per function), with GGUF names from
   the `gguf` package's forward map (`get_tensor_name_map(...).get_name`).
Metadata keys are the ones that converter's `set_gguf_parameters` writes.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from conftest import make_tiny_llama
from gguf_converters import CONVERTERS, METADATA, to_hf
from gguf_helpers import close_writer, gguf_metadata, write_metadata
from mlx.utils import tree_flatten

Arrays = dict[str, np.ndarray]

_QWEN_LINEAR = {"linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 32,
                "linear_value_head_dim": 32, "linear_conv_kernel_dim": 4, "full_attention_interval": 2}
_QWEN = {"hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 128, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
         "tie_word_embeddings": False, **_QWEN_LINEAR}
_QWEN_ROPE = {"rope_parameters": {"type": "default", "mrope_section": [11, 11, 10], "rope_theta": 10000.0,
                                  "partial_rotary_factor": 0.25}}
_MOE = {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
        "shared_expert_intermediate_size": 64, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True}

# test name -> (GGUF architecture, mlx-lm config)
HYBRIDS: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen35": ("qwen35", {"model_type": "qwen3_5", **_QWEN, **_QWEN_ROPE}),
    "qwen35moe": ("qwen35moe", {"model_type": "qwen3_5_moe", **_QWEN, **_QWEN_ROPE, **_MOE}),
    "qwen3next": ("qwen3next", {"model_type": "qwen3_next", **_QWEN, **_MOE, "rope_theta": 10000.0,
                                "partial_rotary_factor": 0.25}),
    "lfm2": ("lfm2", {
        "model_type": "lfm2", "hidden_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 512, "norm_eps": 1e-5, "conv_bias": False,
        "conv_L_cache": 3, "block_dim": 64, "block_multiple_of": 256, "block_ffn_dim_multiplier": 1.0,
        "block_auto_adjust_ff_dim": False, "block_ff_dim": 128, "rope_theta": 1e6,
        "layer_types": ["conv", "full_attention", "conv", "full_attention"]}),
    "nemotron_h": ("nemotron_h", {
        "model_type": "nemotron_h", "hidden_size": 64, "intermediate_size": 128,
        "max_position_embeddings": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "attention_bias": False,
        "mamba_num_heads": 4, "mamba_head_dim": 16, "mamba_proj_bias": False, "ssm_state_size": 16,
        "conv_kernel": 4, "n_groups": 2, "mlp_bias": False, "layer_norm_epsilon": 1e-5, "use_bias": False,
        "use_conv_bias": True, "hybrid_override_pattern": ["M", "-", "*", "-", "M", "-"],
        "num_hidden_layers": 6, "tie_word_embeddings": False}),
    "granitehybrid": ("granitehybrid", {
        "model_type": "granitemoehybrid", "hidden_size": 64, "intermediate_size": 64, "num_hidden_layers": 4,
        "max_position_embeddings": 512, "num_attention_heads": 4, "num_key_value_heads": 2,
        "attention_bias": False, "embedding_multiplier": 12.0, "attention_multiplier": 0.25,
        "logits_scaling": 8.0, "residual_multiplier": 0.22, "rms_norm_eps": 1e-5,
        "layer_types": ["mamba", "attention", "mamba", "mamba"], "mamba_n_heads": 8, "mamba_d_head": 16,
        "mamba_proj_bias": False, "mamba_d_state": 16, "mamba_d_conv": 4, "mamba_n_groups": 1,
        "mamba_conv_bias": True, "shared_intermediate_size": 64, "num_local_experts": 4,
        "num_experts_per_tok": 2, "position_embedding_type": "nope", "time_step_limit": [0.0, 1e30]}),
    "falcon-h1": ("falcon-h1", {
        "model_type": "falcon_h1", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "mamba_d_ssm": 64,
        "mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 16, "mamba_n_groups": 1, "mamba_d_conv": 4,
        "mamba_rms_norm": True, "tie_word_embeddings": False, "rope_theta": 1e6,
        "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "attention_in_multiplier": 0.8,
        "attention_out_multiplier": 0.9, "embedding_multiplier": 1.5, "key_multiplier": 0.4,
        "lm_head_multiplier": 0.5, "ssm_in_multiplier": 1.25, "ssm_out_multiplier": 0.25,
        "mlp_multipliers": [0.9, 0.6], "ssm_multipliers": [0.35, 0.25, 0.4, 0.5, 0.3]}),
    "gpt-oss": ("gpt-oss", {
        "model_type": "gpt_oss", "hidden_size": 64, "num_hidden_layers": 4, "intermediate_size": 64,
        "num_local_experts": 4, "num_experts_per_tok": 2, "head_dim": 16, "num_attention_heads": 4,
        "num_key_value_heads": 2, "sliding_window": 4, "rope_theta": 150000.0, "rms_norm_eps": 1e-5,
        "max_position_embeddings": 512, "tie_word_embeddings": False,
        "layer_types": ["sliding_attention", "full_attention"] * 2,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                         "beta_fast": 32.0, "beta_slow": 1.0}}),
    "gemma4": ("gemma4", {
        "model_type": "gemma4_text", "hidden_size": 64, "num_hidden_layers": 6, "intermediate_size": 128,
        "num_attention_heads": 4, "head_dim": 32, "global_head_dim": 64, "num_key_value_heads": 1,
        "num_global_key_value_heads": 2, "num_kv_shared_layers": 2, "hidden_size_per_layer_input": 8,
        "sliding_window": 4, "rms_norm_eps": 1e-6, "max_position_embeddings": 512,
        "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
        "attention_k_eq_v": True, "use_double_wide_mlp": True, "enable_moe_block": True, "num_experts": 4,
        "top_k_experts": 2, "moe_intermediate_size": 32, "final_logit_softcapping": 30.0,
        "rope_parameters": {
            "full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6, "rope_type": "proportional"},
            "sliding_attention": {"partial_rotary_factor": 1.0, "rope_theta": 1e4, "rope_type": "default"}}}),
}


def make_hybrid_checkpoint(name: str, path: Path, seed: int = 0) -> Path:
    """An MLX checkpoint of `name` with random weights (norms, A_log, dt_bias random too)."""
    _, overrides = HYBRIDS[name]
    ckpt = make_tiny_llama(path, seed=seed)  # tokenizer files + a config we replace
    config = {**json.loads((ckpt / "config.json").read_text()), **overrides}
    config.pop("architectures", None)
    if config["model_type"] == "gemma4_text":
        config["vocab_size_per_layer_input"] = config["vocab_size"]
    for key in ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads"):
        config.setdefault(key, overrides.get(key))
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for key, value in tree_flatten(model.parameters()):
        array = rng.standard_normal(value.shape).astype(np.float32) * 0.2
        if key.endswith("norm.weight") or key.endswith("layernorm.weight"):
            array = 1.0 + array / 2
        weights[key] = mx.array(array)
    mx.save_safetensors(str(ckpt / "model.safetensors"), weights, metadata={"format": "mlx"})
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    return ckpt


def gguf_tensors(name: str, ckpt: Path) -> Arrays:
    import gguf

    arch, _ = HYBRIDS[name]
    config = json.loads((ckpt / "config.json").read_text())
    tmap = gguf.get_tensor_name_map({v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[arch],
                                    config["num_hidden_layers"])

    def name_of(hf: str) -> str:
        found = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
        assert found is not None, hf
        return found

    weights = {k: np.array(v, dtype=np.float32) for k, v in mx.load(str(ckpt / "model.safetensors")).items()}
    return CONVERTERS[name](arch, to_hf(name, weights, config), config, name_of)


def write_hybrid_gguf(name: str, ckpt: Path, out: Path, qtype: str = "F32",
                      overrides: dict[str, str] | None = None) -> Path:
    """Write `ckpt` as llama.cpp would; matrices (2-D and up, not routers) in `qtype`, or in
    overrides[fragment] for GGUF names containing that fragment (llama.cpp's mixes)."""
    import gguf

    arch, _ = HYBRIDS[name]
    config = json.loads((ckpt / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), arch=arch)
    METADATA[name](writer, config)
    write_metadata(writer, {k: v for k, v in gguf_metadata(ckpt).items() if k.startswith("tokenizer.")})
    for gname, array in gguf_tensors(name, ckpt).items():
        chosen = next((q for frag, q in (overrides or {}).items() if frag in gname), qtype)
        kind = gguf.GGMLQuantizationType[chosen]
        array = np.ascontiguousarray(array, dtype=np.float32)
        matrix = array.ndim >= 2 and array.shape[-1] % 32 == 0 and "ffn_gate_inp" not in gname \
            and "conv1d" not in gname and "shortconv.conv." not in gname
        if chosen == "F32" or not matrix:
            writer.add_tensor(gname, array)
        else:
            writer.add_tensor(gname, gguf.quants.quantize(array, kind), raw_dtype=kind)
    close_writer(writer)
    return out


__all__ = ["HYBRIDS", "make_hybrid_checkpoint", "write_hybrid_gguf"]
