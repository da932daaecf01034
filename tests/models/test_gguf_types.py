"""Every GGUF tensor type the `gguf` package dequantizes: imported weights vs its reference.

A tiny llama GGUF is written with all matrices in one type (quantized by the
package where it can, random raw blocks where it cannot: gguf_archs.random_blocks),
imported, and every matrix compared with `gguf.quants.dequantize` of the bytes
written:
- exact types (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K) may differ only by the
  float16 rounding of each group's scale s and bias b: 2^-11 * ((2^bits - 1)|s| + |b|);
- re-quantized types stay within MLX's own affine error, under one step |s| per
  group of 32 (mx.quantize keeps zero on the grid, so not half a step), plus
  the same float16 rounding;
- `as_float=True` imports equal the reference exactly, for every type.
Then the quantized import is served (alone and 4 batched) and must match
mlx-lm greedy on the imported weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf_archs import make_arch_checkpoint, write_arch_gguf
from test_gguf_archs import check_parity, serve_gguf

from frink_mlx.models.gguf import import_gguf
from frink_mlx.models.gguf import tensors as tx
from frink_mlx.models.gguf.arch import inverse_permute_rows

QUANT_TYPES = sorted(n for n in tx.supported_types().values() if n not in ("F32", "F16"))


@pytest.fixture(scope="module")
def llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_arch_checkpoint("llama", tmp_path_factory.mktemp("llama") / "ckpt", seed=7)


def _hf_rows(gname: str, ref: np.ndarray, config: dict) -> np.ndarray:
    """The reference in HF row order (the importer un-permutes llama's Q/K rows)."""
    for frag, heads in (("attn_q.", "num_attention_heads"), ("attn_k.", "num_key_value_heads")):
        if frag in gname:
            return ref[inverse_permute_rows(ref.shape[0], config[heads])]
    return ref


def _imported(ckpt: Path) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for shard in ckpt.glob("*.safetensors"):
        weights.update(mx.load(str(shard)))
    return weights


def _module_for(gname: str, weights: dict[str, mx.array]) -> str:
    import gguf
    from gguf_archs import _gguf_tensor_name

    tmap = gguf.get_tensor_name_map(gguf.MODEL_ARCH.LLAMA, 2)
    for key in weights:
        if key.endswith(".weight") and _gguf_tensor_name(tmap, key) == gname:
            return key[: -len(".weight")]
    raise KeyError(gname)


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_imported_weights_match_the_gguf_reference(qtype: str, llama: Path, tmp_path: Path) -> None:
    path, reference = write_arch_gguf("llama", llama, tmp_path / f"{qtype}.gguf", qtype)
    ckpt = import_gguf(path, tmp_path / "cache")
    config = json.loads((ckpt / "config.json").read_text())
    weights = _imported(ckpt)
    exact = qtype in tx.EXACT_BITS
    worst = 0.0
    for gname, ref in reference.items():
        module = _module_for(gname, weights) if ref.ndim == 2 else None
        if module is None or f"{module}.scales" not in weights:
            assert qtype == "BF16" or ref.ndim < 2, gname  # only norms stay float (BF16: all)
            continue
        bits = config["quantization"][module]["bits"]
        assert bits == tx.EXACT_BITS.get(qtype, tx.REQUANT_BITS.get(qtype)), (gname, bits)
        scales = weights[f"{module}.scales"].astype(mx.float32)  # f32: what the CPU path serves
        biases = weights[f"{module}.biases"].astype(mx.float32)
        got = np.array(mx.dequantize(weights[f"{module}.weight"], scales, biases, group_size=32, bits=bits))
        want = _hf_rows(gname, ref.astype(np.float32), config)
        err = np.abs(got - want).reshape(want.shape[0], -1, 32).max(-1)
        s, b = np.abs(np.array(scales)), np.abs(np.array(biases))
        f16_rounding = 2.0 ** -11 * ((2 ** bits - 1) * s + b) * 1.01 + 1e-7
        # exact types: only the float16 rounding of scale and bias; re-quantized types: MLX's
        # affine error (under one step: it keeps zero on the grid) plus that rounding
        bound = f16_rounding if exact else s + f16_rounding
        assert (err <= bound).all(), (gname, float((err - bound).max()))
        worst = max(worst, float(err.max() / np.abs(want).max()))
    print(f"{qtype}: worst |err| / max|w| = {worst:.2e}")


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_as_float_import_is_the_reference_exactly(qtype: str, llama: Path, tmp_path: Path) -> None:
    path, reference = write_arch_gguf("llama", llama, tmp_path / f"{qtype}.gguf", qtype)
    ckpt = import_gguf(path, tmp_path / "cache", as_float=True)
    assert ckpt.name.endswith("-f32")
    config = json.loads((ckpt / "config.json").read_text())
    assert "quantization" not in config and config["gguf"]["as_float"] is True
    weights = _imported(ckpt)
    for gname, ref in reference.items():
        if ref.ndim != 2:
            continue
        got = weights[f"{_module_for(gname, weights)}.weight"]
        assert got.dtype == mx.float32
        assert np.array_equal(np.array(got), _hf_rows(gname, ref.astype(np.float32), config)), gname


@pytest.mark.parametrize("qtype", QUANT_TYPES)
def test_each_type_serves_like_mlx_lm(qtype: str, llama: Path, tmp_path: Path) -> None:
    import mlx_lm

    path, _ = write_arch_gguf("llama", llama, tmp_path / f"{qtype}.gguf", qtype)
    loaded = serve_gguf(path, tmp_path / "cache", keep_quantized=True)
    want_model, _ = mlx_lm.load(str(loaded.path))
    try:
        check_parity("llama", loaded, want_model)
    except AssertionError:
        if qtype != "BF16":
            raise
        # kept bfloat16 (faithful); the engine's bf16 path on CPU drifts from mlx-lm's, with or
        # without GGUF: issue 18's "every quantization to float32 on the CPU backend" item
        pytest.xfail("bfloat16 weights on the CPU engine (issue 18, loader dtype item)")


def test_bf16_serves_as_float32_by_default_on_cpu(llama: Path, tmp_path: Path) -> None:
    """Unless told to keep it, a BF16 GGUF runs in float32 on the CPU backend (loader rule 3)."""
    import mlx_lm

    path, _ = write_arch_gguf("llama", llama, tmp_path / "BF16.gguf", "BF16")
    loaded = serve_gguf(path, tmp_path / "cache", keep_quantized=False)
    assert loaded.dtype == mx.float32
    want_model, _ = mlx_lm.load(str(loaded.path))
    want_model.set_dtype(mx.float32)
    check_parity("llama", loaded, want_model)


@pytest.mark.parametrize("bits", [2, 3, 4, 5, 6, 8])
def test_packing_is_mlx_layout(bits: int) -> None:
    codes = np.random.default_rng(bits).integers(0, 2 ** bits, size=(3, 64))
    packed = tx.pack_codes(codes, bits)
    ones, zeros = mx.ones((3, 2)), mx.zeros((3, 2))
    assert np.array_equal(np.array(mx.dequantize(mx.array(packed), ones, zeros, group_size=32, bits=bits)),
                          codes.astype(np.float32))
