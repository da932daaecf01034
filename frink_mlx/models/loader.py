"""Registry entry -> a loaded, warmed-up model (`load_model`).

Why: every source kind (MLX checkpoint dir, GGUF file, pip-package resource,
Hugging Face repo, Ollama store) must end as the same `LoadedModel`, and one
choice depends on the device:
MLX's CPU quantized matmul runs at ~1 GFLOP/s while float32 goes through
BLAS, so the CPU backend dequantizes quantized weights to float32 when memory
allows (the backend answers: backend/cpu/backend.py rule 2).

Rules:
1. Sources resolve in sources.py (cache, download, GGUF import: models/gguf/).
   Defaults a source brings (an Ollama params layer) fill what the registry
   entry leaves unset; the merged spec is `LoadedModel.spec`. Its stop
   strings that are one token become EOS ids; longer ones are logged as not
   applied.
2. Generative checkpoints load with `mlx_lm.load`; `spec.chat_template`
   replaces the checkpoint's template. Vision checkpoints (rule 11) load
   through mlx-vlm instead.
3. Dequantize decision: `config.dequantize`, else `spec.dequantize`, decides
   when set (True forces, even past the memory check). Unset means the
   backend decides (`Backend.dequantize_by_default`): Metal never, the CPU
   backend when the float32 weights fit in its share of physical RAM. Every
   quantization mode MLX has (affine 2-8 bits, mxfp4, mxfp8, nvfp4)
   dequantizes straight to float32: mlx-lm's own `dequantize_model` leaves
   fp4/fp8 modes in bfloat16 (their scales are not floats, so `set_dtype`
   cannot steer the output), whose matmuls are several times slower than
   float32 on the CPU and drift. Half-precision float checkpoints (bfloat16,
   float16, e.g. a BF16 GGUF) follow the same decision and are upcast to
   float32 where the backend would dequantize.
4. Warm-up: one 4-token forward pass, so the first request doesn't pay for
   lazy weight materialisation and kernel set-up.
5. `context_length` = the trained length (`max_position_embeddings`, or its
   `text_config`'s where the config nests one, as Qwen3.5's does), capped by
   `spec.context_length`.
6. `kind = "encoder"` hands off to `frink_mlx.models.encoder.load_encoder`.
7. Sampling defaults come from the model: the checkpoint's
   `generation_config.json` (temperature, top_p, top_k, min_p,
   repetition_penalty -- the fields vLLM's `generation_config="auto"` takes;
   `do_sample` is not read, as there) fill what the registry's `[sampling]`
   and then the source (rule 1) leave unset; the merged spec is
   `LoadedModel.spec`. A file with values out of range is logged and
   ignored, never half-applied.
8. Each phase (download, convert, load, dequantize, warm-up) is reported to
   `progress.current()` (log, CLI lines, the hub's /health entry).
9. Distributed (`shard` given, backend/distributed.py): the checkpoint loads
   lazily and any dequantization stays lazy; the split then evaluates only
   what this rank keeps (a pipeline stage never reads the other stages'
   layers, a tensor shard its slices), so this rank's memory holds its part
   alone. The dequantize decision (rule 3) still prices the whole model. The
   warm-up is skipped (its forward would issue collectives no other rank
   expects). `parallel` says how it was split ("tensor" or "pipeline"), for
   /v1/models.

10. Refuse at load, never at the first step: after the warm-up the model's
   cache entries are read (engine/kv/specs.py, `LoadedModel.cache_spec`); a
   model file the engine cannot run is refused there as one line naming the
   entry, the family and why (`UnsupportedModel`). A split model (rule 9)
   is probed without evaluating (engine/kv/specs.py rule 2: the forward's
   graph is built and dropped, so its collectives never run), and its spec
   is this rank's part: its layers (pipeline), its heads and state slices
   (tensor). A warm-up that raises (mlx-lm's own forward cannot run
   here, e.g. bitnet's Metal-only kernel on the CPU) is refused the same way.
11. A vision checkpoint (models/vision.py rule 1) loads its whole model with
   mlx-vlm; the engine runs its language model (`VisionLM`) and
   `LoadedModel.vision` holds the processor and tower. It cannot be split over
   a group (the followers would need the image features too): refused there.
12. Before mlx-lm reads a checkpoint, its config's layer types are checked
   against its model file (models/layer_types.py): a name the file does not
   know is refused in one line naming the key, the names and the family.
   Whatever mlx-lm's load raises (a tensor missing, a shape) is one line too.

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
from ..engine.kv.specs import ModelCacheSpec, UnsupportedModel, model_cache_spec, model_family
from ..errors import ModelFormatError
from ..registry import ModelSpec, SamplingDefaults
from . import progress as progress_mod
from .encoder import Encoder, load_encoder
from .layer_types import unknown_layer_types
from .sources import ResolvedSource, resolve
from .vision import Vision, load_vision, vision_family

log = logging.getLogger("frink_mlx.models")

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
    parallel: str | None = None   # rule 9: "tensor" or "pipeline" when split over a group
    num_ranks: int = 1
    cache_spec: ModelCacheSpec | None = None  # rule 10; None for encoders
    vision: Vision | None = None  # rule 11: a vision checkpoint's processor and tower


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
    """The MLX checkpoint dir behind `spec`, fetched or imported if needed (rule 1)."""
    return resolve(spec, config).checkpoint


def with_source_defaults(spec: ModelSpec, source: ResolvedSource) -> ModelSpec:
    """Rule 1: the source's defaults under the registry entry's own values."""
    changes: dict[str, Any] = {}
    if source.sampling is not None:
        mine = spec.sampling or source.sampling
        merged = {f: getattr(mine, f) if getattr(mine, f) is not None else getattr(source.sampling, f)
                  for f in source.sampling.__struct_fields__}
        changes["sampling"] = type(source.sampling)(**merged)
    if source.context_length and spec.context_length is None:
        changes["context_length"] = source.context_length
    return msgspec.structs.replace(spec, **changes) if changes else spec


def load_model(spec: ModelSpec, config: LoadConfig, backend: Backend, *,
               shard: Callable[[nn.Module], tuple[str, int]] | None = None) -> LoadedModel:
    """`shard(model) -> (kind, num_ranks)` splits the model for this rank (rule 9)."""
    with progress_mod.ensure(spec.name) as progress:  # rule 8
        return _load(spec, config, backend, progress, shard)


def _load(spec: ModelSpec, config: LoadConfig, backend: Backend,
          progress: progress_mod.Progress,
          shard: Callable[[nn.Module], tuple[str, int]] | None) -> LoadedModel:
    started = time.perf_counter()
    source = resolve(spec, config)
    spec, path = with_source_defaults(spec, source), source.checkpoint
    progress.phase("load", source.origin)
    if spec.kind == "encoder":
        return _load_encoder(spec, config, path, started, backend)
    spec = with_checkpoint_defaults(spec, path)
    import mlx_lm

    tokenizer_config = {"chat_template": spec.chat_template} if spec.chat_template else None
    vision = None
    if (family := vision_family(path)) is not None:                 # rule 11
        if shard is not None:
            raise ModelFormatError(f"model {spec.name!r} is a vision checkpoint ({family}); "
                                   "it cannot be split over a group")
        model, vision, tokenizer, model_config = load_vision(path, spec.name, tokenizer_config)
    else:
        _check_layer_types(spec, path)  # rule 12
        try:
            model, tokenizer, model_config = cast(Any, mlx_lm.load(  # rule 9: lazy when split
                str(path), tokenizer_config=tokenizer_config, return_config=True,
                lazy=shard is not None))
        except (ValueError, FileNotFoundError, KeyError) as exc:
            raise ModelFormatError(f"model {spec.name!r}: cannot load {path}: "
                                   f"{' '.join(str(exc).split())}") from None  # rule 12
    _add_stop_tokens(spec, tokenizer, source.stop)
    if should_dequantize(model, spec, config, backend):
        progress.phase("dequantize", "to float32")
        dequantize_to_float32(model, evaluate=shard is None)
    parallel, num_ranks = shard(model) if shard is not None else (None, 1)
    if shard is None:
        progress.phase("warm-up")
    try:
        if shard is None:
            _warm_up(model, tokenizer)  # rule 10: a forward that cannot run is a refusal
        cache_spec = model_cache_spec(model, evaluate=shard is None)  # rule 10
    except UnsupportedModel as exc:
        raise UnsupportedModel(f"model {spec.name!r}: the engine cannot run model file "
                               f"{exc}") from None
    except Exception as exc:  # noqa: BLE001 - rule 10: one line naming the family and why
        raise UnsupportedModel(f"model {spec.name!r}: mlx-lm's own forward of model file "
                               f"{model_family(model)} fails here ({type(exc).__name__}: "
                               f"{str(exc).splitlines()[0] if str(exc) else ''})") from None
    return LoadedModel(
        spec=spec, kind="generative", model=model, tokenizer=tokenizer, config=model_config,
        path=path, context_length=context_length(model_config, spec),
        dtype=_compute_dtype(model), load_time_s=time.perf_counter() - started,
        parallel=parallel, num_ranks=num_ranks, cache_spec=cache_spec, vision=vision,
    )


def _check_layer_types(spec: ModelSpec, path: Path) -> None:
    """Rule 12: a layer type the model file does not know is refused before it loads."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return  # mlx-lm's own load says what is wrong
    found = unknown_layer_types(config) if isinstance(config, dict) else None
    if found is not None:
        family, key, names = found
        raise UnsupportedModel(f"model {spec.name!r}: its config's {key} names "
                               f"{', '.join(map(repr, names))}, a layer type model file "
                               f"{family} does not know")


def _add_stop_tokens(spec: ModelSpec, tokenizer: Any, stops: tuple[str, ...]) -> None:
    """Rule 1: one-token stop strings join the EOS ids."""
    skipped = []
    for stop in stops:
        ids = tokenizer.encode(stop, add_special_tokens=False)
        if len(ids) == 1:
            tokenizer.add_eos_token(ids[0])
        else:
            skipped.append(stop)
    if skipped:
        log.warning("model %s: stop strings %s from its source are not single tokens; not applied",
                    spec.name, skipped)


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
    """Rule 5: the trained length (a nested text_config's too), capped by the entry's."""
    text = config.get("text_config")
    nested = text if isinstance(text, dict) else {}
    trained = int(config.get("max_position_embeddings") or config.get("max_seq_len")
                  or nested.get("max_position_embeddings") or 2048)
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


def _is_half(model: nn.Module) -> bool:
    """Float weights narrower than float32 (bfloat16, float16)."""
    return _compute_dtype(model) in (mx.bfloat16, mx.float16)


def should_dequantize(model: nn.Module, spec: ModelSpec, config: LoadConfig,
                      backend: Backend) -> bool:
    """Rule 3: the setting, else the entry, else the backend decides (half-precision float
    weights count as narrow as quantized ones)."""
    if not _is_quantized(model) and not _is_half(model):
        return False
    choice = config.dequantize if config.dequantize is not None else spec.dequantize
    if choice is not None:
        return choice
    return backend.dequantize_by_default(float32_nbytes(model))


def dequantize_to_float32(model: nn.Module, *, evaluate: bool = True) -> None:
    """Replace every quantized layer (Linear, Embedding, MoE SwitchLinear) with its float32
    twin in place, whatever the mode (rule 3); `evaluate=False` leaves the twins lazy for
    a split to evaluate (rule 9)."""
    from mlx.utils import tree_unflatten
    from mlx_lm.models.switch_layers import QuantizedSwitchLinear, SwitchLinear

    model.set_dtype(mx.float32)  # affine scales/biases first: fp32 dequantize is ~2x faster on CPU
    twins: list[tuple[str, nn.Module]] = []
    for name, module in model.named_modules():
        if isinstance(module, nn.QuantizedLinear):
            cls: type = nn.Linear
        elif isinstance(module, nn.QuantizedEmbedding):
            cls = nn.Embedding
        elif isinstance(module, QuantizedSwitchLinear):
            cls = SwitchLinear
        else:
            continue
        weight = mx.dequantize(module["weight"], module["scales"], module.get("biases"),
                               group_size=module.group_size, bits=module.bits,
                               mode=module.mode, dtype=mx.float32)
        has_bias = "bias" in module
        twin = nn.Embedding(*weight.shape) if cls is nn.Embedding else \
            cls(*weight.shape[::-1], bias=has_bias)
        twin.weight = weight
        if has_bias:
            twin.bias = module["bias"].astype(mx.float32)
        twins.append((name, twin))
    if twins:
        model.update_modules(tree_unflatten(twins))
    if evaluate:
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
