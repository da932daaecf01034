"""A registry entry with `draft` (registry rule 10, engine/speculative/ rule 7) served end to end.

The target is a tiny random llama of 8 layers; its draft is the same checkpoint cut
to its first layer (what benchmarks/spec_bench.py does with SmolLM2), so they share
the tokenizer. Through real HTTP: greedy answers (with a stop string) equal the
answers with speculation off, usage and /metrics count the draft model's tokens,
both KV pools end empty; unloading the target frees both models. A draft whose tokenizer differs is
refused when the generation loads, naming both models.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import httpx
import mlx.core as mx
import pytest
from daemon_support import start_server

from frink_mlx.app import create_app
from frink_mlx.backend import select_backend
from frink_mlx.errors import ModelFormatError
from frink_mlx.registry import load_registry
from frink_mlx.serving.generation import build_generation
from frink_mlx.settings import Settings

PROMPT = [{"role": "user", "content": "Rewrite: def add(a, b): return a + b"}]


def truncate_layers(src: Path, dst: Path, num_layers: int) -> Path:
    """`src` with only its first `num_layers` decoder layers (same embeddings, tokenizer)."""
    dst.mkdir(parents=True)
    weights = mx.load(str(src / "model.safetensors"))
    keep = {k: v for k, v in weights.items()
            if not k.startswith("model.layers.") or int(k.split(".")[2]) < num_layers}
    mx.save_safetensors(str(dst / "model.safetensors"), keep, metadata={"format": "mlx"})
    config = json.loads((src / "config.json").read_text())
    config["num_hidden_layers"] = num_layers
    (dst / "config.json").write_text(json.dumps(config))
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)
    return dst


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("ckpts")
    target = make_tiny_llama(root / "target", seed=3, num_hidden_layers=8)
    other = make_tiny_llama(root / "other", seed=4, vocab_size=300)
    return target, truncate_layers(target, root / "draft", 1), other


@pytest.fixture(scope="module")
def settings(checkpoints, tmp_path_factory):
    target, draft, other = checkpoints
    path = tmp_path_factory.mktemp("reg") / "models.toml"
    path.write_text(f'default = "t"\n[models.t]\nsource = "{target}"\ndraft = "d"\n'
                    f'[models.d]\nsource = "{draft}"\n'
                    f'[models.bad]\nsource = "{target}"\ndraft = "o"\n'
                    f'[models.o]\nsource = "{other}"\n')
    return Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                         fallback=False, cache_dir=str(tmp_path_factory.mktemp("c")))


@pytest.fixture(scope="module")
def live(settings):
    app = create_app(settings, registry=load_registry(settings), factory=build_generation)
    server = start_server(app)
    yield server
    server.stop()


def _chat(live, **kw):
    body = {"model": "t", "messages": PROMPT, "max_tokens": 40, "temperature": 0, **kw}
    r = httpx.post(live.url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_draft_entry_gives_the_same_answers_and_counts_its_drafts(live):
    plain = _chat(live, speculative=False)["choices"][0]["message"]["content"]
    assert len(plain) > 8
    spec = _chat(live)
    assert spec["choices"][0]["message"]["content"] == plain
    assert spec["usage"]["draft_tokens"] > 0
    stop = plain[5:8]
    cut = _chat(live, stop=[stop])
    assert cut["choices"][0]["message"]["content"] == plain[:plain.index(stop)]
    gen = live.state.hub.current
    assert gen.draft is not None and gen.plan.draft_num_blocks > 0
    assert gen.plan.draft_bytes > 0
    metrics = httpx.get(live.url + "/metrics").text
    assert "frink_spec_draft_model_tokens_total" in metrics
    for _ in range(100):
        stats = gen.engine.stats()
        if stats.num_blocks_used == 0 and stats.extra["draft_kv_blocks_used"] == 0:
            break
        time.sleep(0.02)
    assert stats.num_blocks_used == 0 and stats.extra["draft_kv_blocks_used"] == 0
    assert stats.extra["draft_model_tokens_total"] > 0


def test_unloading_the_target_frees_its_draft_with_it(live):
    _chat(live)
    old = live.state.hub.residency.find("t")
    assert old is not None and old.engine.runner.draft is not None
    _chat(live, model="d")  # the draft entry served on its own: a second resident model
    assert live.state.hub.residency.find("d").draft is None
    r = httpx.post(live.url + "/admin/models/unload", json={"model": "t"}, timeout=60)
    assert r.status_code == 200, r.text
    for _ in range(200):
        if not old.engine.runner.draft.store.keys:
            break
        time.sleep(0.02)
    assert old.engine.runner.draft.store.keys == [] and old.engine.runner.store.keys == []
    _chat(live)  # and back: a fresh generation with its own draft
    assert live.state.hub.residency.find("t").draft is not None


def test_a_draft_with_another_tokenizer_is_refused_at_load(settings):
    registry = load_registry(settings)
    backend = select_backend(settings.backend_config())
    with pytest.raises(ModelFormatError, match="'o' and its target 'bad'.*tokenizer"):
        build_generation(registry.resolve("bad"), settings.hub_config(), 1, None, backend,
                         draft=registry.resolve("o"))
