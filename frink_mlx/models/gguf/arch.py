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
6. RoPE: linear scaling and YaRN map onto mlx-lm's `rope_scaling`. Llama-3.1's
   `rope_freqs.weight` holds one divisor per rotary frequency, applied at every
   position (llama.cpp); mlx-lm's "longrope" with long = short = those factors and
   original = trained context is exactly that (its extra input scale is 1 when
   the two lengths are equal). phi3's `rope_factors_long/short` are longrope itself.
7. gemma2/3 attention scale: llama.cpp uses 1/sqrt(head_dim), except the 27B
   models (46 / 62 layers) use 1/sqrt(hidden / heads); `query_pre_attn_scalar` says so.
   gemma3's local layers use base 10000 and every 6th layer is global, as in llama.cpp.
8. Vision-tower and projector tensors (`v.*`, `mm.*`, as in Ollama's gemma3 blobs)
   are skipped: the text model is served on its own.
9. Stop tokens are llama.cpp's end-of-generation set: EOS, EOT, EOM, plus any
   token spelled like a known turn end (`<|im_end|>`, `<end_of_turn>`, phi3's
   `<|end|>`, ...), which GGUFs often leave out of the metadata (phi3's EOS is
   `<|endoftext|>` while its turns end with `<|end|>`).
Left out: gemma2's 4096 sliding window (mlx-lm's gemma2 file has none; it only
matters past 4096 tokens), phi3's sliding window (likewise ignored by mlx-lm).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...errors import ModelFormatError

ROPE_TENSORS = ("rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight")
# Vision towers and projectors some GGUFs carry beside the text model (Ollama's gemma3): skipped.
MULTIMODAL_PREFIXES = ("v.", "mm.")


@dataclass(slots=True, frozen=True)
class ArchSpec:
    model_type: str  # mlx-lm model file
    gguf_arch: str  # the gguf package's name map to invert
    permute_qk: bool = False  # rule 1
    norm_shift: float = 0.0  # rule 2
    renames: tuple[tuple[str, str], ...] = ()  # rule 3


ARCHS = {
    "llama": ArchSpec("llama", "llama", permute_qk=True),
    "mistral": ArchSpec("llama", "llama", permute_qk=True),
    "qwen2": ArchSpec("qwen2", "qwen2"),
    "qwen3": ArchSpec("qwen3", "qwen3"),
    "qwen3moe": ArchSpec("qwen3_moe", "qwen3moe", renames=((".mlp.experts.", ".mlp.switch_mlp."),)),
    "gemma2": ArchSpec("gemma2", "gemma2", norm_shift=1.0),
    "gemma3": ArchSpec("gemma3_text", "gemma3", norm_shift=1.0),
    "phi3": ArchSpec("phi3", "phi3"),
}


def arch_spec(meta: dict[str, Any]) -> tuple[str, ArchSpec]:
    arch = str(meta.get("general.architecture", ""))
    if arch not in ARCHS:
        raise ModelFormatError(f"unsupported GGUF architecture {arch!r} (supported: {', '.join(ARCHS)})")
    return arch, ARCHS[arch]


def _num(meta: dict[str, Any], key: str, default: Any = None) -> Any:
    value = meta.get(key, default)
    if value is None:
        raise ModelFormatError(f"GGUF metadata is missing {key}")
    if isinstance(value, np.ndarray):  # per-layer arrays: one value or refuse
        if value.size == 0 or not (value == value.flat[0]).all():
            raise ModelFormatError(f"GGUF metadata {key} varies per layer, which mlx-lm cannot express")
        value = value.flat[0].item()
    return value


def _common(meta: dict[str, Any], p: str, spec: ArchSpec, vocab_size: int, tied: bool) -> dict[str, Any]:
    hidden, heads = int(_num(meta, p + "embedding_length")), int(_num(meta, p + "attention.head_count"))
    config: dict[str, Any] = {
        "model_type": spec.model_type,
        "hidden_size": hidden,
        "num_hidden_layers": int(_num(meta, p + "block_count")),
        "intermediate_size": int(_num(meta, p + "feed_forward_length")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(_num(meta, p + "attention.head_count_kv", heads)),
        "head_dim": int(_num(meta, p + "attention.key_length", hidden // heads)),
        "rms_norm_eps": float(_num(meta, p + "attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(_num(meta, p + "rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_num(meta, p + "context_length", 2048)),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
    }
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        config["bos_token_id"] = int(meta["tokenizer.ggml.bos_token_id"])
    stops = end_of_generation_ids(meta)
    if stops:  # mlx-lm stops on any of them
        config["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    return config


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


def _rope_scaling(meta: dict[str, Any], p: str, rope: dict[str, np.ndarray],
                  context: int) -> dict[str, Any] | None:
    """Rule 6."""
    kind = str(meta.get(p + "rope.scaling.type") or "none")
    factor = float(_num(meta, p + "rope.scaling.factor", 1.0))
    original = int(_num(meta, p + "rope.scaling.original_context_length", context))
    if "rope_factors_long.weight" in rope:
        long = rope["rope_factors_long.weight"].tolist()
        short = rope.get("rope_factors_short.weight", rope["rope_factors_long.weight"]).tolist()
        return {"type": "longrope", "long_factor": long, "short_factor": short,
                "original_max_position_embeddings": original}
    if "rope_freqs.weight" in rope:
        factors = rope["rope_freqs.weight"].tolist()
        return {"type": "longrope", "long_factor": factors, "short_factor": factors,
                "original_max_position_embeddings": context}
    if kind in ("none", "") or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": factor}
    if kind == "yarn":
        scaling = {"type": "yarn", "factor": factor, "original_max_position_embeddings": original}
        for key in ("beta_fast", "beta_slow"):
            if meta.get(f"{p}rope.scaling.yarn_{key}") is not None:
                scaling[key] = float(_num(meta, f"{p}rope.scaling.yarn_{key}"))
        return scaling
    raise ModelFormatError(f"unsupported GGUF RoPE scaling {p}rope.scaling.type={kind!r} "
                           "(supported: linear, yarn, llama3 rope_freqs, phi3 longrope)")


def _gemma_attn_scalar(config: dict[str, Any], big_layers: int) -> int | float:
    """Rule 7 (an int where whole: transformers' Gemma configs insist)."""
    if config["num_hidden_layers"] == big_layers:
        scalar = config["hidden_size"] / config["num_attention_heads"]
        return int(scalar) if scalar == int(scalar) else scalar
    return int(config["head_dim"])


def _extras_llama(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config["attention_bias"] = any(n.endswith("attn_q.bias") for n in names)
    config["mlp_bias"] = any(n.endswith("ffn_up.bias") for n in names)


def _extras_qwen3moe(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config.update(num_experts=int(_num(meta, p + "expert_count")),
                  num_experts_per_tok=int(_num(meta, p + "expert_used_count")),
                  moe_intermediate_size=int(_num(meta, p + "expert_feed_forward_length")),
                  decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True)


def _extras_gemma2(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config.update(attn_logit_softcapping=float(_num(meta, p + "attn_logit_softcapping", 50.0)),
                  final_logit_softcapping=float(_num(meta, p + "final_logit_softcapping", 30.0)),
                  query_pre_attn_scalar=_gemma_attn_scalar(config, 46))


def _extras_gemma3(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    config.update(query_pre_attn_scalar=_gemma_attn_scalar(config, 62),
                  sliding_window=int(_num(meta, p + "attention.sliding_window", 512)),
                  sliding_window_pattern=6,
                  rope_local_base_freq=float(_num(meta, p + "rope.freq_base_swa", 10000.0)))


def _extras_phi3(meta: dict[str, Any], p: str, config: dict[str, Any], names: set[str]) -> None:
    rotary = int(_num(meta, p + "rope.dimension_count", config["head_dim"]))
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
    config = _common(meta, p, spec, vocab_size, tied="output.weight" not in names)
    scaling = _rope_scaling(meta, p, rope, config["max_position_embeddings"])
    if scaling is not None:
        config["rope_scaling"] = scaling
    if arch in _EXTRAS:
        _EXTRAS[arch](meta, p, config, names)
    return config


@dataclass(slots=True)
class ModelLayout:
    """What the mlx-lm model expects: parameter shapes and the modules that can be quantized."""

    shapes: dict[str, tuple[int, ...]]
    quantizable: set[str]


def model_layout(config: dict[str, Any]) -> ModelLayout:
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    try:
        model = module.Model(module.ModelArgs.from_dict(config))
    except (TypeError, ValueError, KeyError, AssertionError) as exc:
        raise ModelFormatError(
            f"GGUF metadata does not make a valid {config['model_type']} model: {exc}") from None
    flat: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return ModelLayout(shapes={name: tuple(v.shape) for name, v in flat},
                       quantizable={name for name, m in model.named_modules() if hasattr(m, "to_quantized")})


def map_names(spec: ArchSpec, num_layers: int, gguf_names: list[str], layout: ModelLayout) -> dict[str, str]:
    """GGUF tensor name -> mlx-lm parameter name, by inverting the gguf package's map.

    Several HF names can share one GGUF name (ffn_norm is llama's post_attention_layernorm
    but gemma2's pre_feedforward_layernorm); candidates are narrowed to the model's own
    parameters, then names another tensor claims outright are struck (repeat until stable).
    """
    import gguf

    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}[spec.gguf_arch]
    inverted: dict[str, set[str]] = {}
    for hf, (_, gname) in gguf.get_tensor_name_map(arch_enum, num_layers).mapping.items():
        for old, new in spec.renames:
            hf = hf.replace(old, new)
        inverted.setdefault(gname, set()).add(hf)
    candidates: dict[str, set[str]] = {}
    for name in gguf_names:
        base, _, suffix = name.rpartition(".")
        candidates[name] = {f"{hf}.{suffix}" for hf in inverted.get(base, ())} & layout.shapes.keys()
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
    unplaced = [n for n in gguf_names if n not in settled]
    if unplaced:
        raise ModelFormatError(
            f"GGUF tensors with no place in mlx-lm's {spec.model_type} model: {', '.join(unplaced[:8])}"
            + (f" (+{len(unplaced) - 8} more)" if len(unplaced) > 8 else ""))
    return settled


def missing_params(mapping: dict[str, str], layout: ModelLayout, tied: bool) -> list[str]:
    have = set(mapping.values())
    return [n for n in layout.shapes if n not in have and not (tied and n.startswith("lm_head."))]


def inverse_permute_rows(num_rows: int, num_heads: int) -> np.ndarray:
    """Rule 1: index array taking GGUF's interleaved rotary rows back to HF's halves layout.

        GGUF row (head h, pair i, half j) = h*hd + 2*i + j  <-  HF row h*hd + j*hd/2 + i
    """
    head_dim = num_rows // num_heads
    return np.arange(num_rows).reshape(num_heads, head_dim // 2, 2).swapaxes(1, 2).reshape(-1)
