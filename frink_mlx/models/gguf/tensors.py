"""GGUF tensor types -> MLX arrays: float, or MLX affine quantization (weight, scales, biases).

Why: GGUF files carry llama.cpp's block formats (legacy Q4_0..Q8_0, K-quants,
IQ codebooks, ...); MLX serves one quantization scheme, affine groups along the
input dimension: w = scale * q + bias, q an unsigned `bits`-bit code, one
(scale, bias) per `group_size` weights (32, 64 or 128). Every conversion starts
from the `gguf` package's own reference dequantization (llama.cpp's Python
port), so what we serve is defined by llama.cpp's code, not by ours.

Rules:
1. Types whose blocks are already affine groups of 32 convert losslessly
   (EXACT_BITS): Q4_0 (s=d, b=-8d), Q4_1 (s=d, b=m), Q5_0 (s=d, b=-16d),
   Q5_1 (s=d, b=m), Q8_0 (s=d, b=-128d), Q4_K / Q5_K (s=d*sc_j, b=-dmin*m_j per
   32-weight sub-block). Scales and biases come from the block headers; the codes
   are recovered from the reference dequantization as round((w - b) / s), so the
   package's unpacking is the only unpacking.
2. Everything else the package can dequantize is re-quantized with
   `mx.quantize` at group size 32 (the smallest MLX allows) and the fewest
   bits that keep the re-quantization error well under the source format's own
   (REQUANT_BITS; relative RMS errors measured by benchmarks/gguf_requant_error.py):
   Q6_K -> 8 (at 6 bits the round trip would add about as much error as Q6_K
   itself has; its 16-weight sub-blocks have no 32-group equivalent and MLX has
   no group 16), Q3_K -> 5, Q2_K -> 4, IQ4 -> 6, IQ3/IQ2 -> 5, IQ1 -> 4,
   ternary/FP4 types -> 6. The tests bound each type's error against the
   reference dequantization.
3. Scales and biases are stored as float16, like mlx-lm's own quantized
   checkpoints (float32 if a value would overflow float16).
4. Bit packing is MLX's: codes form a little-endian bit stream per row,
   read as uint32 words (checked against `mx.dequantize` by the tests).
5. F32 stays float32, F16 float16, BF16 bfloat16. `as_float` (and any tensor
   whose module MLX cannot quantize, e.g. a norm) dequantizes to float32.
6. Integer tensor types (I8..I64, F64) and types the package cannot
   dequantize are unsupported; the importer lists them all in one refusal.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

GROUP_SIZE = 32
F32, F16, BF16 = 0, 1, 30
_FLOAT_DTYPES = {F32: "float32", F16: "float16", BF16: "bfloat16"}
_INTEGER_TYPES = {"I8", "I16", "I32", "I64", "F64"}

# ggml type name -> bits of the lossless affine form (rule 1).
EXACT_BITS = {"Q4_0": 4, "Q4_1": 4, "Q5_0": 5, "Q5_1": 5, "Q8_0": 8, "Q4_K": 4, "Q5_K": 5}
# ggml type name -> bits to re-quantize at (rule 2); types added to the package later get 6.
REQUANT_BITS = {"Q6_K": 8, "Q3_K": 5, "Q2_K": 4, "IQ4_NL": 6, "IQ4_XS": 6, "IQ3_XXS": 5, "IQ3_S": 5,
                "IQ2_XXS": 5, "IQ2_XS": 5, "IQ2_S": 5, "IQ1_S": 4, "IQ1_M": 4, "TQ1_0": 6, "TQ2_0": 6,
                "MXFP4": 6, "NVFP4": 6}
_F16_MAX = 65504.0


def _gguf() -> Any:
    import gguf

    return gguf


def type_name(ggml_type: int) -> str:
    try:
        return str(_gguf().GGMLQuantizationType(ggml_type).name)
    except ValueError:
        return f"type {ggml_type}"


def type_sizes() -> dict[int, tuple[int, int]]:
    """ggml type -> (block elements, block bytes) for every type the package knows."""
    return {int(t): sizes for t, sizes in _gguf().GGML_QUANT_SIZES.items()}


def supported_types() -> dict[int, str]:
    """ggml type -> name, for every type we convert (rule 6)."""
    g = _gguf()
    out = {}
    for t in g.GGMLQuantizationType:
        if t.name in _INTEGER_TYPES:
            continue
        if int(t) in _FLOAT_DTYPES or hasattr(g.quants, t.name):
            out[int(t)] = t.name
    return out


@dataclass(slots=True, frozen=True)
class Target:
    """What one tensor becomes: float (`bits` None, `dtype` its MLX dtype) or affine `bits`."""

    bits: int | None
    dtype: str = "float32"
    exact: bool = False

    @property
    def quantized(self) -> bool:
        return self.bits is not None


def target_for(ggml_type: int, *, quantizable: bool, as_float: bool) -> Target:
    if ggml_type in _FLOAT_DTYPES:
        return Target(None, "float32" if as_float else _FLOAT_DTYPES[ggml_type])
    if as_float or not quantizable:
        return Target(None)
    name = type_name(ggml_type)
    if name in EXACT_BITS:
        return Target(EXACT_BITS[name], exact=True)
    return Target(REQUANT_BITS.get(name, 6))


def dequantize(raw: np.ndarray, ggml_type: int, row_elements: int) -> np.ndarray:
    """The package's reference dequantization of raw rows -> float32 (rows, row_elements)."""
    g = _gguf()
    out = g.quants.dequantize(raw, g.GGMLQuantizationType(ggml_type))
    return np.asarray(out, dtype=np.float32).reshape(raw.shape[0], row_elements)


def float_rows(raw: np.ndarray, ggml_type: int, row_elements: int, dtype: str) -> np.ndarray:
    """Rule 5: F32/F16 rows reinterpret their bytes; BF16 stays bfloat16 as uint16 bits."""
    if dtype == "float16" and ggml_type == F16:
        return raw.view(np.float16).reshape(raw.shape[0], row_elements)
    if dtype == "bfloat16" and ggml_type == BF16:
        return raw.view(np.uint16).reshape(raw.shape[0], row_elements)
    return dequantize(raw, ggml_type, row_elements)


def _block_affine(raw: np.ndarray, name: str, groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Rule 1: per-32-group (scale, bias) of an exact type, from the block headers."""
    n_rows = raw.shape[0]
    if name in ("Q4_K", "Q5_K"):
        blocks = raw.reshape(-1, raw.shape[1] // (groups // 8))  # 256-weight super-blocks
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
        dmin = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
        sc, m = _gguf().quants.Q4_K.get_scale_min(blocks[:, 4:16].copy())
        scale = d * sc.astype(np.float32)
        bias = -dmin * m.astype(np.float32)
        return scale.reshape(n_rows, groups), bias.reshape(n_rows, groups)
    blocks = raw.reshape(n_rows * groups, raw.shape[1] // groups)
    d = blocks[:, 0:2].copy().view(np.float16).astype(np.float32)
    if name in ("Q4_1", "Q5_1"):
        bias = blocks[:, 2:4].copy().view(np.float16).astype(np.float32)
    else:
        bias = -d * {"Q4_0": 8.0, "Q5_0": 16.0, "Q8_0": 128.0}[name]
    return d.reshape(n_rows, groups), bias.reshape(n_rows, groups)


def pack_codes(codes: np.ndarray, bits: int) -> np.ndarray:
    """Rule 4: (rows, n) codes < 2**bits -> (rows, n * bits / 32) uint32, MLX's layout.

    Widths dividing 8 shift whole codes into bytes (read as little-endian words);
    3/5/6 bits go through a bit stream."""
    rows = codes.shape[0]
    codes = codes.astype(np.uint8, copy=False)
    if 8 % bits == 0:
        per_byte = 8 // bits
        grouped = codes.reshape(rows, -1, per_byte)
        packed = grouped[..., 0].copy()
        for j in range(1, per_byte):
            packed |= grouped[..., j] << np.uint8(j * bits)
        return np.ascontiguousarray(packed).view(np.uint32)
    planes = np.unpackbits(codes[..., None], axis=-1, bitorder="little")[..., :bits]
    return np.packbits(planes.reshape(rows, -1), axis=-1, bitorder="little").view(np.uint32)


def _scale_dtype(*arrays: np.ndarray) -> Any:
    """Rule 3: float16 scales and biases, float32 where a value would overflow float16."""
    peak = max(float(np.abs(a).max(initial=0.0)) for a in arrays)
    return np.float16 if peak < _F16_MAX else np.float32


def exact_affine(raw: np.ndarray, ggml_type: int, row_elements: int,
                 bits: int, reference: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rule 1: (packed weight, scales, biases) reproducing `reference` on MLX's grid."""
    groups = row_elements // GROUP_SIZE
    scale, bias = _block_affine(raw, type_name(ggml_type), groups)
    inverse = np.divide(1.0, scale, out=np.zeros_like(scale), where=scale != 0)  # s = 0: code 0
    codes = reference.reshape(raw.shape[0], groups, GROUP_SIZE) - bias[..., None]
    codes *= inverse[..., None]
    np.rint(codes, out=codes)
    np.clip(codes, 0, (1 << bits) - 1, out=codes)
    dtype = _scale_dtype(scale, bias)
    return (pack_codes(codes.reshape(raw.shape[0], row_elements), bits),
            scale.astype(dtype), bias.astype(dtype))
