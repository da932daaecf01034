"""Frozen daemon settings: the only module that reads the environment.

Config flows down once: the CLI parses argv into overrides, `Settings.load`
merges them over `FRINK_MLX_*` environment variables over defaults, and the
result is passed to everything else. Nothing below this module looks at
`os.environ` (the one exception is the BLAS re-exec marker, read here too).

Precedence: CLI flag > environment variable > default.

A process started by `mlx.launch` is a rank of a distributed group: MLX's own
MLX_RANK and MLX_HOSTFILE stand in for `--rank` and `--distributed`
(backend/distributed.py).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import msgspec

from .backend.distributed import GroupConfig
from .config import BackendConfig, BudgetConfig, EncoderConfig, EngineLimits, HubConfig, LoadConfig
from .errors import ConfigError

DEFAULT_PORT = 8177
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
    header_timeout_s: float = 30.0               # request line + headers must arrive in this
                                                 # long (in total); else 408 / close
    body_timeout_s: float = 30.0                 # the whole body must arrive in this long; else 408
    idle_timeout_s: float = 15.0                 # a keep-alive connection idle this long is closed
    # --- models ---
    models_path: str | None = None               # --models / FRINK_MLX_MODELS
    config_dir: str = msgspec.field(default_factory=_default_config_dir)
    cache_dir: str = msgspec.field(default_factory=_default_cache_dir)
    default_model: str | None = None             # overrides the registry's `default`
    auto_swap: bool = True
    min_generation_s: float = 2.0                # a generation lives at least this long before a swap
    keep_alive_s: float | None = None            # idle unload after this many seconds (None = never)
    dequantize: bool | None = None               # None = auto (on for CPU backend where memory allows)
    use_openblas: bool = True
    # --- engine ---
    batching: bool = True
    max_batch: int = 16
    block_size: int = 4                          # tokens per KV block (prefix-cache granularity:
                                                 # a prompt reuses its shared prefix rounded down to it)
    prefill_chunk_tokens: int = 256              # prefill tokens per step while streams decode
    idle_prefill_tokens: int = 768               # ... and in a step that decodes nothing
    admission_window_ms: float = 25.0            # an idle engine gathers a burst this long
    pipeline: bool | None = None                 # dispatch decode step t+1 before reading t;
                                                 # None: on Metal yes, on the CPU backend no
    cpu_matmul_parts: int | None = None          # CPU backend: split each matmul over this many
                                                 # MLX streams (backend/cpu/split.py); None = one
                                                 # per usable core (at most 8), 1 = off
    kv_budget_bytes: int | None = None           # explicit device budget override
    memory_headroom_fraction: float = 0.2
    max_kv_pool_bytes: int = 2 * 1024**3        # cap on the KV pool, however much memory is free
    max_queue: int = 64                          # requests waiting beyond this get 503
    queue_timeout_s: float = 30.0                # a request waiting on a full KV pool this long gets 503
    # --- lifecycle ---
    drain_timeout_s: float = 10.0
    log_level: str = "info"
    access_log: bool = True
    embed_batch_size: int = 32
    # --- several machines (backend/distributed.py, engine/channel.py) ---
    distributed_hostfile: str | None = None      # --distributed HOSTFILE (MLX hostfile JSON)
    distributed_rank: int | None = None          # --rank; 0 serves HTTP, the others follow
    distributed_backend: str = "ring"            # ring | jaccl | mpi | any (MLX's backends)
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

    # --- slices for the layers below the composition root (config.py) ----------
    def load_config(self) -> LoadConfig:
        return LoadConfig(cache_dir=self.cache_dir, dequantize=self.dequantize,
                          encoder=self.encoder_config())

    def budget_config(self) -> BudgetConfig:
        return BudgetConfig(block_size=self.block_size, max_batch=self.max_batch,
                            kv_budget_bytes=self.kv_budget_bytes,
                            memory_headroom_fraction=self.memory_headroom_fraction,
                            max_kv_pool_bytes=self.max_kv_pool_bytes)

    def engine_limits(self) -> EngineLimits:
        return EngineLimits(max_batch=self.max_batch, batching=self.batching,
                            prefill_chunk_tokens=self.prefill_chunk_tokens,
                            idle_prefill_tokens=self.idle_prefill_tokens,
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
        return GroupConfig(hostfile=self.distributed_hostfile, rank=self.distributed_rank,
                           backend=self.distributed_backend)  # type: ignore[arg-type]

    def hub_config(self) -> HubConfig:
        return HubConfig(auto_swap=self.auto_swap, min_generation_s=self.min_generation_s,
                         keep_alive_s=self.keep_alive_s, drain_timeout_s=self.drain_timeout_s,
                         load=self.load_config(), budget=self.budget_config(),
                         engine=self.engine_limits())


def user_config_home() -> str:
    """$XDG_CONFIG_HOME or ~/.config: where systemd looks for user units."""
    return os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")


def environ_snapshot() -> dict[str, str]:
    """A copy of the environment, for the one place that must re-exec the process
    (backend/cpu/blas.py, through backend/select.py)."""
    return dict(os.environ)
