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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from conftest import make_tiny_llama
from gguf_helpers import close_writer, gguf_metadata, permute, write_metadata
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
}


def make_hybrid_checkpoint(name: str, path: Path, seed: int = 0) -> Path:
    """An MLX checkpoint of `name` with random weights (norms, A_log, dt_bias random too)."""
    _, overrides = HYBRIDS[name]
    ckpt = make_tiny_llama(path, seed=seed)  # tokenizer files + a config we replace
    config = {**json.loads((ckpt / "config.json").read_text()), **overrides}
    config.pop("architectures", None)
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


# --- step 1: mlx-lm layout -> HF layout (inverse of each model file's sanitize) ---------------

_QWEN_SHIFTED = (".input_layernorm.weight", ".post_attention_layernorm.weight", "model.norm.weight",
                 ".q_norm.weight", ".k_norm.weight")


def to_hf(name: str, weights: Arrays, config: dict[str, Any]) -> Arrays:
    out = {}
    for key, value in weights.items():
        key = key.removeprefix("language_model.")
        if name.startswith("qwen"):  # qwen3_5 / qwen3_next sanitize: norms + 1, conv (C,1,K) -> (C,K,1)
            if key.endswith(_QWEN_SHIFTED):
                value = value - 1.0
            if key.endswith("conv1d.weight"):
                value = np.swapaxes(value, 1, 2)
        out[key] = value
    return out


# --- step 2: HF -> GGUF as llama.cpp's converter does ------------------------------------------

def _reorder_v_heads(t: np.ndarray, dim: int, nk: int, per_k: int, head_dim: int) -> np.ndarray:
    """conversion/qwen.py _LinearAttentionVReorderBase._reorder_v_heads."""
    shape = list(t.shape)
    t = t.reshape(*shape[:dim], nk, per_k, head_dim, *shape[dim + 1:])
    return np.swapaxes(t, dim, dim + 1).reshape(shape)


def _qwen35_v_reorder(key: str, t: np.ndarray, c: dict[str, Any]) -> np.ndarray:
    """conversion/qwen.py _LinearAttentionVReorderBase.modify_tensors."""
    nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])
    r = nv // nk
    if nk == nv or "linear_attn." not in key:
        return t
    if ".in_proj_qkv." in key:
        return np.concatenate([t[:2 * nk * dk], _reorder_v_heads(t[2 * nk * dk:], 0, nk, r, dv)])
    if ".in_proj_z." in key:
        return _reorder_v_heads(t, 0, nk, r, dv)
    if ".in_proj_b." in key or ".in_proj_a." in key:
        return _reorder_v_heads(t, 0, nk, r, 1)
    if ".A_log" in key or ".dt_bias" in key:
        return _reorder_v_heads(t[:, None], 0, nk, r, 1)[:, 0]
    if ".conv1d" in key:
        t = t.squeeze()
        return np.concatenate([t[:2 * nk * dk], _reorder_v_heads(t[2 * nk * dk:], 0, nk, r, dv)])
    if ".out_proj." in key:
        return _reorder_v_heads(t, 1, nk, r, dv)
    return t


def _split_qkvz(t: np.ndarray, c: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """conversion/qwen.py Qwen3NextModel.modify_tensors, the in_proj_qkvz branch."""
    nk, nv, dk, dv = (c["linear_num_key_heads"], c["linear_num_value_heads"], c["linear_key_head_dim"],
                      c["linear_value_head_dim"])
    sizes = [dk, dk, nv // nk * dv, nv // nk * dv]
    per_head = t.T.reshape(-1, nk, sum(sizes))
    q, k, v, z = np.split(per_head, np.cumsum(sizes)[:-1], axis=-1)
    qkv = np.concatenate([q.reshape(c["hidden_size"], -1), k.reshape(c["hidden_size"], -1),
                          v.reshape(c["hidden_size"], -1)], axis=-1).T
    return qkv, z.reshape(c["hidden_size"], -1).T


def convert_qwen(arch: str, hf: Arrays, c: dict[str, Any], name_of: Callable[[str], str]) -> Arrays:
    """conversion/qwen.py: Qwen3NextModel (+ _LinearAttentionVReorderBase for qwen35*), and
    Qwen2MoeModel's expert stacking (HF's per-expert tensors arrive already stacked here)."""
    out = {}
    for key, t in hf.items():
        if arch != "qwen3next":
            t = _qwen35_v_reorder(key, t, c)
        if key.endswith(".A_log"):
            t = -np.exp(t)
        elif key.endswith(".dt_bias"):
            key = key.rpartition(".dt_bias")[0] + ".dt_proj.bias"
        elif "conv1d" in key:
            t = t.squeeze()
        elif key.endswith("norm.weight") and not key.endswith("linear_attn.norm.weight"):
            t = t + 1
        if "in_proj_qkvz.weight" in key:
            qkv, z = _split_qkvz(t, c)
            layer = key.split(".")[2]
            out[f"blk.{layer}.attn_qkv.weight"], out[f"blk.{layer}.attn_gate.weight"] = qkv, z
            continue
        out[name_of(key.replace(".mlp.switch_mlp.", ".mlp.experts."))] = t
    return out


CONVERTERS: dict[str, Callable[[str, Arrays, dict[str, Any], Callable[[str], str]], Arrays]] = {
    "qwen35": convert_qwen, "qwen35moe": convert_qwen, "qwen3next": convert_qwen,
}


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


# --- metadata: each converter's set_gguf_parameters ----------------------------------------------

def _meta_qwen(w: Any, c: dict[str, Any]) -> None:
    """TextModel + Qwen2MoeModel + Qwen3NextModel.set_gguf_parameters (+ _Qwen35MRopeMixin)."""
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count(c["num_attention_heads"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    rope = c.get("rope_parameters") or {"rope_theta": c["rope_theta"],
                                        "partial_rotary_factor": c["partial_rotary_factor"]}
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    if c.get("num_experts"):
        w.add_expert_count(c["num_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_feed_forward_length(c["moe_intermediate_size"])
        w.add_expert_shared_feed_forward_length(c["shared_expert_intermediate_size"])
    w.add_ssm_conv_kernel(c["linear_conv_kernel_dim"])
    w.add_ssm_state_size(c["linear_key_head_dim"])
    w.add_ssm_group_count(c["linear_num_key_heads"])
    w.add_ssm_time_step_rank(c["linear_num_value_heads"])
    w.add_ssm_inner_size(c["linear_value_head_dim"] * c["linear_num_value_heads"])
    w.add_full_attention_interval(c["full_attention_interval"])
    w.add_rope_dimension_count(int(c["head_dim"] * rope["partial_rotary_factor"]))
    if "mrope_section" in rope:
        w.add_rope_dimension_sections([*rope["mrope_section"], 0])


METADATA: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "qwen35": _meta_qwen, "qwen35moe": _meta_qwen, "qwen3next": _meta_qwen,
}


def write_hybrid_gguf(name: str, ckpt: Path, out: Path, qtype: str = "F32") -> Path:
    """Write `ckpt` as llama.cpp would; matrices (2-D and up, not routers) in `qtype`."""
    import gguf

    arch, _ = HYBRIDS[name]
    config = json.loads((ckpt / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), arch=arch)
    METADATA[name](writer, config)
    write_metadata(writer, {k: v for k, v in gguf_metadata(ckpt).items() if k.startswith("tokenizer.")})
    kind = gguf.GGMLQuantizationType[qtype]
    for gname, array in gguf_tensors(name, ckpt).items():
        array = np.ascontiguousarray(array, dtype=np.float32)
        matrix = array.ndim >= 2 and array.shape[-1] % 32 == 0 and "ffn_gate_inp" not in gname \
            and "conv" not in gname
        if qtype == "F32" or not matrix:
            writer.add_tensor(gname, array)
        else:
            writer.add_tensor(gname, gguf.quants.quantize(array, kind), raw_dtype=kind)
    close_writer(writer)
    return out


__all__ = ["HYBRIDS", "make_hybrid_checkpoint", "permute", "write_hybrid_gguf"]
