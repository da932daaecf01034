"""Mixed-attention families: llama.cpp's gpt-oss and gemma4 -> mlx-lm's gpt_oss and gemma4_text.

Why: both interleave sliding-window and full attention layers, and Gemma 4 also
gives full layers their own head dims and KV heads, shares K/V across its last
layers and adds per-layer input embeddings; the converter (`conversion/gpt_oss.py`
GptOssModel, `conversion/gemma.py` Gemma4Model on Gemma3Model) keeps most tensors
as HF has them, so the quirks are in the metadata and a few names:

1. gpt-oss: experts are already split gate / up (HF's interleaved gate_up_proj,
   split [::2] / [1::2], as mlx-lm's sanitize does), with their biases; sinks are
   `attn_sinks.weight` for mlx-lm's bare `sinks` (arch.py rule 11); every other
   layer (from the first) slides, as llama.cpp's swa pattern 2; YaRN comes from
   rope.scaling.* (arch.py rule 6). MXFP4 experts are re-quantized (tensors.py).
2. gemma4: norms are stored as they are (Gemma 4's RMSNorm scales by w, not 1 + w);
   layer kinds come from attention.sliding_window_pattern; key_length /
   head_count_kv of full layers vs key_length_swa / the sliding layers' count
   give head_dim, global_head_dim and both KV head counts; a full layer with no
   attn_v uses K as V (attention_k_eq_v); feed_forward_length twice as wide on
   the KV-shared layers is use_double_wide_mlp.
3. gemma4 RoPE: full layers are "proportional" with the rotated share read from
   rope_freqs (1 per rotated pair, 1e30 for the rest: the converter's trick for
   ggml), sliding layers plain with rope.dimension_count_swa / key_length_swa.
4. gemma4 names: layer_scalar is `layer_output_scale.weight`; the router's scale
   is `ffn_gate_inp.scale` and its per-expert scale `ffn_down_exps.scale`; fused
   experts `ffn_gate_up_exps` split into switch_glu's gate and up; K/V tensors of
   KV-shared layers, which mlx-lm drops, are skipped.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ModelFormatError
from .plan import ArchSpec, ModelLayout, Plan, claim, layer_of, num, per_layer, split_gate_up
from .rope import rope_scaling


def _config_gpt_oss(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str],
                    rope: dict[str, np.ndarray]) -> None:
    layers, heads = config["num_hidden_layers"], int(num(meta, p + "attention.head_count"))
    config.update(
        num_attention_heads=heads, num_key_value_heads=int(num(meta, p + "attention.head_count_kv", heads)),
        head_dim=int(num(meta, p + "attention.key_length", config["hidden_size"] // heads)),
        num_local_experts=int(num(meta, p + "expert_count")),
        num_experts_per_tok=int(num(meta, p + "expert_used_count")),
        intermediate_size=int(num(meta, p + "expert_feed_forward_length")),
        sliding_window=int(num(meta, p + "attention.sliding_window")),
        layer_types=["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)])
    scaling = rope_scaling(meta, p, rope, config["max_position_embeddings"])
    if scaling is not None:
        config["rope_scaling"] = scaling


def _rotated_share(rope: dict[str, np.ndarray], head_dim: int) -> float:
    """Rule 3: the full layers' partial_rotary_factor from rope_freqs."""
    factors = rope.get("rope_freqs.weight")
    if factors is None:
        return 1.0
    return 2 * int((factors < 1e29).sum()) / head_dim


def _config_gemma4(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str],
                   rope: dict[str, np.ndarray]) -> None:
    layers = config["num_hidden_layers"]
    sliding = [bool(v) for v in per_layer(meta, p + "attention.sliding_window_pattern", layers)]
    kv = [int(v) for v in per_layer(meta, p + "attention.head_count_kv", layers)]
    ff = [int(v) for v in per_layer(meta, p + "feed_forward_length", layers)]
    shared = int(num(meta, p + "attention.shared_kv_layers", 0))
    head_dim = int(num(meta, p + "attention.key_length_swa", num(meta, p + "attention.key_length")))
    global_dim = int(num(meta, p + "attention.key_length"))
    full = [i for i in range(layers) if not sliding[i]] or [layers - 1]
    if len({ff[i] for i in range(layers - shared)}) > 1:
        raise ModelFormatError(f"GGUF metadata {p}feed_forward_length varies over the unshared layers, "
                               "which mlx-lm's gemma4_text cannot express")
    config.update(
        num_attention_heads=int(num(meta, p + "attention.head_count")), head_dim=head_dim,
        global_head_dim=global_dim, num_key_value_heads=kv[sliding.index(True)] if any(sliding) else kv[0],
        num_global_key_value_heads=kv[full[0]], num_kv_shared_layers=shared,
        intermediate_size=ff[0], use_double_wide_mlp=shared > 0 and ff[-1] == 2 * ff[0],
        layer_types=["sliding_attention" if s else "full_attention" for s in sliding],
        sliding_window=int(num(meta, p + "attention.sliding_window", 512)),
        final_logit_softcapping=float(num(meta, p + "final_logit_softcapping", 0.0)) or None,
        hidden_size_per_layer_input=int(num(meta, p + "embedding_length_per_layer_input", 0)),
        vocab_size_per_layer_input=config["vocab_size"],
        attention_k_eq_v=f"blk.{full[0]}.attn_v.weight" not in names and full[0] < layers - shared,
        rope_parameters={
            "full_attention": {"rope_type": "proportional", "rope_theta": config["rope_theta"],
                               "partial_rotary_factor": _rotated_share(rope, global_dim)},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": float(num(meta, p + "rope.freq_base_swa", 10000.0)),
                                  "partial_rotary_factor": int(num(meta, p + "rope.dimension_count_swa",
                                                                   head_dim)) / head_dim}})
    if meta.get(p + "expert_count") is not None:
        config.update(enable_moe_block=True, num_experts=int(num(meta, p + "expert_count")),
                      top_k_experts=int(num(meta, p + "expert_used_count")),
                      moe_intermediate_size=int(num(meta, p + "expert_feed_forward_length")))


_GEMMA4_SCALES = {".ffn_gate_inp.scale": "router.scale", ".ffn_down_exps.scale": "router.per_expert_scale"}
_SHARED_KV = (".attn_k.weight", ".attn_v.weight", ".attn_k_norm.weight")


def _plan_gemma4(plans: dict[str, Plan], unplaced: list[str], config: dict[str, Any],
                 layout: ModelLayout) -> None:
    """Rule 4: gemma4's layer and router scales, its fused experts split, KV-shared
    layers' K/V skipped."""
    first_shared = config["num_hidden_layers"] - config["num_kv_shared_layers"]
    split_gate_up(plans, unplaced, layout, ".experts.switch_glu.gate_proj.weight")
    for name in list(unplaced):
        layer = layer_of(name)
        if layer is None:
            continue
        prefix = f"model.layers.{layer}."
        for suffix, param in _GEMMA4_SCALES.items():
            if name.endswith(suffix) and prefix + param in layout.shapes and claim(unplaced, name):
                plans[prefix + param] = Plan((name,))
        if name.endswith("_exps.weight") and claim(unplaced, name):
            kind = name.rsplit(".", 2)[1].removeprefix("ffn_").removesuffix("_exps")
            plans[f"{prefix}experts.switch_glu.{kind}_proj.weight"] = Plan((name,))
        if layer >= first_shared and name.endswith(_SHARED_KV):
            unplaced.remove(name)
    for hf, plan in plans.items():
        if hf.endswith(".layer_scalar"):
            plan.reshape = True


ARCHS = {
    "gpt-oss": ArchSpec("gpt_oss", "gpt-oss", config=_config_gpt_oss),
    "gemma4": ArchSpec("gemma4_text", "gemma4", config=_config_gemma4, plan=_plan_gemma4),
}
