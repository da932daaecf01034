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
What a setting means is written on its field (`doc(...)`: msgspec metadata, so
its JSON schema says it too); `SETTING_DOCS` reads those back as the table
`frink-mlx serve` builds its flags from (cli/flags.py) and README.md's settings
section is generated from (a test checks each field has a doc, a flag and a row).

A process started by `mlx.launch` is a rank of a distributed group: MLX's own
MLX_RANK and MLX_HOSTFILE stand in for `--rank` and `--distributed`
(backend/distributed.py).
"""

from __future__ import annotations

import os
import sys
import typing
from pathlib import Path
from typing import Annotated, Any, NamedTuple

import msgspec

from .backend.distributed import SPLIT_CHOICES, GroupConfig
from .backend.trust import SECRET_FILE_NAME
from .config import (
    BackendConfig,
    BudgetConfig,
    DiskConfig,
    EncoderConfig,
    EngineLimits,
    FrontendConfig,
    HubConfig,
    ImageLimits,
    KVBits,
    LoadConfig,
)
from .errors import ConfigError

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


def _default_ollama_models() -> str:
    return str(Path.home() / ".ollama" / "models")


class SettingDoc(NamedTuple):
    """What one setting means, as its field says it (`doc`)."""

    help: str                      # one line; says what an unset (None) value means
    flags: tuple[str, ...] = ()    # flag names when not `--field-name`; the first is shown
    default: str = ""              # the default as shown, when it is computed at run time


def doc(help: str, *, flags: tuple[str, ...] = (), default: str = "") -> msgspec.Meta:
    """A field's documentation (SettingDoc's parts) as msgspec metadata."""
    return msgspec.Meta(description=help, extra={"flags": flags, "default": default})


class Settings(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Every knob of the daemon. Units are in the names."""

    # --- network ---
    host: Annotated[str, doc("address to bind; a non-loopback address needs an API key")] = "127.0.0.1"
    port: Annotated[int, doc("TCP port; 0 picks a free one (the ready line names it)")] = DEFAULT_PORT
    api_key: Annotated[str | None, doc(
        "API key clients must send (Bearer or x-api-key); unset: none unless a key file exists")] = None
    api_key_file: Annotated[str | None, doc(
        "file holding the API key (mode 0600); unset: the file api_key in config_dir when it "
        "exists")] = None
    allowed_hosts: Annotated[tuple[str, ...], doc(
        "extra Host header names accepted beyond loopback ones (repeat the flag; env: "
        "comma-separated)", flags=("--allowed-host",))] = ()
    cors_origins: Annotated[tuple[str, ...], doc(
        "exact browser origins allowed by CORS (repeat the flag; env: "
        "comma-separated)", flags=("--cors-origin",))] = ()
    max_body_bytes: Annotated[int, doc("request bodies larger than this get 413")] = 8 * 1024 * 1024
    strict_fields: Annotated[bool, doc(
        "refuse unknown request fields by name (400) instead of accepting and reporting them "
        "(x-frink-ignored-fields)")] = False
    refuse_images: Annotated[bool, doc(
        "refuse image parts by name (400) instead of replacing each with a short placeholder text "
        "(x-frink-images-omitted)")] = False
    max_images: Annotated[int, doc(
        "most image parts one request may carry to a vision model (400 naming the part beyond it)")] = 32
    max_image_bytes: Annotated[int, doc(
        "most decoded bytes of one image (400 naming the part)")] = 20 * 1024 * 1024
    max_image_pixels: Annotated[int, doc(
        "most pixels (width x height) of one image, checked before it is decoded (400 naming the "
        "part)")] = 50_000_000
    fetch_image_urls: Annotated[bool, doc(
        "fetch http(s) image URLs for vision models (10 s, max_image_bytes; off: such a part is a 400 "
        "naming it, so a client cannot make the daemon reach other hosts)")] = False
    header_timeout_s: Annotated[float, doc(
        "the request line and headers must arrive within this many seconds, else 408 or the connection is "
        "closed")] = 30.0
    body_timeout_s: Annotated[float, doc(
        "the whole request body must arrive within this many seconds, else 408")] = 30.0
    idle_timeout_s: Annotated[float, doc("a keep-alive connection idle this many seconds is closed")] = 15.0
    send_timeout_s: Annotated[float, doc(
        "a response the client reads nothing of for this many seconds is aborted (its generation stopped; "
        "logged 499); a slow but steady reader is never cut")] = 60.0
    send_buffer_bytes: Annotated[AtLeast1, doc(
        "the kernel send buffer of each connection: how much a client that stops reading is sent before "
        "send_timeout_s starts counting (the OS would grow it to megabytes)")] = 256 * 1024
    max_connections: Annotated[AtLeast1, doc(
        "open connections at most; a new one past it is answered 503 before anything of it is read (the "
        "open-files limit is raised to fit)")] = 512
    ssl_certfile: Annotated[str | None, doc(
        "serve HTTPS with this certificate chain (PEM; with ssl_keyfile); unset: plain HTTP")] = None
    ssl_keyfile: Annotated[str | None, doc("the private key of ssl_certfile (PEM)")] = None
    # --- models ---
    models_path: Annotated[str | None, doc(
        "models.toml to use (env also FRINK_MLX_MODELS); unset: ~/.config/frink-mlx/models.toml, then the "
        "packaged one", flags=("--models",))] = None
    config_dir: Annotated[str, doc(
        "where the user's key file lives",
        default="$XDG_CONFIG_HOME/frink-mlx or "
                "~/.config/frink-mlx")] = msgspec.field(default_factory=_default_config_dir)
    cache_dir: Annotated[str, doc(
        "where converted (GGUF-imported) checkpoints are cached",
        default="~/Library/Caches/frink-mlx on macOS, else $XDG_CACHE_HOME/frink-mlx or "
                "~/.cache/frink-mlx")] = msgspec.field(default_factory=_default_cache_dir)
    default_model: Annotated[str | None, doc(
        "model to load at start; unset: the registry's `default`", flags=("--model",))] = None
    auto_swap: Annotated[bool, doc(
        "a request naming another registry entry swaps to it (--no-auto-swap answers 409 instead)")] = True
    fallback: Annotated[bool | None, doc(
        "serve unknown model names with the default model (embeddings: the embedding model); unset: on for "
        "a loopback-only daemon")] = None
    min_generation_s: Annotated[float, doc(
        "a loaded model lives at least this many seconds before a swap may replace it")] = 2.0
    keep_alive_s: Annotated[float | None, doc(
        "unload after this many idle seconds, reload on the next request; unset: "
        "never", flags=("--keep-alive", "--keep-alive-s"))] = None
    max_resident_models: Annotated[int, doc(
        "models kept loaded at once; 0: as many as the memory budget holds (1: the classic single-model "
        "swap)")] = 0
    evict_wait_s: Annotated[float, doc(
        "a load that needs memory held by busy models waits this long for them to go idle, then answers 503 "
        "with Retry-After")] = 10.0
    dequantize: Annotated[bool | None, doc(
        "dequantize quantized weights to float32 on the CPU backend; unset: the model's entry, else where "
        "memory allows")] = None
    use_openblas: Annotated[bool, doc(
        "re-execute once with the system OpenBLAS preloaded (Linux)", flags=("--openblas",))] = True
    hf_offline: Annotated[bool, doc(
        "resolve Hugging Face repo ids from the local cache only, never the network (env also "
        "HF_HUB_OFFLINE)")] = False
    hf_endpoint: Annotated[str | None, doc(
        "Hugging Face Hub endpoint (env also HF_ENDPOINT); unset: huggingface_hub's default")] = None
    hf_cache_dir: Annotated[str | None, doc(
        "Hugging Face cache directory (env also HF_HUB_CACHE / $HF_HOME/hub); unset: huggingface_hub's "
        "default")] = None
    ollama_models: Annotated[str, doc(
        "the Ollama store that `ollama:NAME[:TAG]` sources read (env also OLLAMA_MODELS)",
        default="~/.ollama/models")] = msgspec.field(default_factory=_default_ollama_models)
    # --- engine ---
    batching: Annotated[bool, doc(
        "continuous batching; --no-batching decodes one request at a time")] = True
    max_batch: Annotated[int, doc("sequences decoded together at most")] = 16
    block_size: Annotated[int, doc(
        "tokens per KV block: the prefix cache reuses a shared prefix rounded down to it")] = 4
    prefill_chunk_tokens: Annotated[int, doc(
        "prompt tokens prefilled per step while other streams decode")] = 256
    idle_prefill_tokens: Annotated[int, doc("prompt tokens prefilled in a step that decodes nobody")] = 768
    shared_prefill_tokens: Annotated[int, doc(
        "prompt tokens prefilled per step while another resident model's engine runs (bounds its streams' "
        "inter-token gap; the least a step that only prefills takes, engine/turns.py)")] = 16
    admission_window_ms: Annotated[float, doc(
        "an idle engine gathers a burst of requests this long into one step")] = 25.0
    pipeline: Annotated[bool | None, doc(
        "dispatch decode step t+1 before reading step t; unset: on Metal only")] = None
    cpu_matmul_parts: Annotated[int | None, doc(
        "CPU backend: split each matmul over this many MLX streams; unset: one per usable core (at most 8); "
        "1 turns it off")] = None
    speculative: Annotated[bool, doc(
        "speculative decoding inside the batch: prompt lookup, and the draft model of an entry naming "
        "`draft` (not loaded when off; greedy output unchanged); requests opt out with `speculative: "
        "false`")] = True
    spec_max_draft: Annotated[AtLeast1, doc("most tokens one row drafts per step")] = 8
    spec_ngram: Annotated[AtLeast2, doc("longest suffix n-gram looked up in the row's context")] = 4
    spec_max_rows: Annotated[int, doc("a step decoding more rows than this does not speculate")] = 8
    spec_draft_rows: Annotated[AtLeast1, doc(
        "rows the draft model keeps KV for: its pool holds this many full contexts")] = 2
    kv_budget_bytes: Annotated[int | None, doc(
        "device memory budget for weights and KV; unset: measured (Metal's working set or physical "
        "RAM)")] = None
    memory_headroom_fraction: Annotated[float, doc(
        "fraction of the budget kept free when sizing the KV pool")] = 0.2
    max_kv_pool_bytes: Annotated[int, doc(
        "cap on one model's KV pool, however much memory is free")] = 2 * 1024**3
    kv_bits: Annotated[KVBits | None, doc(
        "store KV blocks in 8 or 4 bits (MLX affine quantization in groups of 32 features for float32 "
        "models, 64 for 16-bit ones): head dim 64 holds 3.2x or 5.3x the float32 context in the same "
        "memory (1.9x or 3.6x the float16); greedy output drifts from float KV's; a models.toml entry's "
        "`kv_bits` wins; unset: the model's float type")] = None
    kv_disk_dir: Annotated[str | None, doc(
        "where the prefix cache's SSD tier keeps KV blocks (they survive restarts, swaps and evictions)",
        default="cache_dir/kv: ~/Library/Caches/frink-mlx/kv on macOS, else $XDG_CACHE_HOME/frink-mlx/kv or "
                "~/.cache/frink-mlx/kv")] = None
    kv_disk_bytes: Annotated[int, doc(
        "byte budget of the SSD tier (least recently used blocks go first); 0 turns the tier "
        "off")] = 10 * 1024**3
    max_queue: Annotated[int, doc("requests waiting beyond this many get 503 with Retry-After")] = 64
    queue_timeout_s: Annotated[float, doc("a request waiting this long for KV room gets 503")] = 30.0
    # --- lifecycle ---
    drain_timeout_s: Annotated[float, doc(
        "on SIGTERM, seconds in-flight requests may take to finish")] = 10.0
    log_level: Annotated[str, doc("debug, info, warning, error or critical")] = "info"
    access_log: Annotated[bool, doc(
        "one JSON access-log line per request (on stderr, or in access_log_file)")] = True
    access_log_file: Annotated[str | None, doc(
        "write access-log lines to this file, rotated by size, instead of stderr; unset: stderr (`service "
        "install` on macOS sets ~/Library/Logs/frink-mlx/access.log)")] = None
    access_log_max_bytes: Annotated[AtLeast1, doc(
        "the access-log file is rotated past this size")] = 16 * 1024 * 1024
    access_log_backups: Annotated[int, doc("rotated access-log files kept (access.log.1 ... .N)")] = 3
    embed_batch_size: Annotated[int, doc("texts embedded together at most")] = 32
    # --- several machines (backend/distributed.py, engine/channel.py) ---
    distributed_hostfile: Annotated[str | None, doc(
        "serve one model over a group of machines: the MLX hostfile (env also MLX_HOSTFILE under "
        "mlx.launch)", flags=("--distributed",))] = None
    distributed_rank: Annotated[int | None, doc(
        "this machine's rank in the hostfile; 0 serves HTTP, the others follow (env also "
        "MLX_RANK)", flags=("--rank",))] = None
    distributed_backend: Annotated[str, doc("MLX distributed backend: ring, jaccl, mpi or any")] = "ring"
    distributed_split: Annotated[str, doc(
        "how a model is split over the group: tensor (each rank a slice of every layer), pipeline (each "
        "rank a run of layers), or auto (tensor where the model allows, else pipeline); ranks set "
        "differently load nothing")] = "auto"
    distributed_timeout_s: Annotated[float, doc(
        "a step's collectives taking longer than this mark the group lost")] = 60.0
    distributed_load_timeout_s: Annotated[float, doc(
        "how long every rank may take to load a model")] = 900.0
    distributed_ping_s: Annotated[float, doc("rank 0 checks an idle group this often")] = 1.0
    distributed_secret_file: Annotated[str | None, doc(
        "the group's shared secret, the same file (mode 0600) on every rank; unset: "
        "<config_dir>/group_secret, which `service install --distributed` writes")] = None
    distributed_join_timeout_s: Annotated[float, doc(
        "a rank whose group has not formed and proven the secret within this exits 1 (a missing rank, or "
        "a stray connection in a ring slot)")] = 60.0
    distributed_exit_after_lost_s: Annotated[float | None, doc(
        "rank 0 exits 1 this long after losing the group, so the service manager restarts it; unset: stay "
        "up answering 503")] = 10.0

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
                           split=self.distributed_split,
                           secret_file=self.group_secret_file(),
                           join_timeout_s=self.distributed_join_timeout_s)

    def group_secret_file(self) -> str:
        """The group's shared secret (backend/trust.py rule 1)."""
        return self.distributed_secret_file or str(Path(self.config_dir) / SECRET_FILE_NAME)

    def image_limits(self) -> ImageLimits:
        return ImageLimits(max_images=self.max_images, max_image_bytes=self.max_image_bytes,
                           max_image_pixels=self.max_image_pixels,
                           fetch_urls=self.fetch_image_urls)

    def frontend_config(self) -> FrontendConfig:
        return FrontendConfig(max_batch=self.max_batch, max_body_bytes=self.max_body_bytes,
                              strict_fields=self.strict_fields, refuse_images=self.refuse_images,
                              auto_swap=self.auto_swap, images=self.image_limits())

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


def _docs_of(struct: type[msgspec.Struct]) -> dict[str, SettingDoc]:
    """Each field's `doc(...)`, in field order (a field without one is left out: the test
    that every setting is documented names it)."""
    docs: dict[str, SettingDoc] = {}
    for field in msgspec.structs.fields(struct):
        meta = next((m for m in typing.get_args(field.type)[1:]
                     if isinstance(m, msgspec.Meta) and m.description), None)
        if meta is not None and meta.description:
            extra = meta.extra or {}
            docs[field.name] = SettingDoc(meta.description, extra.get("flags", ()),
                                          extra.get("default", ""))
    return docs


SETTING_DOCS: dict[str, SettingDoc] = _docs_of(Settings)  # what `serve`'s flags and README say


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
    `frink-mlx launch` configures keep their files (cli/launch.py)."""
    home = str(Path.home())
    return home, user_config_home(), os.environ.get("CODEX_HOME") or str(Path(home) / ".codex")


def environ_snapshot() -> dict[str, str]:
    """A copy of the environment, for the one place that must re-exec the process
    (backend/cpu/blas.py, through backend/select.py)."""
    return dict(os.environ)


def started_by_mlx_launch() -> bool:
    """True for a rank that `mlx.launch` started (it sets MLX_RANK for each; frink-mlx's own
    `--rank` exports it only later, in backend/distributed.py `init_group`). Such a rank's
    parent process is the launcher, and the group ends with it (cli/serve.py rule 8)."""
    return bool(os.environ.get("MLX_RANK"))
