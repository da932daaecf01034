"""GGUF architecture metadata and tensor names -> an mlx-lm model's config and weight names.

Why: mlx-lm serves checkpoints laid out like Hugging Face's (one model file per
`model_type`); llama.cpp's converter renamed and reshaped those tensors on the
way into GGUF. Undoing that is two steps: invert the `gguf` package's own
HF -> GGUF name map (`gguf.get_tensor_name_map`), and keep the candidate that the
mlx-lm model actually has (its parameters, from instantiating it lazily: no
weights are allocated).

Rules (llama.cpp's `convert_hf_to_gguf.py` quirks, undone):
1. llama / mistral: Q and K rows were permuted into the interleaved rotary
   layout (`LlamaModel.permute`); we inverse-permute rows (quantization groups
   run along columns, so rows move freely), leaving a plain HF layout.
2. gemma2 / gemma3: every `*norm.weight` was stored plus 1 (the HF RMSNorm
   multiplies by 1 + w); we subtract 1. Embedding scaling (sqrt(hidden)) and
   soft-capping are computed by the model file, not stored in weights.
3. qwen3moe: the stacked experts (`ffn_*_exps`) land in mlx-lm's `switch_mlp`.
4. phi3: fused `attn_qkv` / `ffn_up` map onto mlx-lm's fused `qkv_proj` /
   `gate_up_proj` as they are.
5. No `output.weight` means tied embeddings.
6. RoPE: linear scaling, YaRN, Llama-3.1's `rope_freqs` and phi3's
   `rope_factors_long/short` map onto mlx-lm's `rope_scaling` (rope.py says how).
7. gemma2/3 attention scale: llama.cpp uses 1/sqrt(head_dim), except the 27B
   models (46 / 62 layers) use 1/sqrt(hidden / heads); `query_pre_attn_scalar` says so.
   gemma3's local layers use base 10000 and every 6th layer is global, as in llama.cpp.
8. Vision-tower and projector tensors (`v.*`, `mm.*`, as in Ollama's gemma3 blobs)
   are skipped: the text model is served on its own.
9. Stop tokens are llama.cpp's end-of-generation set: EOS, EOT, EOM, plus any
   token spelled like a known turn end (`<|im_end|>`, `<end_of_turn>`, phi3's
   `<|end|>`, ...), which GGUFs often leave out of the metadata (phi3's EOS is
   `<|endoftext|>` while its turns end with `<|end|>`).
10. Hybrid and mixed-attention families (Qwen3.5 / Qwen3-Next, LFM2, Nemotron-H,
   Granite-4-H, Falcon-H1, Gemma 4, gpt-oss) build their own config from the base
   keys and state their tensor quirks as plans: hybrid_delta.py, hybrid_ssm.py,
   mixed.py (plan.py says what a plan can express).
11. GGUF names the gguf package writes without a suffix (`blk.N.ssm_a`,
   falcon-h1's `blk.N.ffn_norm`) or with one mlx-lm lacks (`attn_sinks.weight` for
   a bare `sinks`) match the whole name too; the model's own parameters decide.
Left out: gemma2's 4096 sliding window (mlx-lm's gemma2 file has none; it only
matters past 4096 tokens), phi3's sliding window (likewise ignored by mlx-lm).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...errors import ModelFormatError
from . import hybrid_delta, hybrid_ssm, mixed
from .plan import ArchSpec, ModelLayout, Plan, inverse_permute_rows, model_layout, num
from .rope import rope_scaling

__all__ = ["ARCHS", "ArchSpec", "ModelLayout", "Plan", "arch_spec", "build_config", "end_of_generation_ids",
           "inverse_permute_rows", "map_names", "missing_params", "model_layout", "plans_for"]

ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# Vision towers and projectors some GGUFs carry beside the text model (Ollama's gemma3): skipped.
MULTIMODAL_PREFIXES = ("v.", "mm.")


ARCHS = {
    "llama": ArchSpec("llama", "llama", permute_qk=True),
    "mistral": ArchSpec("llama", "llama", permute_qk=True),
    "qwen2": ArchSpec("qwen2", "qwen2"),
    "qwen3": ArchSpec("qwen3", "qwen3"),
    "qwen3moe": ArchSpec("qwen3_moe", "qwen3moe", renames=((".mlp.experts.", ".mlp.switch_mlp."),)),
    "gemma2": ArchSpec("gemma2", "gemma2", norm_shift=1.0),
    "gemma3": ArchSpec("gemma3_text", "gemma3", norm_shift=1.0),
    "phi3": ArchSpec("phi3", "phi3"),
    **hybrid_delta.ARCHS, **hybrid_ssm.ARCHS, **mixed.ARCHS,
}


def arch_spec(meta: dict[str, Any]) -> tuple[str, ArchSpec]:
    arch = str(meta.get("general.architecture", ""))
    if arch not in ARCHS:
        raise ModelFormatError(f"unsupported GGUF architecture {arch!r} (supported: {', '.join(ARCHS)})")
    return arch, ARCHS[arch]


def base_config(meta: dict[str, Any], p: str, spec: ArchSpec, vocab_size: int, tied: bool) -> dict[str, Any]:
    """The keys every family shares (rule 10): sizes, norms eps, RoPE base, context, stops."""
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "hidden_size": int(num(meta, p + "embedding_length")),
        "num_hidden_layers": int(num(meta, p + "block_count")),
        "rms_norm_eps": float(num(meta, p + "attention.layer_norm_rms_epsilon",
                                  meta.get(p + "attention.layer_norm_epsilon", 1e-5))),
        "rope_theta": float(num(meta, p + "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(num(meta, p + "context_length", 2048)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
    }
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        config["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    stops = end_of_generation_ids(meta)
    if stops:  # mlx-lm stops on any of them
        config["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    return config


def _attention(meta: dict[str, Any], p: str, config: dict[str, Any]) -> None:
    """The llama-like keys: one head count, one FFN width for every layer."""
    heads = int(num(meta, p + "attention.head_count"))
    config.update(intermediate_size=int(num(meta, p + "feed_forward_length")), num_attention_heads=heads,
                  num_key_value_heads=int(num(meta, p + "attention.head_count_kv", heads)),
                  head_dim=int(num(meta, p + "attention.key_length", config["hidden_size"] // heads)))


# Token texts llama.cpp treats as end of generation whatever the metadata says (llama-vocab.cpp)
EOG_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<end_of_turn>",
                       "<|endoftext|>", "<|eom_id|>", "<EOT>", "_<EOT>", "<|end_of_text|>",
                       "<end_of_utterance>"})


def end_of_generation_ids(meta: dict[str, Any]) -> list[int]:
    """Rule 9: EOS, EOT, EOM ids from the metadata, then every EOG_TEXTS token in the vocab."""
    stops: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        if meta.get("tokenizer.ggml." + key) is not None and int(meta["tokenizer.ggml." + key]) not in stops:
            stops.append(int(meta["tokenizer.ggml." + key]))
    tokens = meta.get("tokenizer.ggml.tokens") or []
    stops += [i for i, text in enumerate(tokens) if text in EOG_TEXTS and i not in stops]
    return stops


def _gemma_attn_scalar(config: dict[str, Any], big_layers: int) -> int | float:
    """Rule 7: head_dim, or hidden / heads for the 27B models (an int where whole:
    transformers' Gemma configs insist)."""
    if config["num_hidden_layers"] == big_layers:
        scalar = config["hidden_size"] / config["num_attention_heads"]
        return int(scalar) if scalar == int(scalar) else scalar
    return int(config["head_dim"])


def _extras_llama(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config["attention_bias"] = any(n.endswith("attn_q.bias") for n in names)
    config["mlp_bias"] = any(n.endswith("ffn_up.bias") for n in names)


def _extras_qwen3moe(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config.update(num_experts=int(num(meta, p + "expert_count")),
                  num_experts_per_tok=int(num(meta, p + "expert_used_count")),
                  moe_intermediate_size=int(num(meta, p + "expert_feed_forward_length")),
                  decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)


def _extras_gemma2(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config.update(attn_logit_softcapping=float(num(meta, p + "attn_logit_softcapping", 50.0)),
                  final_logit_softcapping=float(num(meta, p + "final_logit_softcapping", 30.0)),
                  query_pre_attn_scalar=_gemma_attn_scalar(config, 46))


def _extras_gemma3(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config.update(query_pre_attn_scalar=_gemma_attn_scalar(config, 62),
                  sliding_window=int(num(meta, p + "attention.sliding_window", 512)),
                  sliding_window_pattern=6,
                  rope_local_base_freq=float(num(meta, p + "rope.freq_base_swa", 10000.0)))


def _extras_phi3(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    rotary = int(num(meta, p + "rope.dimension_count", config["head_dim"]))
    config["partial_rotary_factor"] = rotary / config["head_dim"]
    scaling = config.get("rope_scaling")
    if scaling and scaling["type"] == "longrope":
        config["original_max_position_embeddings"] = scaling["original_max_position_embeddings"]


_EXTRAS: dict[str, Callable[[dict[str, Any], str, dict[str, Any], set[str]], None]] = {
    "llama": _extras_llama, "mistral": _extras_llama, "qwen3moe": _extras_qwen3moe,
    "gemma2": _extras_gemma2, "gemma3": _extras_gemma3, "phi3": _extras_phi3,
}


def build_config(meta: dict[str, Any], arch: str, spec: ArchSpec, names: set[str],
                 vocab_size: int, rope: dict[str, np.ndarray]) -> dict[str, Any]:
    """mlx-lm config.json for this GGUF; `names` are its tensor names, `rope` its rope tensors."""
    p = arch + "."
    config = base_config(meta, p, spec, vocab_size, tied="output.weight" not in names)
    if spec.config is not None:  # rule 10
        spec.config(meta, p, config, names, rope)
        return config
    _attention(meta, p, config)
    scaling = rope_scaling(meta, p, rope, config["max_position_embeddings"])
    if scaling is not None:
        config["rope_scaling"] = scaling
    if arch in _EXTRAS:
        _EXTRAS[arch](meta, p, config, names)
    return config


def map_names(spec: ArchSpec, num_layers: int, gguf_names: list[str],
              layout: ModelLayout) -> tuple[dict[str, str], list[str]]:
    """GGUF tensor name -> mlx-lm parameter name by inverting the gguf package's map, and
    the names left unplaced (a family's plan hook may claim them).

    Several HF names can share one GGUF name (ffn_norm is llama's post_attention_layernorm
    but gemma2's pre_feedforward_layernorm); candidates are narrowed to the model's own
    parameters, then names another tensor claims outright are struck (repeat until stable).
    """
    import gguf

    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[spec.gguf_arch]
    inverted: dict[str, set[str]] = {}
    for hf, (_, gname) in gguf.get_tensor_name_map(arch_enum, num_layers).mapping.items():
        inverted.setdefault(gname, set()).add(spec.prefix + hf)
    candidates: dict[str, set[str]] = {}
    for name in gguf_names:
        base, _, suffix = name.rpartition(".")
        found = {f"{hf}.{suffix}" for hf in inverted.get(base, ())}
        found |= inverted.get(name, set()) | inverted.get(base, set())  # rule 11
        candidates[name] = {_renamed(hf, spec.renames) for hf in found} & layout.shapes.keys()
    settled: dict[str, str] = {}
    while True:
        newly = {n: next(iter(c)) for n, c in candidates.items() if len(c) == 1 and n not in settled}
        if not newly:
            break
        settled.update(newly)
        taken = set(settled.values())
        for n, c in candidates.items():
            if n not in settled:
                c -= taken
    return settled, [n for n in gguf_names if n not in settled]


def _renamed(hf: str, renames: tuple[tuple[str, str], ...]) -> str:
    for old, new in renames:
        hf = hf.replace(old, new)
    return hf


def plans_for(spec: ArchSpec, config: dict[str, Any], gguf_names: list[str],
              layout: ModelLayout) -> dict[str, Plan]:
    """Every mlx-lm parameter's plan: the name map, rules 1-2, then the family's hook."""
    gguf_names = [n for n in gguf_names if not any(frag in n for frag in spec.skip)]
    mapping, unplaced = map_names(spec, config["num_hidden_layers"], gguf_names, layout)
    plans: dict[str, Plan] = {}
    for gname, hf in mapping.items():
        plan = plans[hf] = Plan((gname,))
        module = hf.rpartition(".")[0]
        if spec.norm_shift and module.endswith("norm"):  # rule 2
            plan.values = _minus(spec.norm_shift)
        if spec.permute_qk and module.endswith((".q_proj", ".k_proj")):  # rule 1
            heads = config["num_attention_heads" if module.endswith(".q_proj") else "num_key_value_heads"]
            plan.rows = inverse_permute_rows(layout.shapes[hf][0], heads)
    if spec.plan is not None:
        spec.plan(plans, unplaced, config, layout)
    if unplaced:
        raise ModelFormatError(
            f"GGUF tensors with no place in mlx-lm's {spec.model_type} model: {', '.join(unplaced[:8])}"
            + (f" (+{len(unplaced) - 8} more)" if len(unplaced) > 8 else ""))
    return plans


def _minus(shift: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda values: values - np.float32(shift)


def missing_params(plans: dict[str, Plan], layout: ModelLayout, tied: bool) -> list[str]:
    return [n for n in layout.shapes if n not in plans and not (tied and n.endswith("lm_head.weight"))]
