"""Gated DeltaNet hybrids: llama.cpp's qwen35 / qwen35moe / qwen3next -> mlx-lm's
qwen3_5 / qwen3_5_moe / qwen3_next.

Why: Qwen3.5 / 3.6 and Qwen3-Next interleave linear-attention (GatedDeltaNet)
layers with gated full attention every `full_attention_interval` layers; llama.cpp's
converter (`conversion/qwen.py`, Qwen3NextModel and _LinearAttentionVReorderBase)
rewrites the recurrent layers' tensors, and we undo each step (plan.py):

1. ssm_a holds -exp(A_log): A_log = log(-ssm_a).
2. dt_bias was renamed dt_proj.bias (GGUF `ssm_dt.bias`); conv1d's (C, 1, K) kernel
   was squeezed to (C, K): mlx-lm's is (C, K, 1).
3. Every `*norm.weight` except the gated `linear_attn.norm` was stored plus 1, which
   is exactly what mlx-lm's sanitize adds to HF weights: taken as they are.
4. qwen35 / qwen35moe, when linear_num_value_heads > linear_num_key_heads: the V
   heads were reordered from grouped-by-K-head to tiled (for ggml's broadcast) in
   attn_qkv's V rows, attn_gate, ssm_beta / ssm_alpha, ssm_a, ssm_dt, conv1d's V
   channels and ssm_out's input columns; we reorder them back.
5. qwen3next: HF's fused in_proj_qkvz (per K head: q, k, v, z) was split into
   attn_qkv (all q | all k | all v) and attn_gate (all z); we interleave the rows
   back per K head. Legacy files keep ssm_in, HF's layout, taken as it is.
6. Fused expert gate/up (`ffn_gate_up_exps`, gate rows first per expert) splits into
   mlx-lm's switch_mlp gate and up; separate ffn_{gate,up,down}_exps are renamed.
7. Config: ssm.group_count = K heads, ssm.time_step_rank = V heads, ssm.state_size
   = K head dim, ssm.inner_size / V heads = V head dim; rope.dimension_count /
   key_length = partial_rotary_factor. Layer kinds come from
   full_attention_interval, or from an attention.recurrent_layers array when it
   is that same period. MTP blocks past block_count - nextn_predict_layers are
   skipped (mlx-lm drops them too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ModelFormatError
from .plan import (
    ArchSpec,
    ModelLayout,
    Plan,
    claim,
    grouped_from_tiled,
    interleave_blocks,
    layer_of,
    num,
    per_layer,
    split_gate_up,
)

RENAMES = ((".mlp.experts.", ".mlp.switch_mlp."), (".dt_proj.bias", ".dt_bias"))


def _log_neg(values: np.ndarray) -> np.ndarray:
    return np.log(-values)


def _layers(meta: dict[str, Any], p: str) -> tuple[int, int]:
    """(mlx-lm layers, full-attention interval): rule 7."""
    total = int(num(meta, p + "block_count"))
    layers = total - int(num(meta, p + "nextn_predict_layers", 0))
    interval = int(num(meta, p + "full_attention_interval", 4))
    if meta.get(p + "attention.recurrent_layers") is not None:
        recurrent = [bool(v) for v in per_layer(meta, p + "attention.recurrent_layers", total)][:layers]
        periods = [i for i in range(1, layers + 1) if recurrent == [(j + 1) % i != 0 for j in range(layers)]]
        if not periods:
            raise ModelFormatError(f"GGUF metadata {p}attention.recurrent_layers is not periodic, "
                                   "which mlx-lm's full_attention_interval cannot express")
        interval = periods[0]
    return layers, interval


def _config(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str],
            rope: dict[str, np.ndarray]) -> None:
    layers, interval = _layers(meta, p)
    heads = int(num(meta, p + "attention.head_count"))
    head_dim = int(num(meta, p + "attention.key_length", config["hidden_size"] // heads))
    v_heads = int(num(meta, p + "ssm.time_step_rank"))
    config.update(
        num_hidden_layers=layers, full_attention_interval=interval, num_attention_heads=heads,
        num_key_value_heads=int(num(meta, p + "attention.head_count_kv", heads)), head_dim=head_dim,
        intermediate_size=int(num(meta, p + "feed_forward_length", 0)),
        linear_num_key_heads=int(num(meta, p + "ssm.group_count")), linear_num_value_heads=v_heads,
        linear_key_head_dim=int(num(meta, p + "ssm.state_size")),
        linear_value_head_dim=int(num(meta, p + "ssm.inner_size")) // v_heads,
        linear_conv_kernel_dim=int(num(meta, p + "ssm.conv_kernel")),
        partial_rotary_factor=int(num(meta, p + "rope.dimension_count", head_dim // 4)) / head_dim,
        attention_bias=any(n.endswith("attn_q.bias") for n in names))
    if meta.get(p + "expert_count") is not None:
        shared = int(num(meta, p + "expert_shared_feed_forward_length", 0))
        config.update(num_experts=int(num(meta, p + "expert_count")),
                      num_experts_per_tok=int(num(meta, p + "expert_used_count")),
                      moe_intermediate_size=int(num(meta, p + "expert_feed_forward_length")),
                      shared_expert_intermediate_size=shared,
                      decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)
    if config["model_type"] != "qwen3_next":  # qwen3_5 reads its RoPE from rope_parameters
        sections = [int(s) for s in np.asarray(meta.get(p + "rope.dimension_sections", [11, 11, 10]))[:3]]
        config["rope_parameters"] = {"type": "default", "mrope_section": sections,
                                     "rope_theta": config["rope_theta"],
                                     "partial_rotary_factor": config["partial_rotary_factor"]}


def _common_plans(plans: dict[str, Plan], unplaced: list[str], config: dict[str, Any],
                  layout: ModelLayout) -> None:
    """Rules 1, 2, 6 and the MTP skip of rule 7."""
    for name in list(unplaced):
        layer = layer_of(name)
        if layer is not None and layer >= config["num_hidden_layers"]:
            unplaced.remove(name)
    for hf, plan in plans.items():
        if hf.endswith(".A_log"):
            plan.values = _log_neg
        if hf.endswith((".conv1d.weight", "shared_expert_gate.weight")):
            plan.reshape = True
    split_gate_up(plans, unplaced, layout, ".mlp.switch_mlp.gate_proj.weight")


def _plan_qwen35(plans: dict[str, Plan], unplaced: list[str], config: dict[str, Any],
                 layout: ModelLayout) -> None:
    """Rule 4 on top of the common rules."""
    _common_plans(plans, unplaced, config, layout)
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    if nk == nv:
        return
    dk, dv = config["linear_key_head_dim"], config["linear_value_head_dim"]
    per_k = nv // nk
    v_rows = grouped_from_tiled(nk, per_k, dv)
    heads = grouped_from_tiled(nk, per_k, 1)
    qk = np.arange(2 * nk * dk)
    for hf, plan in plans.items():
        if ".linear_attn." not in hf:
            continue
        if hf.endswith((".in_proj_qkv.weight", ".conv1d.weight")):
            plan.rows = np.concatenate([qk, qk.size + v_rows])
        elif hf.endswith(".in_proj_z.weight"):
            plan.rows = v_rows
        elif hf.endswith((".in_proj_a.weight", ".in_proj_b.weight", ".A_log", ".dt_bias")):
            plan.rows = heads
        elif hf.endswith(".out_proj.weight"):
            plan.col_blocks = (dv, heads)


def _plan_qwen3next(plans: dict[str, Plan], unplaced: list[str], config: dict[str, Any],
                    layout: ModelLayout) -> None:
    """Rule 5 on top of the common rules."""
    _common_plans(plans, unplaced, config, layout)
    nk, nv = config["linear_num_key_heads"], config["linear_num_value_heads"]
    key_dim, value_dim = nk * config["linear_key_head_dim"], nv * config["linear_value_head_dim"]
    order = interleave_blocks([key_dim, key_dim, value_dim, value_dim], nk)
    for layer in range(config["num_hidden_layers"]):
        hf = f"model.layers.{layer}.linear_attn.in_proj_qkvz.weight"
        qkv, gate = f"blk.{layer}.attn_qkv.weight", f"blk.{layer}.attn_gate.weight"
        if hf in layout.shapes and hf not in plans and qkv in unplaced and claim(unplaced, gate):
            unplaced.remove(qkv)
            plans[hf] = Plan((qkv, gate), rows=order)


ARCHS = {
    "qwen35": ArchSpec("qwen3_5", "qwen35", renames=RENAMES, prefix="language_model.", config=_config,
                       plan=_plan_qwen35),
    "qwen35moe": ArchSpec("qwen3_5_moe", "qwen35moe", renames=RENAMES, prefix="language_model.",
                          config=_config, plan=_plan_qwen35),
    "qwen3next": ArchSpec("qwen3_next", "qwen3next", renames=RENAMES, config=_config, plan=_plan_qwen3next),
}
