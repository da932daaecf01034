"""llama.cpp's converter, mirrored for tests: mlx-lm weights -> HF layout -> GGUF tensors and metadata.

Step 1, `to_hf`, inverts each mlx-lm model file's `sanitize`; step 2, `CONVERTERS`,
is the `modify_tensors` of llama.cpp's `conversion/*.py` class for that family
(named in each docstring); `METADATA` is its `set_gguf_parameters`. Only what the
tiny test models exercise is mirrored (no NVFP4/MXFP4 repacking, no LoRA paths).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray]

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
        elif name in ("lfm2", "nemotron_h", "granitehybrid", "falcon-h1"):
            if key.endswith(("conv1d.weight", "conv.conv.weight")):  # sanitize's (C,1,K) -> (C,K,1)
                value = np.swapaxes(value, 1, 2)
            if name == "falcon-h1":
                value = _falcon_unfold(key, value, config)
            if name == "granitehybrid" and ".block_sparse_moe.switch_mlp." in key:
                key, value = _granite_unstack(key, value, weights)
                if key is None:
                    continue
        elif name == "gpt-oss" and ".mlp.experts." in key:
            key, value = _gpt_oss_fuse(key, value, weights)
            if key is None:
                continue
        elif name == "gemma4" and ".experts.switch_glu." in key:
            if key.endswith("up_proj.weight"):
                continue
            base = key.split(".switch_glu.")[0]
            if key.endswith("gate_proj.weight"):
                key = base + ".gate_up_proj"
                value = np.concatenate([value, weights[base + ".switch_glu.up_proj.weight"]], axis=-2)
            else:
                key = base + ".down_proj"
        out[key] = value
    return out


def _gpt_oss_fuse(key: str, value: np.ndarray, weights: Arrays) -> tuple[Any, np.ndarray]:
    """HF gpt-oss (bf16): gate_up_proj (E, hidden, 2ff) with gate / up interleaved, its bias
    (E, 2ff) likewise, down_proj (E, ff, hidden); mlx-lm's sanitize splits [::2] / [1::2]."""
    base = key.split(".experts.")[0] + ".experts."
    if ".up_proj." in key:
        return None, value
    if ".down_proj." in key:
        return (base + "down_proj", np.swapaxes(value, -1, -2)) if key.endswith("weight") \
            else (base + "down_proj_bias", value)
    up = weights[key.replace("gate_proj", "up_proj")]
    fused = np.stack([value, up], axis=-2 if value.ndim == 3 else -1)  # (..., ff, 2, hidden) | (E, ff, 2)
    if value.ndim == 3:
        return base + "gate_up_proj", np.swapaxes(fused.reshape(value.shape[0], -1, value.shape[-1]), -1, -2)
    return base + "gate_up_proj_bias", fused.reshape(value.shape[0], -1)


def _granite_unstack(key: str, value: np.ndarray, weights: Arrays) -> tuple[Any, np.ndarray]:
    """granitemoehybrid sanitize, inverted: switch_mlp gate|up -> input_linear, down -> output_linear."""
    prefix = key.split(".switch_mlp.")[0].removeprefix("language_model.")
    if key.endswith("gate_proj.weight"):
        up = weights[key.replace("gate_proj", "up_proj")]
        return f"{prefix}.input_linear.weight", np.concatenate([value, up], axis=1)
    if key.endswith("down_proj.weight"):
        return f"{prefix}.output_linear.weight", value
    return None, value


def _falcon_multiplier(key: str, c: dict[str, Any]) -> Any:
    """The factor llama.cpp's conversion/falcon_h1.py FalconH1Model.modify_tensors folds in."""
    if "down_proj" in key:
        return c["mlp_multipliers"][1]
    if "gate_proj" in key:
        return c["mlp_multipliers"][0]
    if "k_proj" in key:
        return c["key_multiplier"] * c["attention_in_multiplier"]
    if "q_proj" in key or "v_proj" in key:
        return c["attention_in_multiplier"]
    if "o_proj" in key:
        return c["attention_out_multiplier"]
    if "out_proj" in key:
        return c["ssm_out_multiplier"]
    if "in_proj" in key:
        inner, gs = c["mamba_d_ssm"], c["mamba_n_groups"] * c["mamba_d_state"]
        sizes = [inner, inner, gs, gs, c["mamba_n_heads"]]
        rows = np.concatenate([np.full(n, m) for n, m in zip(sizes, c["ssm_multipliers"])])
        return c["ssm_in_multiplier"] * rows[:, None]
    if "lm_head" in key:
        return c["lm_head_multiplier"]
    if "embed_tokens" in key:
        return c["embedding_multiplier"]
    return 1.0


def _falcon_unfold(key: str, value: np.ndarray, c: dict[str, Any]) -> np.ndarray:
    """HF's unfolded weight from the folded one mlx-lm holds (the converter folds it back)."""
    if key.endswith(".weight") and value.ndim == 2:
        return value / _falcon_multiplier(key, c)
    return value


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


def _mamba2(key: str, t: np.ndarray, c: dict[str, Any], groups: int) -> tuple[str, np.ndarray]:
    """conversion/mamba.py Mamba2Model.filter_tensors + modify_tensors."""
    if key.endswith(".dt_bias"):
        key = key.rpartition(".dt_bias")[0] + ".dt_proj.bias"
    if "conv1d.weight" in key:
        t = t.squeeze()
    elif key.endswith((".A_log", ".D")):
        t = t.reshape(*t.shape, 1)
    elif key.endswith(("mixer.norm.weight", "mamba.norm.weight")):
        t = t.reshape(groups, -1)
    if key.endswith(".A_log"):
        t = -np.exp(t)
    return key, t


def _llama_permute(key: str, t: np.ndarray, c: dict[str, Any]) -> np.ndarray:
    """conversion/llama.py LlamaModel.modify_tensors (undo_permute) with LlamaModel.permute."""
    heads = c["num_attention_heads"] if key.endswith(("q_proj.weight", "q_proj.bias")) else \
        c["num_key_value_heads"] if key.endswith(("k_proj.weight", "k_proj.bias")) else 0
    if not heads:
        return t
    shape = t.shape
    t = t.reshape(heads, 2, shape[0] // heads // 2, *shape[1:])
    return np.swapaxes(t, 1, 2).reshape(shape)


def convert_ssm(arch: str, hf: Arrays, c: dict[str, Any], name_of: Callable[[str], str]) -> Arrays:
    """lfm2.py LFM2Model, granite.py GraniteHybridModel (+ GraniteMoeModel's expert and shared-MLP
    splits), nemotron.py NemotronHModel (dense: GraniteHybridModel's path) and falcon_h1.py."""
    groups = c.get("n_groups") or c.get("mamba_n_groups") or 1
    out = {}
    for key, t in hf.items():
        if arch == "lfm2":
            out[name_of(key)] = t.squeeze(1) if "conv.conv" in key else t
            continue
        if arch == "falcon-h1" and key.endswith(".weight") and t.ndim == 2:
            t = t * _falcon_multiplier(key, c)
        if key.endswith(("block_sparse_moe.input_linear.weight", "shared_mlp.input_linear.weight")):
            layer, ff = key.split(".")[2], t.shape[-2] // 2
            kind = "exps" if "block_sparse_moe" in key else "shexp"
            out[f"blk.{layer}.ffn_gate_{kind}.weight"] = t[..., :ff, :]
            out[f"blk.{layer}.ffn_up_{kind}.weight"] = t[..., ff:, :]
            continue
        if any(s in key for s in ("mamba.", "mixer.conv1d", "mixer.in_proj", "mixer.out_proj", "mixer.A_log",
                                  "mixer.D", "mixer.dt_bias", "mixer.norm")):
            key, t = _mamba2(key, t, c, groups)
        elif arch in ("granitehybrid", "nemotron_h"):
            t = _llama_permute(key, t, c)
        out[name_of(key)] = t
    return out


def convert_gpt_oss(arch: str, hf: Arrays, c: dict[str, Any], name_of: Callable[[str], str]) -> Arrays:
    """conversion/gpt_oss.py GptOssModel.filter_tensors + modify_tensors (the bf16 path)."""
    out = {}
    for key, t in hf.items():
        if "sinks" in key:
            key += ".weight"
        if "down_proj" in key:
            if key.endswith("_bias"):
                key = key.replace("down_proj_bias", "down_proj.bias")
            else:
                key, t = key.replace("down_proj", "down_proj.weight"), np.swapaxes(t, -1, -2)
        if "gate_up_proj" in key:
            if key.endswith("_bias"):
                out[name_of(key.replace("gate_up_proj_bias", "gate_proj.bias"))] = t[..., ::2]
                out[name_of(key.replace("gate_up_proj_bias", "up_proj.bias"))] = t[..., 1::2]
            else:
                t = np.swapaxes(t, -1, -2)
                out[name_of(key.replace("gate_up_proj", "gate_proj.weight"))] = t[:, ::2, :]
                out[name_of(key.replace("gate_up_proj", "up_proj.weight"))] = t[:, 1::2, :]
            continue
        out[name_of(key)] = t
    return out


def convert_gemma4(arch: str, hf: Arrays, c: dict[str, Any], name_of: Callable[[str], str]) -> Arrays:
    """conversion/gemma.py Gemma4Model (norm shift 0) on Gemma3Model, + generate_extra_tensors'
    rope_freqs. HF also carries K/V projections for the KV-shared layers, which mlx-lm drops:
    random ones are added here so the importer has to skip them."""
    out = {}
    for key, t in hf.items():
        if key.endswith(("per_dim_scale", "layer_scalar")) or (
                ".experts." in key and not key.endswith(".weight")):
            key += ".weight"
        if key.endswith("router.scale"):
            out[f"blk.{key.split('.')[2]}.ffn_gate_inp.scale"] = t
        elif key.endswith(".per_expert_scale"):
            out[f"blk.{key.split('.')[2]}.ffn_down_exps.scale"] = t
        else:
            out[name_of(key)] = t
    full = c["rope_parameters"]["full_attention"]
    rotated = int(c["global_head_dim"] * full["partial_rotary_factor"] / 2)
    out["rope_freqs.weight"] = np.array([1.0] * rotated + [1e30] * (c["global_head_dim"] // 2 - rotated),
                                        dtype=np.float32)
    rng = np.random.default_rng(5)
    for layer in range(c["num_hidden_layers"] - c["num_kv_shared_layers"], c["num_hidden_layers"]):
        dim = c["head_dim"] if c["layer_types"][layer] == "sliding_attention" else c["global_head_dim"]
        for kind in ("attn_k", "attn_v"):
            shape = (dim, c["hidden_size"])
            out[f"blk.{layer}.{kind}.weight"] = rng.standard_normal(shape).astype(np.float32)
    return out


CONVERTERS: dict[str, Callable[[str, Arrays, dict[str, Any], Callable[[str], str]], Arrays]] = {
    "qwen35": convert_qwen, "qwen35moe": convert_qwen, "qwen3next": convert_qwen,
    "lfm2": convert_ssm, "nemotron_h": convert_ssm, "granitehybrid": convert_ssm, "falcon-h1": convert_ssm,
    "gpt-oss": convert_gpt_oss, "gemma4": convert_gemma4,
}


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


def _meta_text(w: Any, c: dict[str, Any]) -> None:
    """TextModel.set_gguf_parameters: the keys every converter writes."""
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(c["num_hidden_layers"])
    w.add_head_count(c["num_attention_heads"])
    w.add_rope_freq_base(c.get("rope_theta", 10000.0))
    w.add_layer_norm_rms_eps(c.get("rms_norm_eps") or c.get("norm_eps") or c["layer_norm_epsilon"])


def _meta_ssm(w: Any, c: dict[str, Any], heads: int, head_dim: int, state: int, conv: int,
              groups: int) -> None:
    """Mamba2Model / GraniteHybridModel's ssm.* keys."""
    w.add_ssm_conv_kernel(conv)
    w.add_ssm_inner_size(heads * head_dim)
    w.add_ssm_state_size(state)
    w.add_ssm_time_step_rank(heads)
    w.add_ssm_group_count(groups)


def _meta_lfm2(w: Any, c: dict[str, Any]) -> None:
    """lfm2.py LFM2Model.set_gguf_parameters."""
    _meta_text(w, c)
    w.add_head_count_kv([c["num_key_value_heads"] if t != "conv" else 0 for t in c["layer_types"]])
    w.add_shortconv_l_cache(c["conv_L_cache"])
    w.add_feed_forward_length(c["block_ff_dim"])


def _meta_granite(w: Any, c: dict[str, Any]) -> None:
    """granite.py GraniteModel + GraniteMoeModel + GraniteHybridModel.set_gguf_parameters."""
    _meta_text(w, c)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_attention_scale(c["attention_multiplier"])
    w.add_embedding_scale(c["embedding_multiplier"])
    w.add_residual_scale(c["residual_multiplier"])
    w.add_logit_scale(c["logits_scaling"])
    if c.get("num_local_experts"):
        w.add_expert_count(c["num_local_experts"])
        w.add_expert_used_count(c["num_experts_per_tok"])
        w.add_expert_shared_feed_forward_length(c["shared_intermediate_size"])
    _meta_ssm(w, c, c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"], c["mamba_d_conv"],
              c["mamba_n_groups"])
    w.add_head_count_kv([c["num_key_value_heads"] if t == "attention" else 0 for t in c["layer_types"]])
    w.add_rope_scaling_finetuned(c.get("position_embedding_type", "rope") == "rope")


def _meta_nemotron(w: Any, c: dict[str, Any]) -> None:
    """nemotron.py NemotronHModel.set_gguf_parameters (dense)."""
    _meta_text(w, c)
    pattern = c["hybrid_override_pattern"]
    _meta_ssm(w, c, c["mamba_num_heads"], c["mamba_head_dim"], c["ssm_state_size"], c["conv_kernel"],
              c["n_groups"])
    w.add_head_count_kv([c["num_key_value_heads"] if t == "*" else 0 for t in pattern])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_feed_forward_length([c["intermediate_size"] if t == "-" else 0 for t in pattern])


def _meta_falcon(w: Any, c: dict[str, Any]) -> None:
    """mamba.py Mamba2Model + falcon_h1.py FalconH1Model.set_gguf_parameters."""
    _meta_text(w, c)
    _meta_ssm(w, c, c["mamba_n_heads"], c["mamba_d_head"], c["mamba_d_state"], c["mamba_d_conv"],
              c["mamba_n_groups"])
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])


def _meta_gpt_oss(w: Any, c: dict[str, Any]) -> None:
    """TextModel (+ YaRN) + GptOssModel.set_gguf_parameters."""
    import gguf

    _meta_text(w, c)
    w.add_feed_forward_length(c["intermediate_size"])
    w.add_head_count_kv(c["num_key_value_heads"])
    w.add_key_length(c["head_dim"])
    w.add_value_length(c["head_dim"])
    w.add_expert_count(c["num_local_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_sliding_window(c["sliding_window"])
    w.add_expert_feed_forward_length(c["intermediate_size"])
    yarn = c["rope_scaling"]
    w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
    w.add_rope_scaling_factor(yarn["factor"])
    w.add_rope_scaling_orig_ctx_len(yarn["original_max_position_embeddings"])
    w.add_rope_scaling_yarn_beta_fast(yarn["beta_fast"])
    w.add_rope_scaling_yarn_beta_slow(yarn["beta_slow"])


def _meta_gemma4(w: Any, c: dict[str, Any]) -> None:
    """TextModel + Gemma3Model + Gemma4Model.set_gguf_parameters."""
    layers, shared = c["num_hidden_layers"], c["num_kv_shared_layers"]
    sliding = [t == "sliding_attention" for t in c["layer_types"]]
    w.add_context_length(c["max_position_embeddings"])
    w.add_embedding_length(c["hidden_size"])
    w.add_block_count(layers)
    w.add_head_count(c["num_attention_heads"])
    w.add_rope_freq_base(c["rope_parameters"]["full_attention"]["rope_theta"])
    w.add_rope_freq_base_swa(c["rope_parameters"]["sliding_attention"]["rope_theta"])
    w.add_layer_norm_rms_eps(c["rms_norm_eps"])
    w.add_expert_count(c["num_experts"])
    w.add_expert_used_count(c["top_k_experts"])
    w.add_final_logit_softcapping(c["final_logit_softcapping"])
    w.add_sliding_window(c["sliding_window"])
    w.add_shared_kv_layers(shared)
    w.add_embedding_length_per_layer_input(c["hidden_size_per_layer_input"])
    w.add_sliding_window_pattern(sliding)
    w.add_key_length(c["global_head_dim"])
    w.add_value_length(c["global_head_dim"])
    w.add_key_length_swa(c["head_dim"])
    w.add_value_length_swa(c["head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    ff = c["intermediate_size"]
    w.add_feed_forward_length([ff if i < layers - shared else 2 * ff for i in range(layers)])
    w.add_head_count_kv([c["num_key_value_heads"] if s else c["num_global_key_value_heads"] for s in sliding])
    w.add_rope_dimension_count(c["global_head_dim"])
    w.add_rope_dimension_count_swa(int(c["head_dim"] * c["rope_parameters"]["sliding_attention"]
                                       ["partial_rotary_factor"]))


METADATA: dict[str, Callable[[Any, dict[str, Any]], None]] = {
    "qwen35": _meta_qwen, "qwen35moe": _meta_qwen, "qwen3next": _meta_qwen,
    "lfm2": _meta_lfm2, "nemotron_h": _meta_nemotron, "granitehybrid": _meta_granite,
    "falcon-h1": _meta_falcon, "gpt-oss": _meta_gpt_oss, "gemma4": _meta_gemma4,
}


