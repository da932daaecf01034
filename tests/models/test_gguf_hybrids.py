"""GGUF import of the hybrid and mixed-attention families: the imported model is the original.

For each family a tiny random mlx-lm checkpoint is written as a GGUF the way
llama.cpp's converter would (gguf_hybrids.py), imported, and loaded with mlx-lm:
- F32: every imported weight equals the original (bit for bit, or within one
  float32 rounding where the converter stored a transformed value: -exp(A_log),
  norms + 1), and the logits of a prompt equal the original model's (fp32 allclose);
- Q8_0: every quantized weight, dequantized, is within Q8_0's own error of the
  original (so row reorders, stacked sources and moved column groups are right on
  packed weights too), and the model still computes the same function.
Serving these families on the paged engine is another module's concern; this one
compares plain mlx-lm forward passes.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest
from gguf_hybrids import HYBRIDS, make_hybrid_checkpoint, write_hybrid_gguf

from frink_mlx.models.gguf import import_gguf

PROMPT = [5, 17, 33, 2, 90, 41, 7, 64, 12, 3, 77, 28]


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hybrids")
    return {name: make_hybrid_checkpoint(name, root / name, seed=i) for i, name in enumerate(HYBRIDS)}


def _weights(ckpt: Path) -> dict[str, mx.array]:
    weights: dict[str, mx.array] = {}
    for shard in sorted(ckpt.glob("*.safetensors")):
        weights.update(mx.load(str(shard)))
    return weights


def _logits(path: Path) -> np.ndarray:
    model, _ = mlx_lm.load(str(path))
    return np.array(model(mx.array([PROMPT])).astype(mx.float32))


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_f32_gguf_imports_the_original_model(name: str, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    ckpt = checkpoints[name]
    path = write_hybrid_gguf(name, ckpt, tmp_path / f"{name}.gguf")
    imported_dir = import_gguf(path, tmp_path / "cache")
    imported, original = _weights(imported_dir), _weights(ckpt)
    assert imported.keys() == original.keys()
    for key, want in original.items():
        assert imported[key].shape == want.shape, key
        assert mx.allclose(imported[key], want, rtol=1e-6, atol=1e-6).item(), key
    np.testing.assert_allclose(_logits(imported_dir), _logits(ckpt), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", sorted(HYBRIDS))
def test_q8_gguf_keeps_every_weight_in_place(name: str, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    ckpt = checkpoints[name]
    path = write_hybrid_gguf(name, ckpt, tmp_path / f"{name}-q8.gguf", "Q8_0")
    imported_dir = import_gguf(path, tmp_path / "cache")
    imported, original = _weights(imported_dir), _weights(ckpt)
    quantized = [k for k in original if k.endswith(".weight") and k[:-len("weight")] + "scales" in imported]
    assert any("linear_attn" in k or "mixer" in k or "mamba" in k or "conv" in k for k in quantized) \
        or name.startswith(("gemma", "gpt"))
    for key in quantized:
        module = key[:-len(".weight")]
        got = mx.dequantize(imported[key], imported[module + ".scales"], imported[module + ".biases"],
                            group_size=32, bits=8)
        want = original[key]
        step = float(mx.abs(want).max().item()) / 127
        assert got.shape == want.shape, key
        assert float(mx.abs(got - want).max().item()) <= 1.01 * step, key
    # random tiny hybrids amplify 8-bit noise (mlx's own 8-bit quantization of the original
    # moves their logits as much), so the logits only have to stay the same function
    got_logits, want_logits = _logits(imported_dir), _logits(ckpt)
    assert np.corrcoef(got_logits.reshape(-1), want_logits.reshape(-1))[0, 1] > 0.98
