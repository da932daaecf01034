"""models/sources.py: Hugging Face repo ids (a pre-populated cache, a fake Hub on a
free loopback port) and the Ollama store (a fake one in tmp_path), down to greedy
output equal to loading the same checkpoint directly."""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path

import pytest
from fake_hub import FakeHub, checkpoint_files

from frink_mlx.backend import select_backend
from frink_mlx.config import LoadConfig
from frink_mlx.errors import ConfigError
from frink_mlx.models import loader, sources
from frink_mlx.models import progress as progress_mod
from frink_mlx.models.loader import LoadedModel
from frink_mlx.registry import ModelSpec, parse_registry, source_kind
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with


def load_model(spec: ModelSpec, config: LoadConfig) -> LoadedModel:
    return loader.load_model(spec, config, BACKEND)


@pytest.fixture()
def hub():
    fake = FakeHub().start()
    yield fake
    fake.stop()


def settings(tmp_path: Path, **kw: object) -> LoadConfig:
    return Settings(config_dir=str(tmp_path / "config"), cache_dir=str(tmp_path / "cache"),
                    hf_cache_dir=str(tmp_path / "hf"), ollama_models=str(tmp_path / "ollama"),
                    **kw).load_config()


def write_hf_cache(cache: Path, repo_id: str, files: dict[str, bytes], commit: str,
                   ref: str = "main") -> Path:
    """The cache layout huggingface_hub writes: blobs by etag, snapshot symlinks, refs."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir(exist_ok=True)
    for name, blob in files.items():
        etag = hashlib.sha256(blob).hexdigest()
        (repo / "blobs" / etag).write_bytes(blob)
        (snapshot / name).symlink_to(Path("..") / ".." / "blobs" / etag)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    return snapshot


# --- registry parsing -------------------------------------------------------------
def test_source_kinds_and_relative_paths_that_exist(tmp_path: Path) -> None:
    assert source_kind("mlx-community/Qwen3-0.6B-4bit") == "hf"
    assert source_kind("org/name@v1.0") == "hf"
    assert source_kind("ollama:smollm2:135m") == "ollama"
    assert source_kind("models/tiny.gguf") == source_kind("/abs/dir") == "path"
    (tmp_path / "local" / "ckpt").mkdir(parents=True)
    reg = parse_registry({"default": "a", "models": {
        "a": {"source": "local/ckpt"}, "b": {"source": "org/name@abc"},
        "c": {"source": "./org/name"}, "d": {"source": "ollama:qwen3"}}}, tmp_path / "models.toml")
    assert reg.entries["a"].source == str(tmp_path / "local" / "ckpt")   # exists: a path
    assert reg.entries["b"].source == "org/name@abc"                     # a repo id, as written
    assert reg.entries["c"].source == str(tmp_path / "org" / "name")    # ./ forces a path
    assert reg.entries["d"].source == "ollama:qwen3"


# --- Hugging Face ---------------------------------------------------------------------
def test_prepopulated_cache_resolves_offline_without_network(tiny_llama_dir: Path, tmp_path: Path) -> None:
    commit = "a" * 40
    snapshot = write_hf_cache(tmp_path / "hf", "org/tiny", checkpoint_files(tiny_llama_dir), commit)
    s = settings(tmp_path, hf_offline=True, hf_endpoint="http://127.0.0.1:9")  # nothing listens
    assert sources.hf_snapshot("org/tiny", s) == snapshot
    assert sources.hf_snapshot(f"org/tiny@{commit}", s) == snapshot
    with pytest.raises(ConfigError) as err:
        sources.hf_snapshot("org/other", s)
    assert err.value.message == (
        f"org/other is not in {tmp_path / 'hf'} and HF_HUB_OFFLINE is set (run `frink-mlx pull "
        "org/other` with network access, or unset HF_HUB_OFFLINE)")


def test_a_snapshot_missing_a_shard_is_not_a_cache_hit(tiny_llama_dir: Path, tmp_path: Path) -> None:
    files = checkpoint_files(tiny_llama_dir)
    index = {"metadata": {}, "weight_map": {"a": "model-00001-of-00002.safetensors",
                                            "b": "model-00002-of-00002.safetensors"}}
    files = {"config.json": files["config.json"], "model-00001-of-00002.safetensors": b"x",
             "model.safetensors.index.json": json.dumps(index).encode()}
    write_hf_cache(tmp_path / "hf", "org/sharded", files, "c" * 40)
    s = settings(tmp_path, hf_offline=True)
    assert sources.cached_hf_snapshot("org/sharded", s) is None
    with pytest.raises(ConfigError, match="HF_HUB_OFFLINE is set"):
        sources.hf_snapshot("org/sharded", s)


def test_fake_hub_download_reports_progress_then_hits_the_cache(
        hub: FakeHub, tiny_llama_dir: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    files = checkpoint_files(tiny_llama_dir)
    commit = hub.add_repo("org/tiny", files)
    s = settings(tmp_path, hf_endpoint=hub.url)
    seen: list[dict] = []
    progress = progress_mod.Progress("tiny")
    real_advance = progress.advance
    progress.advance = lambda n: (real_advance(n), seen.append(progress.snapshot()))  # type: ignore[method-assign]
    with caplog.at_level(logging.INFO, "frink_mlx.models"), progress_mod.reporting(progress):
        path = sources.hf_snapshot("org/tiny", s)
    assert path == tmp_path / "hf" / "models--org--tiny" / "snapshots" / commit
    assert {p.name for p in path.iterdir()} == set(files)
    total = sum(len(b) for b in files.values())
    assert seen and seen[-1]["phase"] == "download" and seen[-1]["detail"] == "org/tiny"
    assert seen[-1]["done_bytes"] == seen[-1]["total_bytes"] == total and seen[-1]["fraction"] == 1.0
    assert any("tiny: download done in" in r.getMessage() for r in caplog.records)
    num_requests = len(hub.requests)
    assert sources.hf_snapshot("org/tiny", s) == path and len(hub.requests) == num_requests


def test_revision_pinning(hub: FakeHub, tiny_llama_dir: Path, tmp_path: Path) -> None:
    files = checkpoint_files(tiny_llama_dir)
    old = hub.add_repo("org/tiny", {**files, "config.json": b'{"model_type": "llama", "v": 1}'})
    hub.add_repo("org/tiny", {**files, "config.json": b'{"model_type": "llama", "v": 2}'}, branch="v1")
    new = hub.add_repo("org/tiny", {**files, "config.json": b'{"model_type": "llama", "v": 3}'})
    s = settings(tmp_path, hf_endpoint=hub.url)

    def version(repo: str) -> int:
        return int(json.loads((sources.hf_snapshot(repo, s) / "config.json").read_text())["v"])

    assert version(f"org/tiny@{old}") == 1
    assert version("org/tiny@v1") == 2
    assert version("org/tiny") == 3 and sources.hf_snapshot("org/tiny", s).name == new
    with pytest.raises(ConfigError, match=r"^revision 'nope' not found in org/tiny$"):
        sources.hf_snapshot("org/tiny@nope", s)


def test_missing_repo_and_auth_errors_are_one_line(hub: FakeHub, tiny_llama_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    hub.add_repo("org/private", checkpoint_files(tiny_llama_dir), token="hf_right")
    s = settings(tmp_path, hf_endpoint=hub.url)
    with pytest.raises(ConfigError) as err:
        sources.hf_snapshot("org/missing", s, model="m")
    assert err.value.message == ("model 'm': Hugging Face repo 'org/missing' not found (check the "
                                 "name; if it is private, log in with `hf auth login` or set HF_TOKEN)")
    monkeypatch.setenv("HF_TOKEN", "hf_wrong")
    with pytest.raises(ConfigError) as err:
        sources.hf_snapshot("org/private", s)
    assert err.value.message == ("the Hub refused access to org/private (401): log in with "
                                 "`hf auth login` or set HF_TOKEN")
    monkeypatch.setenv("HF_TOKEN", "hf_right")
    assert (sources.hf_snapshot("org/private", s) / "config.json").is_file()


def test_model_loaded_by_repo_id_generates_like_the_dir(hub: FakeHub, tiny_llama_dir: Path,
                                                        tmp_path: Path) -> None:
    import mlx_lm

    hub.add_repo("org/tiny", checkpoint_files(tiny_llama_dir))
    s = settings(tmp_path, hf_endpoint=hub.url)
    by_id = load_model(ModelSpec(name="hf", source="org/tiny"), s)
    direct = load_model(ModelSpec(name="dir", source=str(tiny_llama_dir)), s)
    assert by_id.path.parent.parent.name == "models--org--tiny"
    prompt = direct.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                  add_generation_prompt=True)
    want = mlx_lm.generate(direct.model, direct.tokenizer, prompt, max_tokens=24)
    assert mlx_lm.generate(by_id.model, by_id.tokenizer, prompt, max_tokens=24) == want and want


# --- Ollama store ----------------------------------------------------------------------
def write_ollama_model(store: Path, name: str, tag: str, gguf: Path, params: dict | None,
                       namespace: str = "library") -> Path:
    """A manifest + blobs the way `ollama pull` lays them out."""
    (store / "blobs").mkdir(parents=True, exist_ok=True)

    def blob(data: bytes, media_type: str) -> dict:
        digest = hashlib.sha256(data).hexdigest()
        (store / "blobs" / f"sha256-{digest}").write_bytes(data)
        return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}

    layers = [blob(gguf.read_bytes(), "application/vnd.ollama.image.model"),
              blob(b"{{ .System }} {{ .Prompt }}", "application/vnd.ollama.image.template")]
    if params is not None:
        layers.append(blob(json.dumps(params).encode(), "application/vnd.ollama.image.params"))
    manifest = {"schemaVersion": 2,
                "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": blob(b"{}", "application/vnd.docker.container.image.v1+json"),
                "layers": layers}
    path = store / "manifests" / "registry.ollama.ai" / namespace / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return path


@pytest.fixture(scope="module")
def tiny_gguf(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from gguf_helpers import write_float_gguf

    return write_float_gguf(tiny_llama_dir, tmp_path_factory.mktemp("ollama") / "tiny.gguf")


def test_ollama_reference_forms(tmp_path: Path) -> None:
    base = tmp_path / "manifests" / "registry.ollama.ai"
    assert sources.ollama_manifest_path("ollama:smollm2", tmp_path) == base / "library/smollm2/latest"
    assert sources.ollama_manifest_path("ollama:smollm2:135m", tmp_path) == base / "library/smollm2/135m"
    assert sources.ollama_manifest_path("ollama:me/tiny:q4", tmp_path) == base / "me/tiny/q4"
    assert sources.ollama_manifest_path("ollama:host:5000/me/tiny", tmp_path) == \
        tmp_path / "manifests/host:5000/me/tiny/latest"
    with pytest.raises(ConfigError, match="expected ollama:NAME"):
        sources.ollama_manifest_path("ollama:../x", tmp_path)


def test_ollama_model_loads_with_its_params(tiny_gguf: Path, tiny_llama_dir: Path, tmp_path: Path) -> None:
    import mlx_lm

    params = {"stop": ["<|im_end|>", "User:"], "temperature": 0.3, "top_k": 20,
              "repeat_penalty": 1.1, "num_ctx": 512}
    write_ollama_model(tmp_path / "ollama", "tiny", "f32", tiny_gguf, params)
    s = settings(tmp_path)
    loaded = load_model(ModelSpec(name="o", source="ollama:tiny:f32"), s)
    assert loaded.path.parent == tmp_path / "cache" / "checkpoints"
    assert loaded.spec.sampling is not None and loaded.spec.sampling.temperature == 0.3
    assert loaded.spec.sampling.top_k == 20 and loaded.spec.sampling.repetition_penalty == 1.1
    assert loaded.context_length == 512
    assert loaded.tokenizer.convert_tokens_to_ids("<|im_end|>") in loaded.tokenizer.eos_token_ids
    from frink_mlx.registry import SamplingDefaults

    mine = ModelSpec(name="o", source="ollama:tiny:f32", context_length=100,
                     sampling=SamplingDefaults(temperature=0.9))
    again = load_model(mine, s)          # the registry entry's own values win
    assert again.spec.sampling.temperature == 0.9 and again.spec.sampling.top_k == 20
    assert again.context_length == 100
    direct = load_model(ModelSpec(name="g", source=str(tiny_gguf)), s)
    prompt = direct.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}],
                                                  add_generation_prompt=True)
    assert mlx_lm.generate(loaded.model, loaded.tokenizer, prompt, max_tokens=16) == \
        mlx_lm.generate(direct.model, direct.tokenizer, prompt, max_tokens=16)


def test_ollama_refusals(tiny_gguf: Path, tmp_path: Path) -> None:
    store = tmp_path / "ollama"
    s = settings(tmp_path)
    with pytest.raises(ConfigError, match=r"ollama:nope is not in the Ollama store .*ollama pull nope"):
        sources.ollama_model("ollama:nope", s)
    manifest = write_ollama_model(store, "tiny", "latest", tiny_gguf, None)
    assert sources.ollama_model("ollama:tiny", s).params == {}
    blob = sources.ollama_model("ollama:tiny", s).blob
    os.remove(blob)
    with pytest.raises(ConfigError, match="is missing"):
        sources.ollama_model("ollama:tiny", s)
    manifest.write_text("not json")
    with pytest.raises(ConfigError, match="not an Ollama manifest"):
        sources.ollama_model("ollama:tiny", s)


def test_ollama_defaults_drop_values_out_of_range() -> None:
    sampling, stops, ctx = sources.ollama_defaults(
        {"temperature": 0.7, "top_p": 7.0, "stop": ["a", 3, ""], "num_ctx": "big"})
    assert sampling is not None and sampling.temperature == 0.7 and sampling.top_p is None
    assert stops == ("a",) and ctx is None


def test_missing_reason_touches_no_network(tiny_gguf: Path, tmp_path: Path) -> None:
    online = settings(tmp_path, hf_endpoint="http://127.0.0.1:9")
    offline = settings(tmp_path, hf_offline=True)
    repo = ModelSpec(name="r", source="org/tiny")
    assert sources.missing_reason(repo, online) is None          # a load would download it
    assert sources.missing_reason(repo, offline) == (
        "org/tiny is not in the Hugging Face cache and HF_HUB_OFFLINE is set (run `frink-mlx pull "
        "org/tiny` with network access, or unset HF_HUB_OFFLINE)")
    ollama = ModelSpec(name="o", source="ollama:tiny")
    assert "is not in the Ollama store" in (sources.missing_reason(ollama, online) or "")
    write_ollama_model(tmp_path / "ollama", "tiny", "latest", tiny_gguf, None)
    assert sources.missing_reason(ollama, online) is None
    assert "source not found" in (sources.missing_reason(
        ModelSpec(name="p", source=str(tmp_path / "gone")), online) or "")


def test_progress_tracks_absolute_counts_across_phases() -> None:
    progress = progress_mod.Progress("m")
    progress.phase("convert", "GGUF x")
    progress.track("hash", 40, 100)
    snap = progress.snapshot() or {}
    assert (snap["phase"], snap["detail"], snap["done_bytes"]) == ("hash", "GGUF x", 40)
    assert snap["fraction"] == 0.4
    progress.track("hash", 100, 100)
    progress.track("convert", 10, 50)
    snap = progress.snapshot() or {}
    assert (snap["phase"], snap["done_bytes"], snap["total_bytes"]) == ("convert", 10, 50)
    progress.done()
    assert progress.snapshot() is None
