"""Frozen daemon settings: the only module that reads the environment.

Config flows down once: the CLI parses argv into overrides, `Settings.load`
merges them over `FRINK_MLX_*` environment variables over defaults, and the
result is passed to everything else. Nothing below this module looks at
`os.environ` (the one exception is the BLAS re-exec marker, read here too).

Precedence: CLI flag > environment variable > default.

Model stores other tools own keep their own variables, read here as the
defaults of our settings (a `FRINK_MLX_*` one still wins): `HF_HUB_OFFLINE`,
`HF_ENDPOINT`, `HF_HUB_CACHE` (else `HF_HOME`/hub) for the Hugging Face cache,
`OLLAMA_MODELS` for the Ollama store. huggingface_hub reads its own token.
`SETTING_DOCS` (setting_docs.py) is the one table of what each setting means: `frink-mlx
serve` builds one flag per field from it (cli_flags.py, with the default and
the environment variable in the help), and README.md's settings section is
generated from it (a test checks every field has a row, a flag and a README
line). A new Settings field needs one row there.

A process started by `mlx.launch` is a rank of a distributed group: MLX's own
MLX_RANK and MLX_HOSTFILE stand in for `--rank` and `--distributed`
(backend/distributed.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated, Any

import msgspec

from .backend.distributed import SPLIT_CHOICES, GroupConfig
from .config import (
    BackendConfig,
    BudgetConfig,
    DiskConfig,
    EncoderConfig,
    EngineLimits,
    HubConfig,
    ImageLimits,
    KVBits,
    LoadConfig,
)
from .errors import ConfigError
from .setting_docs import SETTING_DOCS, SettingDoc  # noqa: F401 (re-exported: cli_flags, tests)

DEFAULT_PORT = 8177
# Bounds msgspec checks while loading, so a bad value is refused naming its setting
# before anything starts (`Settings.load`).
AtLeast1 = Annotated[int, msgspec.Meta(ge=1)]
AtLeast2 = Annotated[int, msgspec.Meta(ge=2)]
ENV_PREFIX = "FRINK_MLX_"


def _default_cache_dir() -> str:
    if sys.platform == "darwin":
        return str(Path.home() / "Library" / "Caches" / "frink-mlx")
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return str(Path(base) / "frink-mlx")


def _default_config_dir() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return str(Path(base) / "frink-mlx")


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every knob of the daemon. Units are in the names."""

    # --- network ---
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    api_key: str | None = None
    api_key_file: str | None = None
    allowed_hosts: tuple[str, ...] = ()          # extra Host names beyond loopback ones
    cors_origins: tuple[str, ...] = ()           # exact origins; none by default
    max_body_bytes: int = 8 * 1024 * 1024
    strict_fields: bool = False                  # unknown request fields: 400 instead of
                                                 # a x-frink-ignored-fields header (http/fields.py)
    refuse_images: bool = False                  # image parts: 400 instead of a placeholder
    max_images: int = 32                         # image parts per request (vision models)
    max_image_bytes: int = 20 * 1024 * 1024      # one image's decoded bytes
    max_image_pixels: int = 50_000_000           # one image's width x height
    fetch_image_urls: bool = False               # http(s) image URLs: fetch them (else 400)
                                                 # text (core/images.py)
    header_timeout_s: float = 30.0               # request line + headers must arrive in this
                                                 # long (in total); else 408 / close
    body_timeout_s: float = 30.0                 # the whole body must arrive in this long; else 408
    idle_timeout_s: float = 15.0                 # a keep-alive connection idle this long is closed
    send_timeout_s: float = 60.0                 # a response the client reads none of this long
                                                 # is aborted (http/timeouts.py rule 6)
    max_connections: AtLeast1 = 512              # open connections beyond this get 503 at once
    ssl_certfile: str | None = None              # serve HTTPS with this certificate (PEM) ...
    ssl_keyfile: str | None = None               # ... and its private key (PEM)
    # --- models ---
    models_path: str | None = None               # --models / FRINK_MLX_MODELS
    config_dir: str = msgspec.field(default_factory=_default_config_dir)
    cache_dir: str = msgspec.field(default_factory=_default_cache_dir)
    default_model: str | None = None             # overrides the registry's `default`
    auto_swap: bool = True
    fallback: bool | None = None                 # unknown model names -> the default model (its
                                                 # side-car for embeddings); None = on when the
                                                 # daemon binds a loopback address only
    min_generation_s: float = 2.0                # a generation lives at least this long before a swap
    keep_alive_s: float | None = None            # idle unload after this many seconds (None = never)
    max_resident_models: int = 0                 # models resident at once; 0 = as memory allows
    evict_wait_s: float = 10.0                   # a load waits this long for busy models to go idle
    dequantize: bool | None = None               # None = auto (on for CPU backend where memory allows)
    use_openblas: bool = True
    hf_offline: bool = False                     # HF_HUB_OFFLINE: the HF cache only, no network
    hf_endpoint: str | None = None               # HF_ENDPOINT (None: huggingface_hub's default)
    hf_cache_dir: str | None = None              # HF_HUB_CACHE / $HF_HOME/hub (None: its default)
    ollama_models: str = msgspec.field(default_factory=lambda: str(Path.home() / ".ollama" / "models"))
    # --- engine ---
    batching: bool = True
    max_batch: int = 16
    block_size: int = 4                          # tokens per KV block (prefix-cache granularity:
                                                 # a prompt reuses its shared prefix rounded down to it)
    prefill_chunk_tokens: int = 256              # prefill tokens per step while streams decode
    idle_prefill_tokens: int = 768               # ... and in a step that decodes nothing
    shared_prefill_tokens: int = 16              # ... while another model's engine runs
                                                 # (engine/gate.py rule 5: bounds its streams'
                                                 # inter-token gap to one such chunk)
    admission_window_ms: float = 25.0            # an idle engine gathers a burst this long
    pipeline: bool | None = None                 # dispatch decode step t+1 before reading t;
                                                 # None: on Metal yes, on the CPU backend no
    cpu_matmul_parts: int | None = None          # CPU backend: split each matmul over this many
                                                 # MLX streams (backend/cpu/split.py); None = one
                                                 # per usable core (at most 8), 1 = off
    speculative: bool = True                     # speculative decoding in the batch: prompt lookup,
                                                 # and an entry's `draft` model (engine/speculative/); per
                                                 # request `speculative: false`
    spec_max_draft: AtLeast1 = 8                 # most tokens a row drafts per step
    spec_ngram: AtLeast2 = 4                     # longest suffix n-gram looked up in the context
    spec_max_rows: int = 8                       # a step decoding more rows does not speculate
    spec_draft_rows: AtLeast1 = 2                # full contexts the draft model's KV pool holds
    kv_budget_bytes: int | None = None           # explicit device budget override
    memory_headroom_fraction: float = 0.2
    max_kv_pool_bytes: int = 2 * 1024**3        # cap on the KV pool, however much memory is free
    kv_bits: KVBits | None = None                # KV blocks in 8 or 4 bits (engine/kv/quantized.py);
                                                 # None = the model's float type; an entry's own wins
    kv_disk_dir: str | None = None               # the prefix cache's SSD tier; None = <cache_dir>/kv
    kv_disk_bytes: int = 10 * 1024**3            # its byte budget (LRU beyond it); 0 = tier off
    max_queue: int = 64                          # requests waiting beyond this get 503
    queue_timeout_s: float = 30.0                # a request waiting on a full KV pool this long gets 503
    # --- lifecycle ---
    drain_timeout_s: float = 10.0
    log_level: str = "info"
    access_log: bool = True
    access_log_file: str | None = None           # access lines to this file, rotated (else stderr)
    access_log_max_bytes: AtLeast1 = 16 * 1024 * 1024
    access_log_backups: int = 3                  # rotated files kept beside it
    embed_batch_size: int = 32
    # --- several machines (backend/distributed.py, engine/channel.py) ---
    distributed_hostfile: str | None = None      # --distributed HOSTFILE (MLX hostfile JSON)
    distributed_rank: int | None = None          # --rank; 0 serves HTTP, the others follow
    distributed_backend: str = "ring"            # ring | jaccl | mpi | any (MLX's backends)
    distributed_split: str = "auto"              # auto | tensor | pipeline (backend/distributed.py)
    distributed_timeout_s: float = 60.0          # a step's collectives past this: group lost
    distributed_load_timeout_s: float = 900.0    # ... a load's commit round (every rank loads)
    distributed_ping_s: float = 1.0              # rank 0 checks an idle group this often
    distributed_exit_after_lost_s: float | None = 10.0  # rank 0 exits 1 this long after the group
                                                 # is lost, so its supervisor restarts the group
                                                 # (None: stay up answering 503)

    @classmethod
    def load(cls, **overrides: Any) -> "Settings":
        """Merge CLI overrides (None = not given) over FRINK_MLX_* env over defaults."""
        values: dict[str, Any] = {}
        fields = {f.name: f for f in msgspec.structs.fields(cls)}
        for name in fields:
            raw = os.environ.get(ENV_PREFIX + name.upper())
            if raw is not None and raw != "":
                values[name] = raw
        if "models_path" not in values and os.environ.get(ENV_PREFIX + "MODELS"):
            values["models_path"] = os.environ[ENV_PREFIX + "MODELS"]
        for name, value in _foreign_stores().items():
            values.setdefault(name, value)
        for name, variable in (("distributed_rank", "MLX_RANK"),
                               ("distributed_hostfile", "MLX_HOSTFILE")):
            if name not in values and os.environ.get(variable):  # started by mlx.launch
                values[name] = os.environ[variable]
        for name, value in overrides.items():
            if value is not None:
                values[name] = value
        for name, value in list(values.items()):
            if isinstance(value, str) and name in ("allowed_hosts", "cors_origins"):
                values[name] = tuple(v.strip() for v in value.split(",") if v.strip())
        try:
            return msgspec.convert(values, cls, strict=False)
        except msgspec.ValidationError as exc:
            raise ConfigError(f"invalid setting: {exc}") from None

    def fallback_enabled(self) -> bool:
        """`fallback`, or when unset: on for a daemon bound to a loopback address only."""
        if self.fallback is not None:
            return self.fallback
        return self.host in ("127.0.0.1", "localhost", "::1") or self.host.startswith("127.")

    # --- slices for the layers below the composition root (config.py) ----------
    def load_config(self) -> LoadConfig:
        return LoadConfig(cache_dir=self.cache_dir, dequantize=self.dequantize,
                          encoder=self.encoder_config(), hf_offline=self.hf_offline,
                          hf_endpoint=self.hf_endpoint, hf_cache_dir=self.hf_cache_dir,
                          ollama_models=self.ollama_models)

    def budget_config(self) -> BudgetConfig:
        return BudgetConfig(block_size=self.block_size, max_batch=self.max_batch,
                            kv_budget_bytes=self.kv_budget_bytes,
                            memory_headroom_fraction=self.memory_headroom_fraction,
                            max_kv_pool_bytes=self.max_kv_pool_bytes, reserved_bytes=0,
                            kv_bits=self.kv_bits)

    def engine_limits(self) -> EngineLimits:
        return EngineLimits(max_batch=self.max_batch, batching=self.batching,
                            speculative=self.speculative, spec_max_draft=self.spec_max_draft,
                            spec_ngram=self.spec_ngram, spec_max_rows=self.spec_max_rows,
                            spec_draft_rows=self.spec_draft_rows,
                            prefill_chunk_tokens=self.prefill_chunk_tokens,
                            idle_prefill_tokens=self.idle_prefill_tokens,
                            shared_prefill_tokens=self.shared_prefill_tokens,
                            admission_window_ms=self.admission_window_ms,
                            pipeline=self.pipeline, max_queue=self.max_queue,
                            queue_timeout_s=self.queue_timeout_s)

    def encoder_config(self) -> EncoderConfig:
        return EncoderConfig(embed_batch_size=self.embed_batch_size)

    def backend_config(self) -> BackendConfig:
        return BackendConfig(use_openblas=self.use_openblas,
                             cpu_matmul_parts=self.cpu_matmul_parts)

    @property
    def distributed(self) -> bool:
        """This process is one rank of a group (module docstring)."""
        return self.distributed_hostfile is not None or self.distributed_rank is not None

    def group_config(self) -> GroupConfig:
        if self.distributed_backend not in ("ring", "jaccl", "mpi", "any"):
            raise ConfigError(f"invalid setting: distributed_backend {self.distributed_backend!r}"
                              " is none of ring, jaccl, mpi, any")
        if self.distributed_split not in SPLIT_CHOICES:
            raise ConfigError(f"invalid setting: distributed_split {self.distributed_split!r}"
                              " is none of auto, tensor, pipeline")
        return GroupConfig(hostfile=self.distributed_hostfile, rank=self.distributed_rank,
                           backend=self.distributed_backend,  # type: ignore[arg-type]
                           split=self.distributed_split)

    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_images=self.max_images, max_image_bytes=self.max_image_bytes,
                           max_image_pixels=self.max_image_pixels,
                           fetch_urls=self.fetch_image_urls)

    def hub_config(self) -> HubConfig:
        return HubConfig(auto_swap=self.auto_swap, min_generation_s=self.min_generation_s,
                         keep_alive_s=self.keep_alive_s, drain_timeout_s=self.drain_timeout_s,
                         max_resident_models=self.max_resident_models,
                         evict_wait_s=self.evict_wait_s,
                         load=self.load_config(), budget=self.budget_config(),
                         engine=self.engine_limits(), disk=self.disk_config())

    def disk_config(self) -> DiskConfig | None:
        """The SSD tier, or None when its budget is 0 or the daemon is a distributed rank
        (each rank holds its own shard of the KV pools)."""
        if self.kv_disk_bytes <= 0 or self.distributed:
            return None
        directory = self.kv_disk_dir or str(Path(self.cache_dir).expanduser() / "kv")
        return DiskConfig(directory=directory, budget_bytes=self.kv_disk_bytes)


def _foreign_stores() -> dict[str, Any]:
    """Settings defaults from the Hugging Face and Ollama variables (module docstring)."""
    env = os.environ
    found: dict[str, Any] = {}
    offline = env.get("HF_HUB_OFFLINE", "").strip().upper()
    if offline:
        found["hf_offline"] = offline in ("1", "ON", "YES", "TRUE")
    if env.get("HF_ENDPOINT"):
        found["hf_endpoint"] = env["HF_ENDPOINT"].rstrip("/")
    if env.get("HF_HUB_CACHE"):
        found["hf_cache_dir"] = env["HF_HUB_CACHE"]
    elif env.get("HF_HOME"):
        found["hf_cache_dir"] = str(Path(env["HF_HOME"]).expanduser() / "hub")
    if env.get("OLLAMA_MODELS"):
        found["ollama_models"] = env["OLLAMA_MODELS"]
    return found


def user_config_home() -> str:
    """$XDG_CONFIG_HOME or ~/.config: where systemd looks for user units."""
    return os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")


def agent_homes() -> tuple[str, str, str]:
    """($HOME, $XDG_CONFIG_HOME or ~/.config, $CODEX_HOME or ~/.codex): where the coding agents
    `frink-mlx launch` configures keep their files (launch.py)."""
    home = str(Path.home())
    return home, user_config_home(), os.environ.get("CODEX_HOME") or str(Path(home) / ".codex")


def environ_snapshot() -> dict[str, str]:
    """A copy of the environment, for the one place that must re-exec the process
    (backend/cpu/blas.py, through backend/select.py)."""
    return dict(os.environ)


def started_by_mlx_launch() -> bool:
    """True for a rank that `mlx.launch` started (it sets MLX_RANK for each; frink-mlx's own
    `--rank` exports it only later, in backend/distributed.py `init_group`). Such a rank's
    parent process is the launcher, and the group ends with it (server.py rule 8)."""
    return bool(os.environ.get("MLX_RANK"))
