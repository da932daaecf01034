"""Sentence-transformers head: which pooling, whether to normalise, how long.

An encoder checkpoint's token states become one vector by the recipe its
sentence-transformers config states, never by a guess:

1. `modules.json` lists the pipeline. We accept exactly
   `Transformer` -> `Pooling` -> optional `Normalize`; any other module
   (`Dense`, `LayerNorm`, `WordWeights`, ...) is refused by name, because
   silently skipping it would return vectors that look fine and are wrong.
2. The `Pooling` module's `config.json` names one pooling mode
   (`pooling_mode_cls_token`, `_mean_tokens`, `_max_tokens`,
   `_mean_sqrt_len_tokens`, `_lasttoken`). Combinations (concatenations) and
   weighted-mean are refused by name.
3. `sentence_bert_config.json`'s `max_seq_length` is the input limit the
   reference implementation truncates to; it is capped by the transformer's
   `max_position_embeddings`.

A checkpoint without `modules.json` is refused: a plain BERT has no agreed
sentence vector. The explicit exception is `HeadConfig.for_hidden_states()`,
used only when a registry entry asks a generative model to embed itself.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import mlx.core as mx

from ...errors import ModelFormatError

PoolingMode = Literal["cls", "mean", "max", "mean_sqrt_len", "lasttoken"]

_MODE_KEYS: dict[str, PoolingMode] = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len",
    "pooling_mode_lasttoken": "lasttoken",
}
_REFUSED_KEYS = ("pooling_mode_weightedmean_tokens",)
_ST = "sentence_transformers.models."


@dataclass(frozen=True, slots=True)
class HeadConfig:
    """How token states become a sentence vector, as the checkpoint says."""

    pooling: PoolingMode
    normalize: bool
    max_seq_length: int | None  # None: the checkpoint states none

    @classmethod
    def for_hidden_states(cls) -> "HeadConfig":
        """Explicit opt-in recipe for a generative model embedding itself."""
        return cls(pooling="mean", normalize=True, max_seq_length=None)


def read_head_config(path: Path) -> HeadConfig:
    """Parse modules.json + the Pooling config under an encoder checkpoint dir."""
    modules_file = path / "modules.json"
    if not modules_file.is_file():
        raise ModelFormatError(
            f"{path}: no modules.json; an encoder needs its sentence-transformers config "
            "(pooling and normalisation) to embed"
        )
    modules = _load_json(modules_file)
    if not isinstance(modules, list):
        raise ModelFormatError(f"{modules_file}: expected a list of modules")
    types = [str(m.get("type", "")) for m in modules]
    pooling_dir: Path | None = None
    normalize = False
    for module, kind in zip(modules, types):
        short = kind.removeprefix(_ST)
        if short == "Transformer":
            continue
        if short == "Pooling":
            pooling_dir = path / str(module.get("path", ""))
        elif short == "Normalize":
            normalize = True
        else:
            raise ModelFormatError(
                f"{modules_file}: module type '{kind}' is not supported "
                "(only Transformer, Pooling and Normalize)"
            )
    if types[:1] != [_ST + "Transformer"] or pooling_dir is None:
        raise ModelFormatError(f"{modules_file}: expected Transformer followed by Pooling")
    pooling = _read_pooling(pooling_dir / "config.json")
    return HeadConfig(pooling=pooling, normalize=normalize, max_seq_length=read_max_seq_length(path))


def _read_pooling(config_file: Path) -> PoolingMode:
    config = _load_json(config_file)
    if not isinstance(config, dict):
        raise ModelFormatError(f"{config_file}: expected an object")
    for key in _REFUSED_KEYS:
        if config.get(key):
            raise ModelFormatError(f"{config_file}: '{key}' is not supported")
    if config.get("include_prompt") is False:
        raise ModelFormatError(f"{config_file}: 'include_prompt: false' is not supported")
    modes = [mode for key, mode in _MODE_KEYS.items() if config.get(key)]
    if len(modes) != 1:
        raise ModelFormatError(
            f"{config_file}: expected exactly one pooling mode, found {modes or 'none'}"
        )
    return modes[0]


def read_max_seq_length(path: Path) -> int | None:
    config_file = path / "sentence_bert_config.json"
    if not config_file.is_file():
        return None
    config = _load_json(config_file)
    value = config.get("max_seq_length") if isinstance(config, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else None


def _load_json(file: Path) -> Any:
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFormatError(f"{file}: missing") from None
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{file}: unreadable ({exc})") from None


def pool(states: mx.array, mask: mx.array, head: HeadConfig) -> mx.array:
    """(B, L, D) token states + (B, L) 0/1 mask -> (B, D) sentence vectors (float32).

    Rows are right-padded: a row's real tokens are positions 0..n-1, so
    `lasttoken` picks position n-1 and `cls` picks position 0.
    """
    states = states.astype(mx.float32)
    weights = mask.astype(mx.float32)[..., None]  # (B, L, 1)
    counts = mx.maximum(weights.sum(axis=1), 1.0)  # (B, 1)
    if head.pooling == "cls":
        vectors = states[:, 0]
    elif head.pooling == "mean":
        vectors = (states * weights).sum(axis=1) / counts
    elif head.pooling == "mean_sqrt_len":
        vectors = (states * weights).sum(axis=1) / mx.sqrt(counts)
    elif head.pooling == "max":
        vectors = mx.where(weights > 0, states, mx.array(-1e9, mx.float32)).max(axis=1)
    else:  # lasttoken
        last = (mask.astype(mx.int32).sum(axis=1) - 1).astype(mx.int32)
        vectors = mx.take_along_axis(states, last[:, None, None], axis=1)[:, 0]
    if head.normalize:
        vectors = normalize(vectors)
    return vectors


def normalize(vectors: mx.array) -> mx.array:
    """L2-normalise rows (the sentence-transformers `Normalize` module)."""
    norms = mx.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / mx.maximum(norms, 1e-12)
