"""Registry source -> a local MLX checkpoint dir (`resolve`), and `pull` ahead of time.

Why: users arrive with what they already have: `mlx-community/...` repo ids
(what `mlx_lm.server --model` takes), GGUF files, models pulled with Ollama.
registry.py only parses which kind a source is (`source_kind`); resolving one
may read caches, download or convert, so it lives here, below the loader.

Rules:
1. Paths: an MLX checkpoint dir (has config.json) or a GGUF file, recognised
   by its magic bytes, not its suffix (Ollama blobs have none). A GGUF is
   imported with models/gguf/ (cached by content hash).
2. Hugging Face `org/name[@revision]`: the local HF cache first, with no
   network at all (`local_files_only`); a snapshot counts when it holds
   config.json and its weights. Else, unless `config.hf_offline`
   (HF_HUB_OFFLINE), huggingface_hub downloads the files an MLX checkpoint
   needs (`HF_PATTERNS`, as mlx_lm does) into its cache with its token, bars
   on a terminal and bytes in `progress.current()`.
3. Every Hub failure is one `ConfigError` line with a hint: offline and not
   cached, repo not found (or private), gated, token refused (401/403),
   revision not found, Hub unreachable. No traceback reaches the user.
4. Ollama `ollama:NAME[:TAG]`: the manifest at
   `<store>/manifests/<host>/<namespace>/<name>/<tag>` (defaults
   registry.ollama.ai, library, latest; the store is `config.ollama_models`,
   i.e. $OLLAMA_MODELS or ~/.ollama/models) lists layers by digest; the
   `application/vnd.ollama.image.model` layer is the GGUF at
   `blobs/sha256-<hex>`. Its params layer (JSON) supplies defaults the
   registry entry leaves unset: temperature/top_p/top_k/min_p/repeat_penalty
   -> sampling, num_ctx -> context_length, stop -> stop strings. The
   template layer is a Go template, which we cannot render: the GGUF's own
   Jinja chat template is used (a models.toml `chat_template` replaces it).
5. Nothing here imports MLX at module level, so `frink-mlx models` stays fast.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec

from ..config import LoadConfig
from ..errors import ConfigError, ModelFormatError
from ..registry import (
    ModelSpec,
    SamplingDefaults,
    resolve_source,
    source_kind,
    source_problem,
    split_revision,
)
from . import gguf
from . import progress as progress_mod

GGUF_MAGIC = b"GGUF"
HF_PATTERNS = ["*.json", "model*.safetensors", "*.py", "tokenizer.model", "*.tiktoken",
               "tiktoken.model", "*.txt", "*.jsonl", "*.jinja"]
OLLAMA_HOST, OLLAMA_NAMESPACE, OLLAMA_TAG = "registry.ollama.ai", "library", "latest"
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_PARAMS_LAYER = "application/vnd.ollama.image.params"
_OLLAMA_SAMPLING = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                    "min_p": "min_p", "repeat_penalty": "repetition_penalty"}


@dataclass(slots=True)
class ResolvedSource:
    """What a source resolved to: the checkpoint, and defaults it brings (rule 4)."""

    checkpoint: Path
    origin: str                                # for logs and errors: repo@commit, blob, path
    sampling: SamplingDefaults | None = None
    stop: tuple[str, ...] = ()
    context_length: int | None = None


@dataclass(slots=True)
class OllamaModel:
    ref: str
    manifest: Path
    blob: Path
    params: dict[str, Any]


def resolve(spec: ModelSpec, config: LoadConfig) -> ResolvedSource:
    """The MLX checkpoint dir behind `spec.source`, fetching or importing it if needed."""
    kind = source_kind(spec.source)
    if kind == "hf":
        path = hf_snapshot(spec.source, config, model=spec.name)
        return ResolvedSource(local_checkpoint(path, spec.name, config), spec.source)
    if kind == "ollama":
        found = ollama_model(spec.source, config, model=spec.name)
        ckpt = _import_gguf(found.blob, config, spec.name)
        return ResolvedSource(ckpt, f"{found.ref} ({found.blob})", *ollama_defaults(found.params))
    path = resolve_source(spec)
    return ResolvedSource(local_checkpoint(path, spec.name, config), str(path))


def missing_reason(spec: ModelSpec, config: LoadConfig) -> str | None:
    """Why `spec`'s source is not there (one line), or None when it is or a load would
    fetch it. No network, no import: the registry's `source_check` (registry rule 5)."""
    kind = source_kind(spec.source)
    if kind == "hf":
        if config.hf_offline and cached_hf_snapshot(spec.source, config) is None:
            return (f"{spec.source} is not in the Hugging Face cache and HF_HUB_OFFLINE is set "
                    f"(run `frink-mlx pull {spec.source}` with network access, or unset "
                    "HF_HUB_OFFLINE)")
        return None
    if kind == "ollama":
        try:
            ollama_model(spec.source, config)
        except ConfigError as exc:
            return exc.message
        return None
    return source_problem(spec)


def source_checker(config: LoadConfig) -> Callable[[ModelSpec], str | None]:
    """`missing_reason` bound to `config`: what entry points install as a registry's
    `source_check` (registry rule 5)."""
    return lambda spec: missing_reason(spec, config)


def local_checkpoint(path: Path, model: str, config: LoadConfig) -> Path:
    """Rule 1: a checkpoint dir as is, a GGUF file imported."""
    if path.is_file():
        if not is_gguf(path):
            raise ModelFormatError(f"model {model!r}: {path} is neither a dir nor a .gguf file "
                                   "(no GGUF magic)")
        return _import_gguf(path, config, model)
    if not (path / "config.json").is_file():
        raise ModelFormatError(f"model {model!r}: {path} has no config.json")
    return path


def is_gguf(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == GGUF_MAGIC
    except OSError:
        return False


def _import_gguf(path: Path, config: LoadConfig, model: str) -> Path:
    """Rule 1's import; a cached one costs only the content hash (models/gguf/). Its
    hash and convert phases, with their bytes, go to the load's progress."""
    progress = progress_mod.current(model)
    progress.phase("convert", f"GGUF {path.name}")
    return gguf.import_gguf(path, config.cache_dir, progress=lambda report: progress.track(
        report.phase, report.done_bytes, report.total_bytes))


# --- Hugging Face (rules 2-3) -------------------------------------------------
def _snapshot_complete(path: Path) -> bool:
    """config.json and the weights: every shard a safetensors index names, else any file."""
    if not (path / "config.json").is_file():
        return False
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = set(json.loads(index.read_text())["weight_map"].values())
        except (OSError, ValueError, KeyError, AttributeError):
            return False
        return all((path / shard).is_file() for shard in shards)
    return any(path.glob("*.safetensors"))


def cached_hf_snapshot(repo: str, config: LoadConfig) -> Path | None:
    """The cached snapshot of `org/name[@rev]`, with no network; None if absent."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    repo_id, revision = split_revision(repo)
    try:
        path = Path(snapshot_download(repo_id, revision=revision, cache_dir=config.hf_cache_dir,
                                      allow_patterns=HF_PATTERNS, local_files_only=True))
    except (LocalEntryNotFoundError, HfHubHTTPError, OSError, ValueError):
        return None
    return path if _snapshot_complete(path) else None


def hf_snapshot(repo: str, config: LoadConfig, *, model: str | None = None) -> Path:
    """Rule 2: the cache, else a download; rule 3's one-line errors."""
    cached = cached_hf_snapshot(repo, config)
    if cached is not None:
        return cached
    who = f"model {model!r}: " if model else ""
    cache = config.hf_cache_dir or "the Hugging Face cache"
    if config.hf_offline:
        raise ConfigError(f"{who}{repo} is not in {cache} and HF_HUB_OFFLINE is set "
                          f"(run `frink-mlx pull {repo}` with network access, or unset HF_HUB_OFFLINE)")
    progress = progress_mod.current(model or repo)
    progress.phase("download", repo)
    path = _download(repo, config, progress, who)
    if not (path / "config.json").is_file():
        raise ModelFormatError(f"{who}{repo} has no config.json: not an MLX/transformers checkpoint "
                               "(for a GGUF repo, download the .gguf and name the file)")
    return path


def _download(repo: str, config: LoadConfig, progress: progress_mod.Progress, who: str) -> Path:
    from huggingface_hub import errors as hf_errors
    from huggingface_hub import snapshot_download

    repo_id, revision = split_revision(repo)
    login = "log in with `hf auth login` or set HF_TOKEN"
    try:
        return Path(snapshot_download(
            repo_id, revision=revision, cache_dir=config.hf_cache_dir,
            endpoint=config.hf_endpoint, allow_patterns=HF_PATTERNS,
            tqdm_class=progress_mod.hf_tqdm_class(progress)))
    except hf_errors.GatedRepoError:
        raise ConfigError(f"{who}{repo_id} is gated: accept its terms on the Hub, then {login}") from None
    except hf_errors.RepositoryNotFoundError:
        raise ConfigError(f"{who}Hugging Face repo {repo_id!r} not found (check the name; "
                          f"if it is private, {login})") from None
    except hf_errors.RevisionNotFoundError:
        raise ConfigError(f"{who}revision {revision!r} not found in {repo_id}") from None
    except hf_errors.HFValidationError as exc:
        raise ConfigError(f"{who}{repo!r} is not a valid Hugging Face repo id "
                          f"({_first_line(exc)})") from None
    except hf_errors.HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            raise ConfigError(f"{who}the Hub refused access to {repo_id} ({status}): {login}") from None
        raise ConfigError(f"{who}downloading {repo_id} failed: {_first_line(exc)}") from None
    except _transport_errors() as exc:
        raise ConfigError(f"{who}cannot download {repo_id} and it is not cached "
                          f"({_first_line(exc)}); check the network or HF_ENDPOINT") from None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """Connection failures, whichever HTTP client this huggingface_hub uses (requests'
    errors are OSErrors; httpx's and httpx2's are not)."""
    import importlib

    from huggingface_hub.errors import LocalEntryNotFoundError

    found: list[type[BaseException]] = [LocalEntryNotFoundError, OSError]
    for name in ("httpx2", "httpx"):
        try:
            found.append(importlib.import_module(name).HTTPError)
        except (ImportError, AttributeError):
            continue
    return tuple(found)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


# --- Ollama store (rule 4) ----------------------------------------------------
def ollama_manifest_path(ref: str, store: str | Path) -> Path:
    """`ollama:[host/][namespace/]name[:tag]` -> its manifest file (may not exist)."""
    name = ref.removeprefix("ollama:").strip()
    base, sep, tag = name.rpartition(":")
    if not sep or "/" in tag:
        base, tag = name, OLLAMA_TAG
    parts = [p for p in base.split("/") if p]
    if not parts or any(p in (".", "..") for p in parts) or not tag:
        raise ConfigError(f"invalid Ollama model reference {ref!r} (expected ollama:NAME[:TAG])")
    if len(parts) == 1:
        parts = [OLLAMA_HOST, OLLAMA_NAMESPACE, *parts]
    elif len(parts) == 2:
        parts = [OLLAMA_HOST, *parts]
    return Path(store).expanduser().joinpath("manifests", *parts, tag)


def ollama_model(ref: str, config: LoadConfig, *, model: str | None = None) -> OllamaModel:
    """Read the manifest of `ref`: its GGUF blob and params (rule 4)."""
    who = f"model {model!r}: " if model else ""
    store = Path(config.ollama_models).expanduser()
    manifest_path = ollama_manifest_path(ref, store)
    if not manifest_path.is_file():
        raise ConfigError(f"{who}{ref} is not in the Ollama store {store} "
                          f"(no {manifest_path.relative_to(store)}; run `ollama pull "
                          f"{ref.removeprefix('ollama:')}` or set OLLAMA_MODELS)")
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        layers = {layer["mediaType"]: layer["digest"] for layer in manifest["layers"]}
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelFormatError(f"{who}{manifest_path}: not an Ollama manifest ({exc})") from None
    if OLLAMA_MODEL_LAYER not in layers:
        raise ModelFormatError(f"{who}{manifest_path} has no {OLLAMA_MODEL_LAYER} layer")
    blob = _blob(store, layers[OLLAMA_MODEL_LAYER], who)
    if not is_gguf(blob):
        raise ModelFormatError(f"{who}{blob} (the model layer of {ref}) is not a GGUF file")
    params: dict[str, Any] = {}
    if OLLAMA_PARAMS_LAYER in layers:
        try:
            params = json.loads(_blob(store, layers[OLLAMA_PARAMS_LAYER], who).read_text())
        except ValueError as exc:
            raise ModelFormatError(f"{who}{ref}: params layer is not JSON ({exc})") from None
    return OllamaModel(ref, manifest_path, blob, params if isinstance(params, dict) else {})


def _blob(store: Path, digest: str, who: str) -> Path:
    algo, _, hexdigest = str(digest).partition(":")
    if not hexdigest or not hexdigest.isalnum():
        raise ModelFormatError(f"{who}bad layer digest {digest!r} in an Ollama manifest")
    path = store / "blobs" / f"{algo}-{hexdigest}"
    if not path.is_file():
        raise ConfigError(f"{who}Ollama blob {path} is missing (run `ollama pull` again)")
    return path


def ollama_defaults(params: dict[str, Any]
                    ) -> tuple[SamplingDefaults | None, tuple[str, ...], int | None]:
    """Rule 4: (sampling defaults, stop strings, context length) from a params layer.

    Values out of range for our sampler are dropped rather than refused: the
    params are the publisher's, not the user's."""
    sampling: SamplingDefaults | None = None
    fields = {ours: params[theirs] for theirs, ours in _OLLAMA_SAMPLING.items() if theirs in params}
    if fields:
        try:
            sampling = msgspec.convert(fields, SamplingDefaults)
        except msgspec.ValidationError:
            valid = {}
            for key, value in fields.items():
                try:
                    msgspec.convert({key: value}, SamplingDefaults)
                    valid[key] = value
                except msgspec.ValidationError:
                    continue
            sampling = msgspec.convert(valid, SamplingDefaults) if valid else None
    stop = params.get("stop")
    stops = tuple(s for s in stop if isinstance(s, str) and s) if isinstance(stop, list) else ()
    num_ctx = params.get("num_ctx")
    ctx = int(num_ctx) if isinstance(num_ctx, int) and num_ctx > 0 else None
    return sampling, stops, ctx


def pull(repo: str, config: LoadConfig) -> Path:
    """`frink-mlx pull REPO[@REV]`: the snapshot dir, downloaded if not cached."""
    if source_kind(repo) != "hf":
        raise ConfigError(f"{repo!r} is not a Hugging Face repo id (expected org/name[@revision])")
    return hf_snapshot(repo, config)
