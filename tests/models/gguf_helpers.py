"""Write tiny llama GGUFs the way llama.cpp's converter does, for import tests.

An HF-layout MLX checkpoint (from conftest.make_tiny_llama) becomes a GGUF:
tensors renamed to GGUF names, Q/K rows permuted into the interleaved rotary
layout (llama.cpp `convert_hf_to_gguf.py` `permute`), tokenizer.ggml.* metadata
from tokenizer.json. F32/F16 files go through `mx.save_gguf`; quantized ones
through the `gguf` package (llama.cpp's own Python writer and quantizers).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import mlx.core as mx

LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
         "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
         "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm",
         "post_attention_layernorm": "ffn_norm"}
TOP = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def permute(w: mx.array, n_head: int) -> mx.array:
    rows, cols = w.shape
    return w.reshape(n_head, 2, rows // n_head // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def gguf_name(hf: str) -> str:
    module, leaf = hf.rsplit(".", 1)
    if module.startswith("model.layers."):
        _, _, n, rest = module.split(".", 3)
        return f"blk.{n}.{LAYER[rest]}.{leaf}"
    return f"{TOP[module]}.{leaf}"


def gguf_tensors(ckpt: Path) -> dict[str, mx.array]:
    config = json.loads((ckpt / "config.json").read_text())
    out = {}
    for name, value in mx.load(str(ckpt / "model.safetensors")).items():
        if name.endswith("q_proj.weight"):
            value = permute(value, config["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            value = permute(value, config["num_key_value_heads"])
        out[gguf_name(name)] = value
    return out


def u32(v: int) -> mx.array:
    return mx.array(v, dtype=mx.uint32)


def f32(v: float) -> mx.array:
    return mx.array(v, dtype=mx.float32)


def gguf_metadata(ckpt: Path, *, arch: str = "llama", pre: str = "gpt2",
                  tokenizer_model: str = "gpt2", add_bos: bool | None = None) -> dict[str, Any]:
    config = json.loads((ckpt / "config.json").read_text())
    tok = json.loads((ckpt / "tokenizer.json").read_text())
    tok_config = json.loads((ckpt / "tokenizer_config.json").read_text())
    vocab: dict[str, int] = tok["model"]["vocab"]
    tokens = sorted(vocab, key=vocab.__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    specials = {a["id"] for a in tok["added_tokens"] if a["special"]}
    p = arch + "."
    extra = {} if add_bos is None else {"tokenizer.ggml.add_bos_token": mx.array(add_bos)}
    return {
        **extra,
        "general.architecture": arch,
        "general.name": "tiny",
        p + "context_length": u32(config["max_position_embeddings"]),
        p + "embedding_length": u32(config["hidden_size"]),
        p + "block_count": u32(config["num_hidden_layers"]),
        p + "feed_forward_length": u32(config["intermediate_size"]),
        p + "attention.head_count": u32(config["num_attention_heads"]),
        p + "attention.head_count_kv": u32(config["num_key_value_heads"]),
        p + "rope.dimension_count": u32(config["hidden_size"] // config["num_attention_heads"]),
        p + "rope.freq_base": f32(config["rope_theta"]),
        p + "attention.layer_norm_rms_epsilon": f32(config["rms_norm_eps"]),
        "tokenizer.ggml.model": tokenizer_model,
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": mx.array([3 if i in specials else 1 for i in range(len(tokens))],
                                              dtype=mx.int32),
        "tokenizer.ggml.bos_token_id": u32(config["bos_token_id"]),
        "tokenizer.ggml.eos_token_id": u32(config["eos_token_id"]),
        "tokenizer.chat_template": tok_config["chat_template"],
    }


def write_float_gguf(ckpt: Path, out: Path, dtype: mx.Dtype = mx.float32, **meta_kw: Any) -> Path:
    """F32 or F16 (2-D weights only; norms stay F32 like llama.cpp) via mx.save_gguf."""
    tensors = {k: (v.astype(dtype) if v.ndim == 2 else v) for k, v in gguf_tensors(ckpt).items()}
    mx.save_gguf(str(out), tensors, gguf_metadata(ckpt, **meta_kw))
    return out


def write_metadata(writer: Any, meta: dict[str, Any]) -> None:
    """gguf_metadata()-style values (str, list, 0-d/1-d mx arrays) into a gguf.GGUFWriter."""
    for key, value in meta.items():
        if key == "general.architecture":
            continue
        if isinstance(value, str):
            writer.add_string(key, value)
        elif isinstance(value, list):
            writer.add_array(key, value)
        elif value.ndim == 1:
            writer.add_array(key, [int(x) for x in value.tolist()])
        elif value.dtype == mx.uint32:
            writer.add_uint32(key, int(value.item()))
        else:
            writer.add_float32(key, float(value.item()))


def add_packed(writer: Any, name: str, packed: Any, qtype: Any, shape: tuple[int, ...]) -> Any:
    """Add raw `qtype` blocks; return the gguf package's own dequantization (the reference)."""
    import gguf

    writer.add_tensor(name, packed, raw_dtype=qtype)
    return gguf.quants.dequantize(packed, qtype).reshape(shape)


def close_writer(writer: Any) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_quantized_gguf(ckpt: Path, out: Path, qtypes: dict[str, str]) -> tuple[Path, dict[str, Any]]:
    """Quantize 2-D tensors with the gguf package; qtypes maps a GGUF name fragment
    ("token_embd", "attn_q", ...) to "Q4_0" / "Q4_1" / "Q8_0" (others stay F32).

    Returns (path, {gguf name: float32 numpy weight as llama.cpp would dequantize it}).
    """
    import gguf
    import numpy as np

    meta = gguf_metadata(ckpt)
    writer = gguf.GGUFWriter(str(out), arch=meta["general.architecture"])
    write_metadata(writer, meta)
    reference = {}
    for name, value in gguf_tensors(ckpt).items():
        array = np.array(value, dtype=np.float32)
        qname = next((q for frag, q in qtypes.items() if frag in name), None)
        if qname is None or array.ndim != 2:
            writer.add_tensor(name, array)
            reference[name] = array
            continue
        qtype = getattr(gguf.GGMLQuantizationType, qname)
        reference[name] = add_packed(writer, name, gguf.quants.quantize(array, qtype), qtype, array.shape)
    close_writer(writer)
    return out, reference


def patch_tensor_type(path: Path, tensor: str, ggml_type: int) -> None:
    """Rewrite one tensor's ggml type id in the header (to fake e.g. a Q4_K tensor)."""
    data = bytearray(path.read_bytes())
    name = tensor.encode()
    at = data.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    n_dims = int.from_bytes(data[at:at + 4], "little")
    at += 4 + 8 * n_dims
    data[at:at + 4] = ggml_type.to_bytes(4, "little")
    path.write_bytes(bytes(data))
