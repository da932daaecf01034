"""Per-layer cache kinds of a stock mlx-lm model, read from its own `make_cache()`.

Why: one paged attention cache per layer is all a llama needs, but the model
files people run now mix layer kinds (issue 29): GatedDeltaNet, Mamba2 and
short-convolution layers keep a fixed-size recurrent state per row
(mlx-lm's `ArraysCache`), sliding-window layers attend to their last w
positions (`RotatingKVCache`), Gemma 4's layers have their own head dims and
its last layers reuse an earlier layer's K/V (no cache entry at all). Like
vLLM v1's hybrid manager (kv_cache_interface.py), the engine groups what a
model needs by *spec*: one paged pool per attention entry with its own
geometry, one slot pool per recurrent entry with its own array shapes.

Rules:
1. The model's own `make_cache()` (mlx-lm's `make_prompt_cache` when it has
   none) is the source of truth for which entries exist and in which nesting:
   the engine hands the model a list of the same shape (a `CacheList` where
   the model made one, falcon_h1), so each model file finds what it indexes.
2. Geometry comes from a probe: one 2-token forward over mlx-lm's own caches;
   the shapes of what each cache was handed are read off its graph (so a
   probe left lazy costs nothing; the loader evaluates it, as a warm-up,
   except for a model split over a group: there the graph is only built, so
   the collectives in it never run on one rank alone).
   A KV entry gives (n_kv_heads, head_dim, v_head_dim); a `RotatingKVCache`
   its window (`max_size`); an `ArraysCache` the per-row shape and dtype of
   each array it was given.
3. Anything else is refused at load (`UnsupportedModel`), in one line naming
   the family and why: a cache kind the engine has no pool for
   (`ChunkedKVCache`, `QuantizedKVCache`, custom classes), a sink-keeping
   rotating cache (`keep` > 0), a recurrent entry the probe left unset, or a
   probe that raised.
4. A model file whose forward assumes what a paged batch does not give it,
   found by the family survey (benchmarks/family_survey.py), is refused by
   name (`REFUSED_FAMILIES`), before the probe: its reason is the line.

No state lives here; `ModelCacheSpec` is a frozen description the engine,
the budget (models/budget.py) and the loader share.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx

from ...errors import ModelFormatError
from .quantized import row_nbytes

# Rule 4: model file -> why the paged engine cannot run it.
REFUSED_FAMILIES = {
    "afm7": "its KV-reuse layers take RoPE positions from the length of the keys they read, "
            "which rows of different lengths in one batch do not share",
    "gpt_bigcode": "its learned position embeddings read the cache offset as one integer "
                   "(np.arange), where each row of a batch has its own",
    "plamo3": "its sliding-window mask shows window_size + 1 keys while its own cache keeps "
              "window_size, so mlx-lm's own greedy ids for one prompt change with how the "
              "prompt is split into forwards (prefill_step_size): there are no ids to match",
}


class UnsupportedModel(ModelFormatError):
    """A model file the paged engine cannot run (rule 3)."""

    code = "unsupported_model"


@dataclass(frozen=True, slots=True)
class AttentionSpec:
    """One paged K/V pool: an attention cache entry (rule 2)."""

    n_kv_heads: int
    head_dim: int
    v_head_dim: int
    window: int | None = None  # sliding window (RotatingKVCache max_size); None: full

    def bytes_per_token(self, dtype: mx.Dtype, bits: int | None = None) -> int:
        """K and V bytes of one token; `bits`: quantized (quantized.py's layout)."""
        size = int(dtype.size)
        return self.n_kv_heads * (row_nbytes(self.head_dim, bits, size)
                                  + row_nbytes(self.v_head_dim, bits, size))


@dataclass(frozen=True, slots=True)
class StateSpec:
    """One recurrent layer's arrays, per row (shape without the batch axis)."""

    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[mx.Dtype, ...]

    @property
    def nbytes(self) -> int:
        total = 0
        for shape, dtype in zip(self.shapes, self.dtypes):
            count = 1
            for n in shape:
                count *= n
            total += count * int(dtype.size)
        return total


@dataclass(frozen=True, slots=True)
class CacheEntry:
    """One element of the model's cache list (rule 1): a pool index, or a list of entries."""

    kind: Literal["attention", "state", "list"]
    index: int = -1  # into ModelCacheSpec.attention / .states
    parts: tuple[CacheEntry, ...] = ()


@dataclass(frozen=True, slots=True)
class ModelCacheSpec:
    family: str
    entries: tuple[CacheEntry, ...]
    attention: tuple[AttentionSpec, ...]
    states: tuple[StateSpec, ...] = field(default=())

    @property
    def has_state(self) -> bool:
        return bool(self.states)

    def kv_bytes_per_token(self, dtype: mx.Dtype, bits: int | None = None) -> int:
        """K and V bytes of one token over every attention pool (`bits`: quantized)."""
        return sum(a.bytes_per_token(dtype, bits) for a in self.attention)

    def head_dims(self) -> list[int]:
        """Every K and V head dim of the attention pools."""
        return [d for a in self.attention for d in (a.head_dim, a.v_head_dim)]

    @property
    def state_bytes_per_row(self) -> int:
        return sum(s.nbytes for s in self.states)

    def windowed_pools(self) -> list[int]:
        """The attention pools of sliding-window entries (kv/window.py's tables)."""
        return [j for j, a in enumerate(self.attention) if a.window]

    @property
    def window_tokens(self) -> int | None:
        """The window tables' `w` (kv/window.py rule 4: the largest window plus one);
        None: no sliding-window entry."""
        windows = [a.window for a in self.attention if a.window]
        return max(windows) + 1 if windows else None

    def geometries(self) -> list[tuple[int, int, int]]:
        """(n_kv_heads, head_dim, v_head_dim) of each attention pool."""
        return [(a.n_kv_heads, a.head_dim, a.v_head_dim) for a in self.attention]

    def flat_order(self) -> list[tuple[str, int]]:
        """Every pool in model order: ("attention", j) and ("state", k)."""
        out: list[tuple[str, int]] = []

        def walk(entry: CacheEntry) -> None:
            if entry.kind == "list":
                for part in entry.parts:
                    walk(part)
            else:
                out.append((entry.kind, entry.index))

        for entry in self.entries:
            walk(entry)
        return out


def has_recurrent_layers(model: Any) -> bool:
    """Whether `make_cache()` holds an `ArraysCache` anywhere (no forward: a split model
    must not issue collectives its other ranks do not expect)."""
    from mlx_lm.models.cache import ArraysCache, CacheList, make_prompt_cache

    def walk(cache: Any) -> bool:
        if isinstance(cache, CacheList):
            return any(walk(c) for c in cache.caches)
        return isinstance(cache, ArraysCache)

    return any(walk(c) for c in make_prompt_cache(model))


def model_family(model: Any) -> str:
    """The mlx-lm model file's name (`mlx_lm.models.<family>`)."""
    return type(model).__module__.rsplit(".", 1)[-1]


def model_cache_spec(model: Any, *, evaluate: bool = True) -> ModelCacheSpec:
    """Rules 1-3: the cache entries `model` needs, or `UnsupportedModel`; `evaluate`
    runs the probe (rule 2) like a warm-up, so that nothing a model file caches
    lazily in it stays tied to the calling thread's stream."""
    from mlx_lm.models.cache import make_prompt_cache

    family = model_family(model)
    if family in REFUSED_FAMILIES:  # rule 4
        raise UnsupportedModel(f"{family}: {REFUSED_FAMILIES[family]}")
    try:
        caches = make_prompt_cache(model)
    except Exception as exc:  # noqa: BLE001 - any failure is a refusal naming it
        raise UnsupportedModel(f"{family}: make_cache() failed ({exc})") from None
    for cache in caches:
        _check_kind(family, cache)
    try:
        logits = model(mx.array([[0, 1]], dtype=mx.int32), cache=caches)
        if evaluate:
            mx.eval(logits)
    except Exception as exc:  # noqa: BLE001
        raise UnsupportedModel(f"{family}: a forward over mlx-lm's own caches failed "
                               f"({type(exc).__name__}: {exc})") from None
    attention: list[AttentionSpec] = []
    states: list[StateSpec] = []
    entries = tuple(_entry(family, c, attention, states) for c in caches)
    return ModelCacheSpec(family, entries, tuple(attention), tuple(states))


def _check_kind(family: str, cache: Any) -> None:
    """Rule 3's kinds, before the probe runs (a kind the engine lacks may not even run)."""
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

    kind = type(cache)
    if kind is CacheList:
        for part in cache.caches:
            _check_kind(family, part)
    elif kind is RotatingKVCache and cache.keep:
        raise UnsupportedModel(f"{family}: a rotating cache keeping {cache.keep} sink tokens "
                               "has no paged equivalent")
    elif kind not in (KVCache, RotatingKVCache) and not isinstance(cache, ArraysCache):
        raise UnsupportedModel(f"{family}: its {kind.__name__} layers have no paged engine "
                               "equivalent")


def _entry(family: str, cache: Any, attention: list[AttentionSpec],
           states: list[StateSpec]) -> CacheEntry:
    from mlx_lm.models.cache import ArraysCache, CacheList, KVCache, RotatingKVCache

    kind = type(cache)
    if kind is CacheList:
        return CacheEntry("list", parts=tuple(_entry(family, c, attention, states)
                                              for c in cache.caches))
    if kind in (KVCache, RotatingKVCache):
        window = int(cache.max_size) if kind is RotatingKVCache else None
        if cache.keys is None:
            raise UnsupportedModel(f"{family}: an attention cache the model never wrote")
        _, heads, _, head_dim = cache.keys.shape
        attention.append(AttentionSpec(int(heads), int(head_dim), int(cache.values.shape[-1]),
                                       window))
        return CacheEntry("attention", len(attention) - 1)
    if isinstance(cache, ArraysCache):
        arrays: list[Any] = list(cache.cache)
        if not arrays or any(a is None for a in arrays):
            raise UnsupportedModel(f"{family}: a recurrent cache with entries the model "
                                   "never set")
        states.append(StateSpec(tuple(tuple(int(n) for n in a.shape[1:]) for a in arrays),
                                tuple(a.dtype for a in arrays)))
        return CacheEntry("state", len(states) - 1)
    raise UnsupportedModel(f"{family}: its {kind.__name__} layers have no paged engine "
                           "equivalent")
