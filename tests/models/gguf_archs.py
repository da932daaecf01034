"""Tiny random checkpoints of every GGUF architecture we import, written twice:
as an MLX checkpoint (mlx-lm's own layout) and as a GGUF the way llama.cpp's
converter writes it, so import tests can compare the two.

The GGUF side uses the `gguf` package only: its writer, its forward name map
(`get_tensor_name_map(...).get_name`), its quantizers where it has them. For
types it cannot quantize (K-quants, IQ codebooks) `random_blocks` writes random
raw blocks with the scale fields set so the dequantized weights have std ~0.2;
tests then compare against the package's own dequantization of those blocks.

Converter quirks reproduced here (llama.cpp `convert_hf_to_gguf.py`): llama Q/K
rows permuted into the interleaved rotary layout; gemma norms stored plus 1;
qwen3moe experts under HF's merged `mlp.experts.*` names; phi3's fused tensors
kept fused; Llama-3.1 rope scaling as a `rope_freqs` tensor, phi3's longrope as
`rope_factors_long/short` tensors, YaRN as `rope.scaling.*` metadata.
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from conftest import CHATML_TEMPLATE, make_tiny_llama
from gguf_helpers import add_packed, close_writer, gguf_metadata, permute, write_metadata
from mlx.utils import tree_flatten

BASE = {"hidden_size": 256, "num_hidden_layers": 2, "intermediate_size": 512, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
            "max_position_embeddings": 512, "tie_word_embeddings": True}
# test name -> (GGUF architecture, mlx-lm config overrides)
ARCHS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("llama", {"model_type": "llama"}),
    "llama31": ("llama", {"model_type": "llama", "tie_word_embeddings": False, "rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}}),
    "mistral": ("mistral", {"model_type": "llama", "tie_word_embeddings": False}),
    "qwen2": ("qwen2", {"model_type": "qwen2"}),
    "qwen3": ("qwen3", {"model_type": "qwen3"}),
    "qwen3yarn": ("qwen3", {"model_type": "qwen3", "rope_scaling": {
        "type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128}}),
    "qwen3moe": ("qwen3moe", {
        "model_type": "qwen3_moe", "num_experts": 4, "num_experts_per_tok": 2,
        "moe_intermediate_size": 256, "decoder_sparse_step": 1, "mlp_only_layers": [],
        "norm_topk_prob": True, "tie_word_embeddings": False}),
    "gemma2": ("gemma2", {
        "model_type": "gemma2", "query_pre_attn_scalar": 64, "attn_logit_softcapping": 50.0,
        "final_logit_softcapping": 30.0, "rms_norm_eps": 1e-6}),
    "gemma3": ("gemma3", {
        "model_type": "gemma3_text", "query_pre_attn_scalar": 64, "sliding_window": 8,
        "num_hidden_layers": 6,  # mlx-lm indexes the 6th (global) layer
        "sliding_window_pattern": 6, "rope_local_base_freq": 10000.0, "rope_theta": 1e6}),
    "phi3": ("phi3", {"model_type": "phi3", "tie_word_embeddings": False, "partial_rotary_factor": 1.0,
                      "original_max_position_embeddings": 512}),
    "phi3long": ("phi3", {
        "model_type": "phi3", "tie_word_embeddings": False, "partial_rotary_factor": 1.0,
        "original_max_position_embeddings": 128, "rope_scaling": {
            "type": "longrope", "long_factor": [1.0 + i / 4 for i in range(32)],
            "short_factor": [1.0 + i / 16 for i in range(32)]}}),
}
NORM_SHIFT = {"gemma2": 1.0, "gemma3": 1.0}


def make_arch_checkpoint(name: str, path: Path, seed: int = 0) -> Path:
    """An MLX checkpoint of test architecture `name` with random weights (norms random too)."""
    _, overrides = ARCHS[name]
    ckpt = make_tiny_llama(path, seed=seed)  # tokenizer files + a config we replace
    config = {**json.loads((ckpt / "config.json").read_text()), **BASE, **overrides}
    config.pop("architectures", None)
    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    model = module.Model(module.ModelArgs.from_dict(config))
    rng = np.random.default_rng(seed)
    weights = {}
    for key, value in tree_flatten(model.parameters()):
        scale = 0.1 if key.endswith("norm.weight") else 0.2
        array = rng.standard_normal(value.shape).astype(np.float32) * scale
        if key.endswith("norm.weight") and name not in NORM_SHIFT:
            array += 1.0
        weights[key] = mx.array(array)
    if config.get("tie_word_embeddings", True):
        weights.pop("lm_head.weight", None)
    mx.save_safetensors(str(ckpt / "model.safetensors"), weights, metadata={"format": "mlx"})
    (ckpt / "config.json").write_text(json.dumps(config, indent=2))
    return ckpt


def llama3_rope_factors(config: dict[str, Any]) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs.weight for rope_type llama3."""
    s = config["rope_scaling"]
    dim = config["head_dim"]
    freqs = 1.0 / (config["rope_theta"] ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    low_wl = s["original_max_position_embeddings"] / s["low_freq_factor"]
    high_wl = s["original_max_position_embeddings"] / s["high_freq_factor"]
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wl:
            factors.append(1.0)
        elif wavelen > low_wl:
            factors.append(s["factor"])
        else:
            smooth = (s["original_max_position_embeddings"] / wavelen - s["low_freq_factor"]) / (
                s["high_freq_factor"] - s["low_freq_factor"])
            factors.append(1 / ((1 - smooth) / s["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


# ggml type -> byte offsets of the float16 scale fields inside one block (random_blocks)
SCALE_FIELDS = {"Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208,),
                "IQ4_NL": (0,), "IQ4_XS": (0,), "IQ2_XXS": (0,), "IQ2_XS": (0,), "IQ2_S": (0,),
                "IQ3_XXS": (0,), "IQ3_S": (0,), "IQ1_S": (0,), "TQ1_0": (52,), "TQ2_0": (64,)}


def _set_scales(blocks: np.ndarray, qname: str, value: float) -> None:
    if qname == "NVFP4":  # four UE4M3 sub-block scales open each block
        import gguf

        code = np.asarray(gguf.quants.NVFP4.fp32_to_ue4m3(np.full(4, value, dtype=np.float32)))
        blocks[:, 0:4] = code.astype(np.uint8)
        return
    bits = np.array([value], dtype=np.float16).view(np.uint16)[0]
    if qname == "IQ1_M":  # its f16 scale is spread over the top nibbles of four u16s at byte 48
        words = blocks[:, 48:56].copy().view(np.uint16)
        for i in range(4):
            words[:, i] = (words[:, i] & 0x0FFF) | (((int(bits) >> (4 * i)) & 0xF) << 12)
        blocks[:, 48:56] = words.view(np.uint8)
        return
    for at in SCALE_FIELDS[qname]:
        blocks[:, at:at + 2] = np.array([bits], dtype=np.uint16).view(np.uint8)


def random_blocks(qname: str, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random raw blocks of `qname` for a float tensor of `shape`, std of the values ~0.2."""
    import gguf

    qtype = gguf.GGMLQuantizationType[qname]
    block, nbytes = gguf.GGML_QUANT_SIZES[qtype]
    rows = int(np.prod(shape[:-1]))
    blocks = rng.integers(0, 256, size=(rows * shape[-1] // block, nbytes), dtype=np.uint8)
    _set_scales(blocks, qname, 1.0)
    std = float(gguf.quants.dequantize(blocks, qtype).std()) or 1.0
    _set_scales(blocks, qname, 0.2 / std)
    return blocks.reshape(*shape[:-1], shape[-1] // block * nbytes)


def _gguf_tensor_name(tmap: Any, hf: str) -> str:
    hf = hf.replace(".mlp.switch_mlp.", ".mlp.experts.")
    name = tmap.get_name(hf, try_suffixes=(".weight", ".bias"))
    assert name is not None, hf
    return name


def gguf_tensors_for(name: str, ckpt: Path) -> dict[str, np.ndarray]:
    """Float32 tensors under GGUF names, converted like llama.cpp does (module docstring)."""
    import gguf

    arch, _ = ARCHS[name]
    config = json.loads((ckpt / "config.json").read_text())
    arch_enum = {v: k for k, v in gguf.MODEL_ARCH_NAMES.items()}["llama" if arch == "mistral" else arch]
    tmap = gguf.get_tensor_name_map(arch_enum, config["num_hidden_layers"])
    out = {}
    for hf, value in mx.load(str(ckpt / "model.safetensors")).items():
        array = np.array(value, dtype=np.float32)
        if arch in ("llama", "mistral") and ("q_proj" in hf or "k_proj" in hf):
            heads = config["num_attention_heads" if "q_proj" in hf else "num_key_value_heads"]
            array = np.array(permute(mx.array(array), heads))
        if hf.endswith("norm.weight"):
            array = array + NORM_SHIFT.get(arch, 0.0)
        out[_gguf_tensor_name(tmap, hf)] = array
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        out["rope_freqs.weight"] = llama3_rope_factors(config)
    if scaling.get("type") == "longrope":
        out["rope_factors_long.weight"] = np.array(scaling["long_factor"], dtype=np.float32)
        out["rope_factors_short.weight"] = np.array(scaling["short_factor"], dtype=np.float32)
    return out


def _arch_metadata(writer: Any, arch: str, config: dict[str, Any]) -> None:
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_head_count_kv(config["num_key_value_heads"])
    writer.add_key_length(config["head_dim"])
    writer.add_value_length(config["head_dim"])
    writer.add_rope_dimension_count(config["head_dim"])
    writer.add_layer_norm_rms_eps(config["rms_norm_eps"])
    writer.add_rope_freq_base(config["rope_theta"])
    if arch == "qwen3moe":
        writer.add_expert_count(config["num_experts"])
        writer.add_expert_used_count(config["num_experts_per_tok"])
        writer.add_expert_feed_forward_length(config["moe_intermediate_size"])
    if arch == "gemma2":
        writer.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        writer.add_final_logit_softcapping(config["final_logit_softcapping"])
        writer.add_sliding_window(4096)
    if arch == "gemma3":
        writer.add_sliding_window(config["sliding_window"])
    scaling = config.get("rope_scaling") or {}
    if scaling.get("type") == "yarn":
        import gguf

        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(scaling["factor"])
        writer.add_rope_scaling_orig_ctx_len(scaling["original_max_position_embeddings"])
    if scaling.get("type") == "longrope":
        writer.add_rope_scaling_orig_ctx_len(config["original_max_position_embeddings"])


def write_arch_gguf(name: str, ckpt: Path, out: Path, qtype: str = "F32",
                    seed: int = 1) -> tuple[Path, dict[str, np.ndarray]]:
    """Write `ckpt` as a GGUF whose matrices are `qtype`; returns (path, {GGUF name: the gguf
    package's dequantization of what was written}), the reference for weight comparisons."""
    import gguf

    arch, _ = ARCHS[name]
    config = json.loads((ckpt / "config.json").read_text())
    writer = gguf.GGUFWriter(str(out), arch=arch)
    _arch_metadata(writer, arch, config)
    write_metadata(writer, {k: v for k, v in gguf_metadata(ckpt).items() if k.startswith("tokenizer.")})
    rng = np.random.default_rng(seed)
    reference = {}
    for gname, array in gguf_tensors_for(name, ckpt).items():
        matrix = array.ndim >= 2 and "ffn_gate_inp" not in gname
        if qtype == "F32" or not matrix:
            writer.add_tensor(gname, array)
            reference[gname] = array
            continue
        kind = gguf.GGMLQuantizationType[qtype]
        if qtype in SCALE_FIELDS or qtype in ("IQ1_M", "NVFP4"):
            packed = random_blocks(qtype, array.shape, rng)
        else:
            packed = gguf.quants.quantize(array, kind)
        reference[gname] = add_packed(writer, gname, packed, kind, array.shape)
    close_writer(writer)
    return out, reference


__all__ = ["ARCHS", "CHATML_TEMPLATE", "make_arch_checkpoint", "random_blocks", "write_arch_gguf"]
