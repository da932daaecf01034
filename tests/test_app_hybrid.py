"""Hybrid families through the daemon (issue 29): Qwen3.5's nested text_config loads,
its context comes from that text_config, /completions gives mlx-lm's greedy text alone
and four at once, a schema-bound completion reads as its schema says, /health counts
the recurrent-state slots; a daemon restarted on the
same cache directory restores a prompt's blocks and state snapshot from the SSD tier; a
model file the engine cannot run (llama4's chunked attention) is refused at load in one
line."""

from __future__ import annotations

import concurrent.futures
import sys
from pathlib import Path

import httpx
import pytest
from daemon_support import generation_factory, start_server

from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

sys.path.insert(0, str(Path(__file__).parent / "engine"))
from hybrid_support import checkpoint  # noqa: E402

PROMPTS = ["The quick brown fox", "def add(a, b):", "Numbers: 0 1 2", "What is the capital of"]


@pytest.mark.parametrize("family", ["qwen3_5", "nemotron_h"])
def test_hybrid_served_with_mlx_lm_greedy_text(family: str, tiny_llama_dir: Path,
                                               tmp_path: Path) -> None:
    import mlx_lm

    path = checkpoint(family, tiny_llama_dir, tmp_path / family)
    model, tokenizer = mlx_lm.load(str(path))
    want = []
    for prompt in PROMPTS:
        ids = [r.token for r in mlx_lm.stream_generate(model, tokenizer, prompt, max_tokens=10)]
        want.append(tokenizer.decode(ids, skip_special_tokens=False,
                                     clean_up_tokenization_spaces=False))
    models = tmp_path / "models.toml"
    models.write_text(f'default = "h"\n[models.h]\nsource = "{path}"\n')
    settings = Settings.load(models_path=str(models), access_log=False,
                             cache_dir=str(tmp_path / "cache"), admission_window_ms=200.0,
                             max_batch=4)
    server = start_server(create_app(settings, registry=load_registry(settings),
                                     factory=generation_factory()))

    def complete(prompt: str) -> str:
        r = httpx.post(server.url + "/v1/completions", timeout=120, json={
            "model": "h", "prompt": prompt, "max_tokens": 10, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    try:
        assert [complete(p) for p in PROMPTS] == want  # one at a time
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            assert list(pool.map(complete, PROMPTS)) == want
        health = httpx.get(server.url + "/health", timeout=10).json()
        assert health["context_ceiling"] <= 512  # text_config's max_position_embeddings
        assert (health["kv"]["state_slots_total"], health["kv"]["state_slots_used"]) == (4, 0)
        plan = server.state.hub.current.plan
        assert plan.num_state_slots == 4 and plan.state_bytes > 0
        assert health["kv"]["state_snapshots_total"] == plan.num_snapshots > 0
        second_turn(server.url, PROMPTS[0] + want[0] + " and then", model, tokenizer)
        structured(server.url)
    finally:
        server.stop()


def second_turn(url: str, prompt: str, model, tokenizer) -> None:
    """A chat's next turn on a hybrid: cached_tokens > 0 (the recurrent layers restore a
    state snapshot, engine/kv/snapshots.py) and mlx-lm's greedy text all the same."""
    import mlx_lm

    want = tokenizer.decode([r.token for r in mlx_lm.stream_generate(
        model, tokenizer, prompt, max_tokens=10)], skip_special_tokens=False,
        clean_up_tokenization_spaces=False)
    r = httpx.post(url + "/v1/completions", timeout=120, json={
        "model": "h", "prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True})
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["choices"][0]["text"] == want
    assert body["usage"]["prompt_tokens_details"]["cached_tokens"] > 0


def structured(url: str) -> None:
    """Structured output on a hybrid (issue 29): the grammar masks the logits whatever the
    layers' cache kinds, so a schema-bound completion reads as the schema says, alone and
    beside a free row, and the rows' state slots come back."""
    import json

    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]},
                                                "n": {"type": "integer", "minimum": 0,
                                                      "maximum": 9}},
              "required": ["answer", "n"], "additionalProperties": False}

    def bound(prompt: str) -> dict:
        r = httpx.post(url + "/completion", timeout=120, json={
            "prompt": prompt, "n_predict": 40, "temperature": 0, "json_schema": schema})
        assert r.status_code == 200, r.text
        return json.loads(r.json()["content"])

    def free(prompt: str) -> str:
        r = httpx.post(url + "/v1/completions", timeout=120, json={
            "model": "h", "prompt": prompt, "max_tokens": 10, "temperature": 0, "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["text"]

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        got, _ = pool.submit(bound, PROMPTS[1]), pool.submit(free, PROMPTS[2])
        for answer in (got.result(), bound(PROMPTS[3])):
            assert answer["answer"] in ("yes", "no") and 0 <= answer["n"] <= 9, answer
            assert set(answer) == {"answer", "n"}
    health = httpx.get(url + "/health", timeout=10).json()
    assert health["kv"]["state_slots_used"] == 0


def test_a_model_file_the_engine_cannot_run_is_refused_at_load(tiny_llama_dir: Path,
                                                               tmp_path: Path) -> None:
    from frink_mlx.backend import select_backend
    from frink_mlx.engine.kv.specs import UnsupportedModel
    from frink_mlx.models.loader import load_model
    from frink_mlx.registry import ModelSpec

    path = checkpoint("llama4", tiny_llama_dir, tmp_path / "llama4")
    settings = Settings.load(access_log=False, cache_dir=str(tmp_path / "cache"))
    backend = select_backend(settings.backend_config())
    with pytest.raises(UnsupportedModel) as err:
        load_model(ModelSpec(name="l4", source=str(path)), settings.hub_config().load, backend)
    message = str(err.value)
    assert "\n" not in message and "'l4'" in message and "llama4" in message
    assert "ChunkedKVCache" in message


LONG = " ".join(f"step {i} keeps the state." for i in range(14))


def test_a_restarted_daemon_restores_a_hybrids_state_from_disk(tiny_llama_dir: Path,
                                                               tmp_path: Path) -> None:
    """Issue 31: a hybrid's state snapshots use the SSD tier. A second daemon on the same
    cache directory answers a qwen3_5 prompt with cached tokens read from disk (blocks and
    the state after them, engine/kv/diskparts.py) and the same greedy text."""
    path = checkpoint("qwen3_5", tiny_llama_dir, tmp_path / "qwen3_5")
    models = tmp_path / "models.toml"
    models.write_text(f'default = "h"\n[models.h]\nsource = "{path}"\n')

    def daemon():
        settings = Settings.load(models_path=str(models), access_log=False,
                                 cache_dir=str(tmp_path / "cache"), max_batch=4)
        return start_server(create_app(settings, registry=load_registry(settings),
                                       factory=generation_factory()))

    def complete(url: str) -> dict:
        r = httpx.post(url + "/v1/completions", timeout=120, json={
            "model": "h", "prompt": LONG, "max_tokens": 10, "temperature": 0,
            "ignore_eos": True})
        assert r.status_code == 200, r.text
        return r.json()

    first = daemon()
    try:
        cold = complete(first.url)
    finally:
        first.stop()  # the engine writes its idle blocks and snapshots; the tier finishes
    assert cold["usage"]["prompt_tokens_details"]["disk_cached_tokens"] == 0
    second = daemon()
    try:
        warm = complete(second.url)
        disk = httpx.get(second.url + "/health", timeout=10).json()["kv_disk"]
    finally:
        second.stop()
    assert warm["choices"][0]["text"] == cold["choices"][0]["text"]
    details, prompt_tokens = warm["usage"]["prompt_tokens_details"], \
        warm["usage"]["prompt_tokens"]
    assert details["cached_tokens"] == details["disk_cached_tokens"] > prompt_tokens // 2
    assert disk["reads"] == 1 and disk["hit_blocks"] >= 2 and disk["refused_files"] == 0
