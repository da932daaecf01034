"""State-space and short-convolution hybrids: llama.cpp's lfm2 / nemotron_h / granitehybrid /
falcon-h1 -> mlx-lm's lfm2 / nemotron_h / granitemoehybrid / falcon_h1.

Why: these interleave (or, in Falcon-H1, run side by side) recurrent mixers and
attention, and llama.cpp's converter (`conversion/mamba.py` Mamba2Model,
`granite.py` GraniteHybridModel, `nemotron.py` NemotronHModel, `falcon_h1.py`,
`lfm2.py`) reshapes the recurrent tensors; we undo each step (plan.py):

1. Mamba2 mixers: ssm_a holds -exp(A_log) as (heads, 1): A_log = log(-ssm_a);
   ssm_d is D as (heads, 1); ssm_norm is the gated norm's weight as (groups,
   d_inner / groups); conv1d's (C, 1, K) kernel was squeezed to (C, K) (mlx-lm:
   (C, K, 1)); dt_bias was renamed dt_proj.bias. LFM2's short convolution
   kernel likewise.
2. Layer kinds live in per-layer arrays: attention.head_count_kv is 0 on
   recurrent layers (lfm2, granitehybrid, nemotron_h) and feed_forward_length
   is 0 on nemotron_h's non-MLP layers (llama.cpp: recurrent = neither).
3. granitehybrid and nemotron_h attention Q/K rows went through LlamaModel.permute
   (the converter's undo_permute): inverse-permuted back (arch.py rule 1).
4. Granite's scales (embedding_scale, residual_scale, attention.scale, logit_scale)
   are mlx-lm's multipliers; rope.scaling.finetuned = false means no RoPE
   ("nope"). Its MoE layers split HF's fused shared input_linear into
   ffn_{gate,up}_shexp, stacked back (gate first); experts land in switch_mlp.
5. Falcon-H1's muP multipliers were folded into the weights by the converter and
   nothing stores them, so mlx-lm's are all 1 (its sanitize folds them only for
   HF checkpoints, and a tied head then uses the folded embedding, as llama.cpp
   does). Its pre-FFN norm is `blk.N.ffn_norm` with no suffix (arch.py rule 11).
6. Mamba2 in llama.cpp applies dt = softplus(dt + bias) unclamped; mlx-lm's
   granitemoehybrid defaults to clamping at [0.001, 100], so the config says
   [0, 1e30] (HF's default (0, inf), finite for JSON).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .plan import ArchSpec, ModelLayout, Plan, claim, layer_of, num, per_layer

RENAMES = ((".dt_proj.bias", ".dt_bias"),)


def _log_neg(values: np.ndarray) -> np.ndarray:
    return np.log(-values)


def _mamba(meta: dict[str, Any], p: str) -> dict[str, int]:
    heads = int(num(meta, p + "ssm.time_step_rank"))
    inner = int(num(meta, p + "ssm.inner_size"))
    return {"heads": heads, "head_dim": inner // heads, "inner": inner,
            "state": int(num(meta, p + "ssm.state_size")), "conv": int(num(meta, p + "ssm.conv_kernel")),
            "groups": int(num(meta, p + "ssm.group_count", 1))}


def _has(names: set[str], suffix: str) -> bool:
    return any(n.endswith(suffix) for n in names)


def _config_lfm2(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str],
                  rope: dict[str, np.ndarray]) -> None:
    layers = config["num_hidden_layers"]
    kv = [int(v) for v in per_layer(meta, p + "attention.head_count_kv", layers)]
    config.update(
        num_attention_heads=int(num(meta, p + "attention.head_count")), num_key_value_heads=max(kv),
        layer_types=["full_attention" if k else "conv" for k in kv], norm_eps=config["rms_norm_eps"],
        conv_bias=_has(names, "shortconv.in_proj.bias"), conv_L_cache=int(num(meta, p + "shortconv.l_cache")),
        block_dim=config["hidden_size"], block_ff_dim=int(num(meta, p + "feed_forward_length")),
        block_multiple_of=256, block_ffn_dim_multiplier=1.0, block_auto_adjust_ff_dim=False)


def _config_granite(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str],
                  rope: dict[str, np.ndarray]) -> None:
    layers, m = config["num_hidden_layers"], _mamba(meta, p)
    kv = [int(v) for v in per_layer(meta, p + "attention.head_count_kv", layers)]
    experts = int(num(meta, p + "expert_count", 0))
    config.update(
        num_attention_heads=int(num(meta, p + "attention.head_count")), num_key_value_heads=max(kv),
        layer_types=["attention" if k else "mamba" for k in kv],
        intermediate_size=int(num(meta, p + "feed_forward_length")),
        attention_bias=_has(names, "attn_q.bias"), mlp_bias=_has(names, "ffn_up.bias"),
        embedding_multiplier=float(num(meta, p + "embedding_scale", 1.0)),
        attention_multiplier=float(num(meta, p + "attention.scale", 0.0)) or None,
        residual_multiplier=float(num(meta, p + "residual_scale", 1.0)),
        logits_scaling=float(num(meta, p + "logit_scale", 1.0)),
        position_embedding_type="rope" if bool(num(meta, p + "rope.scaling.finetuned", True)) else "nope",
        mamba_n_heads=m["heads"], mamba_d_head=m["head_dim"], mamba_d_state=m["state"],
        mamba_d_conv=m["conv"], mamba_n_groups=m["groups"], mamba_conv_bias=_has(names, "ssm_conv1d.bias"),
        mamba_proj_bias=_has(names, "ssm_in.bias"), time_step_limit=[0.0, 1e30],
        mamba_expand=m["inner"] // config["hidden_size"])  # transformers' config checks heads * dim
    if config["attention_multiplier"] is None:  # llama.cpp's default: 1/sqrt(head_dim)
        config["attention_multiplier"] = (config["hidden_size"] // config["num_attention_heads"]) ** -0.5
    if experts:
        config.update(num_local_experts=experts, num_experts_per_tok=int(num(meta, p + "expert_used_count")),
                      shared_intermediate_size=int(num(meta, p + "expert_shared_feed_forward_length")))


def _config_nemotron(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str],
                  rope: dict[str, np.ndarray]) -> None:
    layers, m = config["num_hidden_layers"], _mamba(meta, p)
    kv = [int(v) for v in per_layer(meta, p + "attention.head_count_kv", layers)]
    ff = [int(v) for v in per_layer(meta, p + "feed_forward_length", layers)]
    heads = int(num(meta, p + "attention.head_count"))
    config.update(
        num_attention_heads=heads, num_key_value_heads=max(kv),
        head_dim=int(num(meta, p + "attention.key_length", config["hidden_size"] // heads)),
        hybrid_override_pattern=["*" if k else "-" if f else "M" for k, f in zip(kv, ff)],
        intermediate_size=max(ff), layer_norm_epsilon=config["rms_norm_eps"],
        attention_bias=_has(names, "attn_q.bias"), mlp_bias=_has(names, "ffn_up.bias"), use_bias=False,
        mamba_num_heads=m["heads"], mamba_head_dim=m["head_dim"], ssm_state_size=m["state"],
        conv_kernel=m["conv"], n_groups=m["groups"], use_conv_bias=_has(names, "ssm_conv1d.bias"),
        mamba_proj_bias=_has(names, "ssm_in.bias"))


def _config_falcon(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str],
                  rope: dict[str, np.ndarray]) -> None:
    m = _mamba(meta, p)
    heads = int(num(meta, p + "attention.head_count"))
    config.update(
        num_attention_heads=heads, num_key_value_heads=int(num(meta, p + "attention.head_count_kv", heads)),
        head_dim=int(num(meta, p + "attention.key_length", config["hidden_size"] // heads)),
        intermediate_size=int(num(meta, p + "feed_forward_length")),
        attention_bias=_has(names, "attn_q.bias"), mlp_bias=_has(names, "ffn_up.bias"),
        projectors_bias=_has(names, "ssm_out.bias"), mamba_d_ssm=m["inner"], mamba_n_heads=m["heads"],
        mamba_d_head=m["head_dim"], mamba_d_state=m["state"], mamba_d_conv=m["conv"],
        mamba_n_groups=m["groups"], mamba_conv_bias=_has(names, "ssm_conv1d.bias"),
        mamba_proj_bias=_has(names, "ssm_in.bias"), mamba_rms_norm=_has(names, "ssm_norm.weight"),
        mamba_norm_before_gate=False, attention_in_multiplier=1.0, attention_out_multiplier=1.0,
        embedding_multiplier=1.0, key_multiplier=1.0, lm_head_multiplier=1.0, ssm_in_multiplier=1.0,
        ssm_out_multiplier=1.0, mlp_multipliers=[1.0, 1.0], ssm_multipliers=[1.0] * 5)


def _plan_recurrent(plans: dict[str, Plan], unplaced: list[str], config: dict[str, Any],
                    layout: ModelLayout) -> None:
    """Rule 1: the Mamba2 mixers' A, D, gated norm, conv1d kernel and dt bias undone (and
    the short convolution's kernel)."""
    for hf, plan in plans.items():
        if hf.endswith(".A_log"):
            plan.values, plan.reshape = _log_neg, True
        if hf.endswith((".conv1d.weight", ".conv.conv.weight", ".mixer.D", ".mamba.D", ".norm.weight")):
            plan.reshape = True


def _plan_lfm2(plans: dict[str, Plan], unplaced: list[str], config: dict[str, Any],
               layout: ModelLayout) -> None:
    _plan_recurrent(plans, unplaced, config, layout)
    if "model.embedding_norm.weight" not in plans and claim(unplaced, "output_norm.weight"):
        plans["model.embedding_norm.weight"] = Plan(("output_norm.weight",))  # newer files' name


def _plan_granite(plans: dict[str, Plan], unplaced: list[str], config: dict[str, Any],
                  layout: ModelLayout) -> None:
    """Rule 4's shared MLP and experts on top of rule 1."""
    _plan_recurrent(plans, unplaced, config, layout)
    for name in list(unplaced):
        layer = layer_of(name)
        prefix = f"model.layers.{layer}."
        if name.endswith((".ffn_gate_shexp.weight", ".ffn_up_shexp.weight")):
            gate, up = f"blk.{layer}.ffn_gate_shexp.weight", f"blk.{layer}.ffn_up_shexp.weight"
            if claim(unplaced, gate) and claim(unplaced, up):
                plans[prefix + "shared_mlp.input_linear.weight"] = Plan((gate, up))
        for kind in ("gate", "up", "down"):
            if name == f"blk.{layer}.ffn_{kind}_exps.weight" and claim(unplaced, name):
                plans[f"{prefix}block_sparse_moe.switch_mlp.{kind}_proj.weight"] = Plan((name,))


ARCHS = {
    "lfm2": ArchSpec("lfm2", "lfm2", config=_config_lfm2, plan=_plan_lfm2),
    "granitehybrid": ArchSpec("granitemoehybrid", "granitehybrid", permute_qk=True, renames=RENAMES,
                              config=_config_granite, plan=_plan_granite),
    "nemotron_h": ArchSpec("nemotron_h", "nemotron_h", permute_qk=True, renames=RENAMES,
                           config=_config_nemotron, plan=_plan_recurrent),
    "falcon-h1": ArchSpec("falcon_h1", "falcon-h1", renames=RENAMES, config=_config_falcon,
                          plan=_plan_recurrent),
}
