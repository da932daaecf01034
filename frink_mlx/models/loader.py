"""Registry entry -> a loaded, warmed-up model (`load_model`).

Why: every source kind (MLX checkpoint dir, GGUF file, pip-package resource)
must end as the same `LoadedModel`, and one choice depends on the device:
MLX's CPU quantized matmul runs at ~1 GFLOP/s while float32 goes through
BLAS, so the CPU backend dequantizes quantized weights to float32 when memory
allows (the backend answers: backend/cpu/backend.py rule 2).

Rules:
1. `package:` sources resolve through `registry.resolve_source`; a `.gguf` source
   is imported first (cached by content hash, see models/gguf/).
2. Generative checkpoints load with `mlx_lm.load`; `spec.chat_template`
   replaces the checkpoint's template.
3. Dequantize decision: `config.dequantize`, else `spec.dequantize`, decides
   when set (True forces, even past the memory check). Unset means the
   backend decides (`Backend.dequantize_by_default`): Metal never, the CPU
   backend when the float32 weights fit in its share of physical RAM.
4. Warm-up: one 4-token forward pass, so the first request doesn't pay for
   lazy weight materialisation and kernel set-up.
5. `context_length` = the trained length (`max_position_embeddings`), capped
   by `spec.context_length`.
6. `kind = "encoder"` hands off to `frink_mlx.models.encoder.load_encoder`.
7. Sampling defaults come from the model: the checkpoint's
   `generation_config.json` (temperature, top_p, top_k, min_p,
   repetition_penalty -- the fields vLLM's `generation_config="auto"` takes;
   `do_sample` is not read, as there) fill what the registry's `[sampling]`
   leaves unset; the merged spec is `LoadedModel.spec`. A file with values
   out of range is logged and ignored, never half-applied.
8. Distributed (`shard` given, backend/distributed.py): the model is split
   for this rank after any dequantization, and the warm-up is skipped (its
   forward would issue all-reduces no other rank expects). `parallel` says
   how it was split ("tensor"), for /v1/models.

This module is blocking; call it off the event loop.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, cast

import mlx.core as mx
import mlx.nn as nn
import msgspec

from ..backend import Backend
from ..config import LoadConfig
from ..errors import ModelFormatError
from ..registry import ModelSpec, SamplingDefaults, resolve_source
from .encoder import Encoder, load_encoder
from .gguf import import_gguf

WARMUP_TOKENS = 4


@dataclass(slots=True)
class LoadedModel:
    spec: ModelSpec
    kind: str
    model: nn.Module
    tokenizer: Any  # mlx_lm TokenizerWrapper; None for encoders (they own theirs)
    config: dict[str, Any]
    path: Path
    context_length: int
    dtype: mx.Dtype
    load_time_s: float
    encoder: Encoder | None = None
    parallel: str | None = None   # rule 8: "tensor" when sharded over a group
    num_ranks: int = 1


log = logging.getLogger("frink_mlx.models")

GENERATION_CONFIG_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def with_checkpoint_defaults(spec: ModelSpec, path: Path) -> ModelSpec:
    """Rule 7: the checkpoint's generation_config.json under the registry's [sampling]."""
    try:
        raw = json.loads((path / "generation_config.json").read_text())
    except FileNotFoundError:
        return spec
    except (OSError, ValueError) as exc:
        log.warning("model %s: ignoring unreadable generation_config.json (%s)", spec.name, exc)
        return spec
    found = {k: raw[k] for k in GENERATION_CONFIG_FIELDS if isinstance(raw, dict)
             and raw.get(k) is not None}
    if not found:
        return spec
    try:
        from_file = msgspec.convert(found, SamplingDefaults)
    except msgspec.ValidationError as exc:
        log.warning("model %s: ignoring generation_config.json sampling values (%s)",
                    spec.name, exc)
        return spec
    mine = spec.sampling or SamplingDefaults()
    merged = {f: getattr(mine, f) if getattr(mine, f) is not None else getattr(from_file, f)
              for f in GENERATION_CONFIG_FIELDS}
    return msgspec.structs.replace(spec, sampling=SamplingDefaults(**merged))


def checkpoint_path(spec: ModelSpec, config: LoadConfig) -> Path:
    """The MLX checkpoint dir behind `spec`, importing a GGUF if needed (rule 1)."""
    source = resolve_source(spec)
    if source.is_file():
        if source.suffix.lower() != ".gguf":
            raise ModelFormatError(f"model {spec.name!r}: {source} is neither a dir nor a .gguf file")
        return import_gguf(source, config.cache_dir)
    if not (source / "config.json").is_file():
        raise ModelFormatError(f"model {spec.name!r}: {source} has no config.json")
    return source


def load_model(spec: ModelSpec, config: LoadConfig, backend: Backend, *,
               shard: Callable[[nn.Module], tuple[str, int]] | None = None) -> LoadedModel:
    """`shard(model) -> (kind, num_ranks)` splits the model for this rank (rule 8)."""
    started = time.perf_counter()
    path = checkpoint_path(spec, config)
    if spec.kind == "encoder":
        return _load_encoder(spec, config, path, started, backend)
    spec = with_checkpoint_defaults(spec, path)
    import mlx_lm

    tokenizer_config = {"chat_template": spec.chat_template} if spec.chat_template else None
    try:
        model, tokenizer, model_config = cast(Any, mlx_lm.load(
            str(path), tokenizer_config=tokenizer_config, return_config=True))
    except (ValueError, FileNotFoundError, KeyError) as exc:
        raise ModelFormatError(f"model {spec.name!r}: cannot load {path}: {exc}") from None
    if should_dequantize(model, spec, config, backend):
        dequantize_to_float32(model)
    parallel, num_ranks = shard(model) if shard is not None else (None, 1)
    if shard is None:
        _warm_up(model, tokenizer)
    return LoadedModel(
        spec=spec, kind="generative", model=model, tokenizer=tokenizer, config=model_config,
        path=path, context_length=context_length(model_config, spec),
        dtype=_compute_dtype(model), load_time_s=time.perf_counter() - started,
        parallel=parallel, num_ranks=num_ranks,
    )


def _load_encoder(spec: ModelSpec, config: LoadConfig, path: Path, started: float,
                  backend: Backend) -> LoadedModel:
    encoder = load_encoder(path, spec, config.encoder, backend)
    model_config = json.loads((path / "config.json").read_text())
    model = getattr(encoder, "model", None)
    return LoadedModel(
        spec=spec, kind="encoder", model=model, tokenizer=None, config=model_config,  # type: ignore[arg-type]
        path=path, context_length=context_length(model_config, spec),
        dtype=_compute_dtype(model) if isinstance(model, nn.Module) else mx.float32,
        load_time_s=time.perf_counter() - started, encoder=encoder,
    )


def context_length(config: dict[str, Any], spec: ModelSpec) -> int:
    trained = int(config.get("max_position_embeddings") or config.get("max_seq_len") or 2048)
    return min(trained, spec.context_length) if spec.context_length else trained


def float32_nbytes(model: nn.Module) -> int:
    """Bytes the model's weights would take as float32 once dequantized."""
    from mlx.utils import tree_flatten

    bits = {name: m.bits for name, m in model.named_modules()
            if isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))}
    total = 0
    flat: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for name, value in flat:
        module, _, leaf = name.rpartition(".")
        if module in bits and leaf in ("scales", "biases"):
            continue
        elements = value.size * 32 // bits[module] if module in bits and leaf == "weight" else value.size
        total += elements * 4
    return total


def _is_quantized(model: nn.Module) -> bool:
    return any(isinstance(m, (nn.QuantizedLinear, nn.QuantizedEmbedding))
               for _, m in model.named_modules())


def should_dequantize(model: nn.Module, spec: ModelSpec, config: LoadConfig,
                      backend: Backend) -> bool:
    """Rule 3."""
    if not _is_quantized(model):
        return False
    choice = config.dequantize if config.dequantize is not None else spec.dequantize
    if choice is not None:
        return choice
    return backend.dequantize_by_default(float32_nbytes(model))


def dequantize_to_float32(model: nn.Module) -> None:
    """Replace QuantizedLinear/QuantizedEmbedding with float32 Linear/Embedding in place."""
    from mlx_lm.utils import dequantize_model

    model.set_dtype(mx.float32)  # scales/biases first: fp32 dequantize is ~2x faster on CPU
    dequantize_model(model)
    mx.eval(model.parameters())


def _compute_dtype(model: nn.Module) -> mx.Dtype:
    for _, module in model.named_modules():
        if isinstance(module, (nn.QuantizedLinear, nn.QuantizedEmbedding)):
            return module.scales.dtype
        if isinstance(module, (nn.Linear, nn.Embedding)):
            return module.weight.dtype
    return mx.float32


def _warm_up(model: nn.Module, tokenizer: Any) -> None:
    ids = tokenizer.encode("Hello, warm up.")[:WARMUP_TOKENS] or [0]
    mx.eval(model(mx.array([ids])))
