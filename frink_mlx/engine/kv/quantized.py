"""KV blocks in 8 or 4 bits (`kv_bits`): the paged pools as MLX affine-quantized arrays.

Why: a long agent context in the model's float type fills memory with few
contexts; mlx-lm's `QuantizedKVCache` (and every peer but mlx_lm.server) keeps
K/V quantized, at a small cost in agreement with float. Here the same
quantization (`mx.quantize`, mode "affine") stores the paged pools, so the
block pool, the prefix cache and the scheduler are untouched: a block is
still `block_size` slots, only fewer bytes.

Layout: each of paged.py's (H, S + 1, D) pools becomes three arrays over the
same slots (the trash slot included):

    packed  (H, S + 1, D * bits / 32)  uint32: 32 / bits values per word
    scales  (H, S + 1, D / g)          the pool's float dtype
    biases  (H, S + 1, D / g)
    x ~= scale * q + bias, q in [0, 2^bits), per group of g consecutive features
    of one head's vector of one token

Group size g: 32 for float32 pools, 64 for 16-bit pools (32 where 64 does
not divide the head dim). Why: on the default model (SmolLM2-135M, fp32 on
the CPU backend) the keys carry outlier features, so one scale per 64
features rounds the rest coarsely; per group of 32 the engine's greedy
agreement with float KV rose from 0.53 to 0.73 of 128 tokens before the first
divergence (20 chat prompts; teacher-forced 0.57 -> 0.65:
benchmarks/results/kv_bits-2026-12-03.txt; mlx-lm's own `QuantizedKVCache` at
group 64 measures 0.57). A float32 scale
and bias per 32 features still leave 3.2x the float tokens at 8 bits and
5.3x at 4; 16-bit pools keep 64, since at 32 their 8-bit ceiling would be
1.78x float (64: 1.88x). Bytes per token and head: D * bits / 8 +
2 * (D / g) * itemsize; D = 64 in float32: 256 float, 80 at 8 bits, 48 at 4
bits (`row_nbytes`; models/budget.py prices blocks with it).

Rules:
1. Writes quantize the new tokens' K/V (one `mx.quantize` per pool per
   forward) and scatter the three parts at the layout's write slots, each in
   place: the store is the only owner of every part (paged.py rule 1).
2. Reads are paged.py rule 2's gather, of each part. A model whose every
   attention layer calls mlx-lm's `scaled_dot_product_attention` dispatch
   (models/base.py) by name, with no attention sinks, gets the gathered parts
   as triples shaped (B, H, T, .) and a cache that carries `bits` and
   `group_size`, so mlx-lm's own dispatch runs its
   `quantized_scaled_dot_product_attention` (two `mx.quantized_matmul`s: the
   keys are never dequantized). Any other model (gemma2 scores by hand; KV-shared
   layers read another layer's K/V) gets the parts dequantized (`mx.dequantize`)
   and attends in float. The CPU backend's attention (backend/cpu/kernels.py)
   takes the triples itself: the same two quantized products, its own softmax.
   Measured there (decode shapes of the default model, benchmarks/results/
   kv_bits-2026-12-03.txt): the quantized products beat dequantizing the
   gathered blocks, most of all at longer rows, where a dequantized gather
   writes the whole float context again.
3. Reads in place (paged.py rule 7) are not offered: a quantized cache answers
   None, so long rows are gathered (of packed parts: a quarter to an eighth of
   the float bytes) where float rows are read where they lie.
4. Only attention pools are quantized: recurrent state (kv/recurrent.py) and a
   draft model's pool stay float. A head dim that is not a multiple of 32 and
   a distributed group are refused, each in one line, when the model is
   loaded. The SSD tier's block files hold the three parts of each pool as
   they are (kv/diskparts.py), with the bits and group sizes in the layout.
"""

from __future__ import annotations

import inspect
import types
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ...errors import ConfigError
from .layout import BatchLayout
from .paged import PagedKVStore, PagedLayerCache
from .reads import LayerRead, take_rows

KV_BITS = (4, 8)
GROUP_SIZES = (64, 32)  # 16-bit pools: the first that divides the head dim (module docstring)
FLOAT32_GROUP = 32      # float32 pools (module docstring)


def group_size_for(dim: int, itemsize: int = 4) -> int | None:
    """The quantization group of a head dim in pools of `itemsize`-byte floats (module
    docstring), or None if no supported group divides it."""
    order = (FLOAT32_GROUP,) if itemsize >= 4 else GROUP_SIZES
    return next((g for g in order if dim % g == 0), None)


def row_nbytes(dim: int, bits: int | None, itemsize: int) -> int:
    """Bytes of one token's vector of one head: float, or packed + scales + biases."""
    if bits is None:
        return dim * itemsize
    group = group_size_for(dim, itemsize)
    if group is None:
        raise ConfigError(f"kv_bits={bits}: head dim {dim} is not a multiple of "
                          f"{GROUP_SIZES[-1]}, the smallest quantization group")
    return dim * bits // 8 + 2 * (dim // group) * itemsize


def check_kv_bits(bits: int | None, dims: Sequence[int], family: str) -> None:
    """Rule 4's load-time refusal, one line: `bits` not 4 or 8, or a head dim no group divides."""
    if bits is None:
        return
    if bits not in KV_BITS:
        raise ConfigError(f"kv_bits={bits} is none of 4, 8")
    odd = sorted({d for d in dims if group_size_for(d) is None})
    if odd:
        raise ConfigError(f"kv_bits={bits} cannot apply to {family}: its head dims {odd} are "
                          f"not multiples of {GROUP_SIZES[-1]} (the smallest quantization group)")


def reads_quantized(model: Any, num_pools: int) -> bool:
    """Rule 2: whether every attention layer of `model` attends through mlx-lm's SDPA
    dispatch by name (so quantized triples reach `quantized_scaled_dot_product_attention`)."""
    from mlx_lm.models import base

    layers = getattr(model, "layers", None) or []
    attentions = [getattr(layer, "self_attn", None) for layer in layers]
    if not attentions or len(attentions) != num_pools:
        return False  # KV-shared or attention-free layers: they read float (rule 2)
    return all(a is not None and getattr(a, "sinks", None) is None
               and _calls(type(a), base.scaled_dot_product_attention) for a in attentions)


def _calls(cls: type, dispatch: Any) -> bool:
    """Whether `cls.__call__` calls `dispatch` by its name (a backend's wrapper of it,
    marked with `__wrapped__`, counts as it)."""
    call = next((vars(k)["__call__"] for k in cls.__mro__ if "__call__" in vars(k)), None)
    if not isinstance(call, types.FunctionType):
        return False
    name = dispatch.__name__
    return name in call.__code__.co_names and \
        inspect.unwrap(call.__globals__.get(name)) is dispatch  # type: ignore[arg-type]


class QuantizedKVStore(PagedKVStore):
    """The pools in `bits` (module layout): `keys[i]`/`values[i]` hold the packed words,
    `key_scales`, `key_biases`, `value_scales`, `value_biases` the rest."""

    bits: int

    def __init__(self, *, bits: int, quantized_reads: bool = True, **geometry: Any) -> None:
        """`quantized_reads`: rule 2's choice for the model these pools serve."""
        if bits not in KV_BITS:
            raise ValueError(f"bits must be one of {KV_BITS}, got {bits}")
        self.bits = bits
        self.quantized_reads = quantized_reads
        self.group_sizes: list[int] = []
        super().__init__(**geometry)

    def _allocate(self, shapes: Sequence[tuple[int, int, int]]) -> None:
        per_word, slots = 32 // self.bits, self.num_slots + 1
        lists: list[list[mx.array]] = [[], [], [], [], [], []]
        for heads, dim, v_dim in shapes:
            group = group_size_for(dim, self.dtype.size)
            if group is None or group_size_for(v_dim, self.dtype.size) != group:
                raise ValueError(f"head dims {dim}/{v_dim} have no common quantization group")
            self.group_sizes.append(group)
            for at, width in ((0, dim), (3, v_dim)):
                lists[at].append(mx.zeros((heads, slots, width // per_word), mx.uint32))
                lists[at + 1].append(mx.zeros((heads, slots, width // group), self.dtype))
                lists[at + 2].append(mx.zeros((heads, slots, width // group), self.dtype))
        (self.keys, self.key_scales, self.key_biases,
         self.values, self.value_scales, self.value_biases) = lists

    def pool_lists(self) -> list[list[mx.array]]:
        return [self.keys, self.key_scales, self.key_biases,
                self.values, self.value_scales, self.value_biases]

    def key_parts(self, layer: int) -> tuple[mx.array, mx.array, mx.array]:
        return self.keys[layer], self.key_scales[layer], self.key_biases[layer]

    def value_parts(self, layer: int) -> tuple[mx.array, mx.array, mx.array]:
        return self.values[layer], self.value_scales[layer], self.value_biases[layer]

    def layer_cache(self, layer: int, layout: BatchLayout,
                    grouped_mask: bool = False) -> PagedLayerCache:
        kind = QuantizedLayerCache if self.quantized_reads else DequantizingLayerCache
        return kind(self, layer, layout, grouped_mask)


Parts = tuple[mx.array, mx.array, mx.array]


class DequantizingLayerCache(PagedLayerCache):
    """mlx-lm's cache protocol over one quantized layer, handing out float K/V (rule 2)."""

    _store: QuantizedKVStore

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        k, v = self._write_and_gather(keys, values)
        bits, group = self._store.bits, self._store.group_sizes[self._layer]
        return (mx.dequantize(*k, group_size=group, bits=bits),
                mx.dequantize(*v, group_size=group, bits=bits))

    def _write_and_gather(self, keys: mx.array, values: mx.array) -> tuple[Parts, Parts]:
        """Rule 1's quantized writes, then rule 2's gather of each part (B, H, T, .)."""
        batch, heads, length, _ = keys.shape
        store, i, lay = self._store, self._layer, self._layout
        bits, group = store.bits, store.group_sizes[i]
        for new, pools in ((keys, store.key_parts(i)), (values, store.value_parts(i))):
            flat = new.transpose(1, 0, 2, 3).reshape(heads, batch * length, new.shape[-1])
            parts = mx.quantize(flat.astype(store.dtype), group_size=group, bits=bits)
            for pool, part in zip(pools, parts):
                pool[:, lay.write_slots] = part
        rows = lay.read_rows(heads, store.num_slots + 1)
        k = tuple(take_rows(p, rows).transpose(1, 0, 2, 3) for p in store.key_parts(i))
        v = tuple(take_rows(p, rows).transpose(1, 0, 2, 3) for p in store.value_parts(i))
        return k, v  # type: ignore[return-value]

    def read_in_place(self, keys: mx.array, values: mx.array, mask: object, *,
                      min_tokens: int, max_runs: int, min_run_blocks: int,
                      masked: float) -> LayerRead | None:
        return None  # rule 3


class QuantizedLayerCache(DequantizingLayerCache):
    """The same, handing out the quantized triples for mlx-lm's quantized SDPA (rule 2):
    `bits` and `group_size` are what its dispatch looks for."""

    def __init__(self, store: QuantizedKVStore, layer: int, layout: BatchLayout,
                 grouped_mask: bool = False) -> None:
        super().__init__(store, layer, layout, grouped_mask)
        self.bits = store.bits
        self.group_size = store.group_sizes[layer]

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Any, Any]:
        return self._write_and_gather(keys, values)
