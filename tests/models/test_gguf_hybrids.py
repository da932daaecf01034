"""GGUF import of the hybrid and mixed-attention families: the imported model is the original.

For each family a tiny random mlx-lm checkpoint is written as a GGUF the way
llama.cpp's converter would (gguf_hybrids.py), imported, and loaded with mlx-lm:
- F32: every imported weight equals the original (bit for bit, or within one
  float32 rounding where the converter stored a transformed value: -exp(A_log),
  norms + 1), and the logits of a prompt equal the original model's (fp32 allclose);
- Q8_0: every quantized weight, dequantized, equals the same GGUF imported as float
  (Q8_0 converts losslessly, so row reorders, stacked sources and moved column groups
  are right on packed weights too) and is within Q8_0's step of the original. Logits
  are not compared: random tiny models (MoE routers above all) turn 8-bit rounding
  into different outputs, whatever did the quantizing.
Serving these families on the paged engine is another module's concern; this one
compares plain mlx-lm forward passes.
"""

from __future__ import annotations

import json
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
    imported = _weights(import_gguf(path, tmp_path / "cache"))
    dequantized = _weights(import_gguf(path, tmp_path / "cache", as_float=True))
    original = _weights(ckpt)
    quantized = [k for k in original if k.endswith(".weight") and k[:-len("weight")] + "scales" in imported]
    assert any(frag in k for k in quantized for frag in ("linear_attn", "mixer", "mamba", "conv", "experts"))
    for key in quantized:
        module = key[:-len(".weight")]
        scales, biases = (imported[f"{module}.{part}"].astype(mx.float32) for part in ("scales", "biases"))
        got = mx.dequantize(imported[key], scales, biases, group_size=32, bits=8)
        assert got.shape == original[key].shape, key
        # the packed path (codes, scales, row/column moves, stacking) reproduces the float path
        # up to float16 rounding of the biases, and both are within Q8_0's step of the original
        tolerance = float(mx.abs(scales).max().item())
        assert float(mx.abs(got - dequantized[key]).max().item()) <= 1e-3 * tolerance, key
        assert float(mx.abs(got - original[key]).max().item()) <= 1.01 * tolerance, key
    model, _ = mlx_lm.load(str(import_gguf(path, tmp_path / "cache")))
    assert bool(mx.isfinite(model(mx.array([PROMPT]))).all().item())


def test_stacked_sources_of_different_types_are_requantized_together(
        checkpoints: dict[str, Path], tmp_path: Path) -> None:
    """qwen3next's in_proj_qkvz from a Q8_0 attn_qkv and a Q4_0 attn_gate: one 8-bit tensor
    (plan.py rule 1), each row within its own source type's step of the original."""
    path = write_hybrid_gguf("qwen3next", checkpoints["qwen3next"], tmp_path / "mixed.gguf", "Q8_0",
                             {"attn_gate": "Q4_0"})
    imported_dir = import_gguf(path, tmp_path / "cache")
    imported, original = _weights(imported_dir), _weights(checkpoints["qwen3next"])
    config = json.loads((imported_dir / "config.json").read_text())
    module = "model.layers.0.linear_attn.in_proj_qkvz"
    assert config["quantization"][module] == {"group_size": 32, "bits": 8}
    scales, biases = (imported[f"{module}.{part}"].astype(mx.float32) for part in ("scales", "biases"))
    got = mx.dequantize(imported[f"{module}.weight"], scales, biases, group_size=32, bits=8)
    want = original[f"{module}.weight"]
    q4_step = float(mx.abs(want).max().item()) / 7  # Q4_0: d = max / -8, so |error| <= |d| / 2 + requant
    assert float(mx.abs(got - want).max().item()) <= q4_step
    assert bool(mx.isfinite(mlx_lm.load(str(imported_dir))[0](mx.array([PROMPT]))).all().item())


# llama.cpp architectures (in the gguf package) with no mlx-lm mapping here: refused at load
UNMAPPED = ("mamba2", "jamba", "rwkv7", "nemotron_h_moe", "lfm2moe", "gemma3n", "kimi-linear")


@pytest.mark.parametrize("arch", UNMAPPED)
def test_unmapped_architecture_is_refused_at_load_in_one_line(arch: str, checkpoints: dict[str, Path],
                                                              tmp_path: Path) -> None:
    import gguf
    from gguf_helpers import close_writer, gguf_metadata, write_metadata

    from frink_mlx.backend import select_backend
    from frink_mlx.errors import ModelFormatError
    from frink_mlx.models.gguf import check_gguf
    from frink_mlx.models.loader import load_model
    from frink_mlx.registry import ModelSpec
    from frink_mlx.settings import Settings

    assert arch in gguf.MODEL_ARCH_NAMES.values()
    path = tmp_path / f"{arch}.gguf"
    writer = gguf.GGUFWriter(str(path), arch=arch)
    writer.add_block_count(1)
    write_metadata(writer, {k: v for k, v in gguf_metadata(checkpoints["qwen35"]).items()
                            if k.startswith("tokenizer.")})
    writer.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    close_writer(writer)
    messages = []
    for attempt in (lambda: check_gguf(path), lambda: import_gguf(path, tmp_path / "cache"),
                    lambda: load_model(ModelSpec(name="x", source=str(path)),
                                       Settings(cache_dir=str(tmp_path / "cache")).load_config(),
                                       select_backend(Settings().backend_config()))):
        with pytest.raises(ModelFormatError) as caught:
            attempt()
        messages.append(caught.value.message)
    for message in messages:
        assert "\n" not in message and f"unsupported GGUF architecture {arch!r}" in message
        assert "qwen35" in message  # the supported list names the new families
