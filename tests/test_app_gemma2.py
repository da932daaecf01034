"""gemma2 through the daemon: one request and four at once in one batch each give
mlx-lm's greedy tokens (its attention scores queries per KV group: kv/paged.py rule 5;
before the fix every batched request got HTTP 500 `[broadcast_shapes]`)."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
from pathlib import Path

import httpx
import pytest
from daemon_support import generation_factory, start_server

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

PROMPTS = ["The quick brown fox", "def add(a, b):", "Numbers: 0 1 2", "What is the capital of"]


def write_tiny_gemma2(src: Path, out: Path) -> Path:
    """A 2-layer gemma2 (4 query heads over 2 KV heads) with the tiny llama's tokenizer."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_lm.models import gemma2

    vocab = json.loads((src / "config.json").read_text())["vocab_size"]
    config = {"model_type": "gemma2", "hidden_size": 64, "num_hidden_layers": 2,
              "intermediate_size": 96, "num_attention_heads": 4, "num_key_value_heads": 2,
              "head_dim": 16, "rms_norm_eps": 1e-6, "vocab_size": vocab, "rope_theta": 10000.0,
              "query_pre_attn_scalar": 16, "max_position_embeddings": 512,
              "bos_token_id": 0, "eos_token_id": 2}
    out.mkdir(parents=True)
    mx.random.seed(7)
    model = gemma2.Model(gemma2.ModelArgs.from_dict(config))
    weights = {k: (mx.zeros(v.shape) if "norm" in k else mx.random.normal(v.shape) * 0.2)
               for k, v in tree_flatten(model.parameters())}
    mx.save_safetensors(str(out / "model.safetensors"), weights)
    (out / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, out / name)
    return out


@pytest.fixture(scope="module")
def gemma2_dir(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gemma2(tiny_llama_dir, tmp_path_factory.mktemp("gemma2") / "ckpt")


def test_gemma2_alone_and_four_at_once_match_mlx_lm(gemma2_dir: Path, tmp_path: Path) -> None:
    import mlx_lm

    model, tokenizer = mlx_lm.load(str(gemma2_dir))
    want = []
    for prompt in PROMPTS:
        ids = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=12)]
        want.append(tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False))
    models = tmp_path / "models.toml"
    models.write_text(f'default = "g"\n[models.g]\nsource = "{gemma2_dir}"\n')
    settings = Settings.load(models_path=str(models), access_log=False,
                             cache_dir=str(tmp_path / "cache"), admission_window_ms=200.0)
    server = start_server(create_app(settings, registry=load_registry(settings),
                                     factory=generation_factory()))

    def complete(prompt: str) -> str:
        r = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "model": "g", "prompt": prompt, "max_tokens": 12, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    try:
        assert [complete(p) for p in PROMPTS] == want  # one at a time
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(complete, PROMPTS)) == want
        stats = server.state.hub.current.engine.stats()
        assert stats.num_running == 0
    finally:
        server.stop()
