"""Every quantization mode MLX has dequantizes to float32 on load (loader rule 3).

For each mode a tiny llama is quantized the way mlx_lm.convert writes it; the
reference is a plain float32 checkpoint of the dequantized weights (for
mxfp4 decoded independently in numpy from the E2M1 codes and E8M0 scales),
run by mlx-lm itself. Our load must hold exactly those float32 weights and
generate the same greedy text.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx import nn
from mlx.utils import tree_flatten

from frink_mlx.backend import select_backend
from frink_mlx.config import LoadConfig
from frink_mlx.models import loader
from frink_mlx.models.loader import LoadedModel
from frink_mlx.registry import ModelSpec
from frink_mlx.settings import Settings

MODES = {"affine-2": ("affine", 32, 2), "affine-3": ("affine", 32, 3), "affine-4": ("affine", 32, 4),
         "affine-5": ("affine", 32, 5), "affine-6": ("affine", 32, 6), "affine-8": ("affine", 32, 8),
         "mxfp4": ("mxfp4", 32, 4), "mxfp8": ("mxfp8", 32, 8), "nvfp4": ("nvfp4", 16, 4)}
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


BACKEND = select_backend(Settings().backend_config())  # what this machine serves with


def load_model(spec: ModelSpec, config: LoadConfig) -> LoadedModel:
    return loader.load_model(spec, config, BACKEND)


def mxfp4_numpy(weight: mx.array, scales: mx.array) -> np.ndarray:
    """OCP MX fp4: 8 E2M1 codes per uint32 (low nibble first), one E8M0 scale per 32."""
    packed = np.array(weight).astype(np.uint32)
    codes = (packed[..., None] >> (4 * np.arange(8, dtype=np.uint32))) & 0xF
    values = E2M1[codes.reshape(packed.shape[0], -1)]
    scale = np.exp2(np.array(scales).astype(np.float32) - 127.0)
    return (values.reshape(*scale.shape, 32) * scale[..., None]).reshape(values.shape)


def write_quantized(src: Path, out: Path, mode: str, group_size: int, bits: int) -> dict[str, mx.array]:
    """A quantized checkpoint in `out`; returns the float32 reference weights."""
    import mlx_lm

    model, _ = mlx_lm.load(str(src))
    nn.quantize(model, group_size=group_size, bits=bits, mode=mode)
    params = dict(tree_flatten(model.parameters()))
    mx.save_safetensors(str(out / "model.safetensors"), params)
    config = json.loads((src / "config.json").read_text())
    config["quantization"] = {"group_size": group_size, "bits": bits, "mode": mode}
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    reference = {}
    for name, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            if mode == "mxfp4":
                weight = mx.array(mxfp4_numpy(module.weight, module.scales))
            else:
                weight = mx.dequantize(module.weight, module.scales, module.get("biases"),
                                       group_size=group_size, bits=bits, mode=mode,
                                       dtype=mx.float32)
            reference[f"{name}.weight"] = weight
    for name, value in params.items():
        module = name.rsplit(".", 1)[0]
        if f"{module}.weight" not in reference:
            reference[name] = value.astype(mx.float32)
    return reference


@pytest.mark.parametrize("label", sorted(MODES))
def test_every_mode_loads_as_float32_and_matches_mlx_lm(label: str, tiny_llama_dir: Path,
                                                          tmp_path: Path) -> None:
    import mlx_lm

    mode, group_size, bits = MODES[label]
    (tmp_path / "q").mkdir()
    reference = write_quantized(tiny_llama_dir, tmp_path / "q", mode, group_size, bits)
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    mx.save_safetensors(str(ref_dir / "model.safetensors"), reference)
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_dir / name, ref_dir / name)

    config = Settings(config_dir=str(tmp_path / "c"), cache_dir=str(tmp_path / "cache"),
                      dequantize=True).load_config()
    loaded = load_model(ModelSpec(name=label, source=str(tmp_path / "q")), config)
    ours = dict(tree_flatten(loaded.model.parameters()))
    assert sorted(ours) == sorted(reference)
    for name, value in ours.items():
        assert value.dtype == mx.float32, name
        assert mx.array_equal(value, reference[name]).item(), name

    model, tokenizer = mlx_lm.load(str(ref_dir))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    want = mlx_lm.generate(model, tokenizer, prompt, max_tokens=24)
    assert mlx_lm.generate(loaded.model, loaded.tokenizer, prompt, max_tokens=24) == want
