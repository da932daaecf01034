"""Every GGUF architecture we import, served: greedy parity with mlx-lm, alone and batched.

For each architecture a tiny random checkpoint is written as MLX safetensors and
as a GGUF (gguf_archs.py, converted the way llama.cpp's converter does). The
GGUF goes through the daemon's own path (`load_model` on a `.gguf` source ->
import -> `Engine`), and its greedy tokens must equal `mlx_lm`'s greedy decoding:
- F32: against mlx-lm on the *original* MLX checkpoint (and the imported weights
  equal the originals bit for bit);
- quantized: against mlx-lm on the imported (dequantized-then-requantized)
  checkpoint, with the engine kept quantized too, so both run the same weights.
Each case runs one request alone, then four at once in one batch.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from gguf_archs import ARCHS, make_arch_checkpoint, write_arch_gguf
from mlx_lm.generate import generate_step

from frink_mlx.backend import select_backend
from frink_mlx.core.request import SamplingParams
from frink_mlx.engine.config import resolve_engine_config
from frink_mlx.engine.engine import Engine, EngineConfig
from frink_mlx.engine.gate import DecodeGate
from frink_mlx.engine.types import SeqRequest
from frink_mlx.models.loader import load_model
from frink_mlx.registry import ModelSpec
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)
NUM_TOKENS = 6
PROMPT_LENGTHS = (11, 5, 17, 9)
# quantized types per architecture: one exact legacy type, one exact K-quant, one re-quantized
QTYPES = ("Q8_0", "Q4_K", "Q6_K")
BACKEND = select_backend(Settings().backend_config())  # what this machine serves with


def prompts(vocab: int, seed: int) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=n).tolist() for n in PROMPT_LENGTHS]


def reference(model, prompt: list[int]) -> list[int]:
    return [int(t) for t, _ in generate_step(mx.array(prompt), model, max_tokens=NUM_TOKENS)]


def engine_tokens(loaded, batch: list[list[int]]) -> tuple[list[int], list[list[int]]]:
    """One request alone, then all of `batch` submitted together."""
    config = EngineConfig(block_size=4, num_blocks=160, max_batch=4, prefill_chunk_tokens=8,
                          batching=True, context_ceiling=256, max_queue=8, queue_timeout_s=60.0)
    engine = Engine(loaded, resolve_engine_config(config, loaded, BACKEND), DecodeGate(), BACKEND)
    engine.start()
    greedy = SamplingParams(temperature=0)
    try:
        alone = [o.token_id for o in engine.submit(SeqRequest("alone", batch[0], greedy, NUM_TOKENS))]
        streams = [engine.submit(SeqRequest(f"b{i}", p, greedy, NUM_TOKENS)) for i, p in enumerate(batch)]
        together = [[o.token_id for o in s] for s in streams]
    finally:
        engine.shutdown(5.0)
    return alone, together


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("archs")
    return {name: make_arch_checkpoint(name, root / name, seed=i) for i, name in enumerate(ARCHS)}


def serve_gguf(path: Path, cache: Path, *, keep_quantized: bool):
    spec = ModelSpec(name="g", source=str(path))
    config = Settings(cache_dir=str(cache), dequantize=False if keep_quantized else None).load_config()
    return load_model(spec, config, BACKEND)


def check_parity(name: str, loaded, want_model) -> None:
    batch = prompts(loaded.config["vocab_size"], seed=len(name))
    want = [reference(want_model, p) for p in batch]
    alone, together = engine_tokens(loaded, batch)
    assert alone == want[0], "alone"
    assert together == want, "batched"


@pytest.mark.parametrize("name", sorted(ARCHS))
def test_f32_gguf_serves_the_original_model(name: str, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import mlx_lm

    ckpt = checkpoints[name]
    path, _ = write_arch_gguf(name, ckpt, tmp_path / f"{name}.gguf")
    loaded = serve_gguf(path, tmp_path / "cache", keep_quantized=False)
    imported = {}
    for shard in sorted(loaded.path.glob("*.safetensors")):
        imported.update(mx.load(str(shard)))
    original = mx.load(str(ckpt / "model.safetensors"))
    assert imported.keys() == original.keys()
    for key in original:
        if name.startswith("gemma") and key.endswith("norm.weight"):  # stored +1 in GGUF: one rounding
            assert mx.allclose(imported[key], original[key], rtol=0, atol=1e-6).item(), key
        else:
            assert mx.array_equal(imported[key], original[key]).item(), key
    scaling = json.loads((ckpt / "config.json").read_text()).get("rope_scaling")
    got_scaling = loaded.config.get("rope_scaling")
    if scaling is None:
        assert got_scaling is None
    elif scaling.get("rope_type") == "llama3":  # rope_freqs -> longrope factors (arch.py rule 6)
        assert got_scaling["type"] == "longrope" and len(got_scaling["long_factor"]) == 32
    else:
        assert got_scaling == {**scaling, **({"original_max_position_embeddings": 128}
                                             if scaling["type"] == "longrope" else {})}
    want_model, _ = mlx_lm.load(str(ckpt))
    check_parity(name, loaded, want_model)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("name", sorted(ARCHS))
def test_quantized_gguf_matches_mlx_lm_on_the_imported_weights(
        name: str, qtype: str, checkpoints: dict[str, Path], tmp_path: Path) -> None:
    import mlx_lm

    path, _ = write_arch_gguf(name, checkpoints[name], tmp_path / f"{name}-{qtype}.gguf", qtype)
    loaded = serve_gguf(path, tmp_path / "cache", keep_quantized=True)
    quant = json.loads((loaded.path / "config.json").read_text())["quantization"]
    assert any("embed_tokens" in k for k in quant) and quant["group_size"] == 32
    want_model, _ = mlx_lm.load(str(loaded.path))
    check_parity(name, loaded, want_model)
