"""Config slices: what each layer below the composition root may know.

`Settings` (settings.py) is the daemon's one flat table of knobs, read once
from flags and the environment. Nothing below `serving/` sees it: the
composition root (app.py, and the CLI entry points) slices it once with
`Settings.hub_config()` and hands each layer the part it uses, so a layer's
signature says exactly which knobs can change its behaviour and tests build
the slice they need without a whole daemon's configuration.

    Settings ── hub_config() ─> HubConfig ─┬─ load:   LoadConfig     models/loader.py
                                            │    └─ encoder: EncoderConfig  models/encoder/
                                            ├─ budget: BudgetConfig   models/budget.py
                                            ├─ engine: EngineLimits   engine/config.py (EngineConfig)
                                            └─ disk:   DiskConfig     engine/kv/disk.py (None: off)
    Settings ── backend_config() ─> BackendConfig   backend/select.py (the entry points)
    Settings ── frontend_config() ─> FrontendConfig serving/frontend.py, read by adapters/, http/

Settings is the one source of defaults, so a default can never differ between
two layers: the slices hold none but a few tests lean on (the speculation
knobs, `fetch_urls`), which repeat Settings' (tests/test_config_slices.py), and
`HubConfig.disk`, None (no SSD tier) where Settings builds one. They import
neither MLX nor Starlette.
"""

from __future__ import annotations

from typing import Literal

import msgspec

KVBits = Literal[4, 8]  # the widths KV blocks may be stored in (engine/kv/quantized.py)


class _Slice(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """A frozen, keyword-only config slice (no defaults: see the module docstring)."""


class EncoderConfig(_Slice, frozen=True):
    """Embedding encoders (models/encoder/)."""

    embed_batch_size: int


class LoadConfig(_Slice, frozen=True):
    """How checkpoints are found, imported and loaded (models/loader.py)."""

    cache_dir: str                 # converted checkpoints (GGUF imports) live here
    dequantize: bool | None        # None = the model's entry, else the backend decides
    encoder: EncoderConfig         # an encoder entry loads with these
    hf_offline: bool               # HF_HUB_OFFLINE: Hugging Face cache only (models/sources.py)
    hf_endpoint: str | None        # HF_ENDPOINT; None = huggingface_hub's default
    hf_cache_dir: str | None       # HF_HUB_CACHE / $HF_HOME/hub; None = huggingface_hub's default
    ollama_models: str             # the Ollama store ($OLLAMA_MODELS, ~/.ollama/models)


class BudgetConfig(_Slice, frozen=True):
    """How the KV pool and the context ceiling are priced (models/budget.py)."""

    block_size: int                # tokens per KV block
    max_batch: int                 # rows decoded together at most
    kv_budget_bytes: int | None    # explicit device budget; None = measured
    memory_headroom_fraction: float
    max_kv_pool_bytes: int         # cap on one model's KV pool
    reserved_bytes: int            # held by other resident models (serving/residency.py)
    kv_bits: KVBits | None         # KV blocks in 8 or 4 bits; None = the model's float type


class EngineLimits(_Slice, frozen=True):
    """The engine loop's knobs that do not depend on the loaded model."""

    max_batch: int
    batching: bool
    prefill_chunk_tokens: int      # prefill tokens per step while streams decode
    idle_prefill_tokens: int       # ... and in a step that decodes nothing
    shared_prefill_tokens: int     # ... while another resident model's engine runs
    admission_window_ms: float     # an idle engine gathers a burst this long
    pipeline: bool | None          # None = the backend decides
    max_queue: int
    queue_timeout_s: float
    speculative: bool = True       # prompt-lookup speculation (engine/speculative/)
    spec_max_draft: int = 8        # most tokens a row drafts per step
    spec_ngram: int = 4            # longest suffix n-gram looked up
    spec_max_rows: int = 8         # steps decoding more rows than this do not speculate
    spec_draft_rows: int = 2       # full contexts the draft model's KV pool holds


class ImageLimits(_Slice, frozen=True):
    """What one request's images may be (serving/vision.py rule 2)."""

    max_images: int                # image parts per request
    max_image_bytes: int           # decoded bytes of one image
    max_image_pixels: int          # width x height of one image
    fetch_urls: bool = False       # http(s) image URLs are fetched (else refused by name)


class DiskConfig(_Slice, frozen=True):
    """The SSD tier of the prefix cache (engine/kv/disk.py), one per daemon."""

    directory: str                 # block files live here
    budget_bytes: int              # their bytes never exceed this (LRU)


class HubConfig(_Slice, frozen=True):
    """Generations, leases and swaps (serving/hub.py), with the slices it hands down."""

    auto_swap: bool
    min_generation_s: float        # a generation lives at least this long before a swap
    keep_alive_s: float | None     # idle unload; None = never
    max_resident_models: int       # 0 = as many as the memory budget holds
    evict_wait_s: float            # how long a load waits for a busy model's leases to end
    drain_timeout_s: float         # how long a retired engine may finish its rows
    load: LoadConfig
    budget: BudgetConfig
    engine: EngineLimits
    disk: DiskConfig | None = None  # None: the prefix cache stays in RAM only


class FrontendConfig(_Slice, frozen=True):
    """What the request-facing surface reads (serving/frontend.py; adapters/ and http/
    reach it as `frontend(request).config`)."""

    max_batch: int                 # rows decoded together: `n` and llama.cpp's slots
    max_body_bytes: int            # a larger request body is a 413 (http/body.py)
    strict_fields: bool            # unknown request fields: 400 (http/fields.py)
    refuse_images: bool            # image parts on a text-only model: 400 (core/images.py)
    auto_swap: bool                # a request may load another model (hub rule 2)
    images: ImageLimits


class BackendConfig(_Slice, frozen=True):
    """The device backend (backend/), chosen once at start-up by `select_backend`."""

    use_openblas: bool             # CPU backend on Linux: re-exec with OpenBLAS preloaded
    cpu_matmul_parts: int | None   # CPU backend: parts per matmul; None = one per usable core
