"""Matmuls split by output rows over several MLX CPU streams (CPU backend only).

Why: OpenBLAS (Debian's 0.3.21 here) threads one sgemm by dividing the
*tokens* between its threads, and each thread packs the whole weight panel:
at the few rows of a decode or follow-up-turn step both cores stream all the
weights, and a thread whose share of rows is not a multiple of 8 pays extra
passes over them. Cutting the weight's *output rows* into one range per core
instead, each range multiplied on its own MLX CPU stream (one worker thread
each) with single-threaded OpenBLAS, has every core stream only its share of
the weights once.
(Figures: benchmarks/results/cpu_backend-measurements.md.)

Rules:
1. `install(model)` swaps every plain `nn.Linear` and `nn.Embedding` leaf for
   `SplitLinear` / `SplitEmbedding`: subclasses holding the very same arrays
   (same parameter names, nothing copied) that behave exactly as stock
   outside a split forward. Quantized layers are other classes, untouched.
2. Only inside `split_forward(streams)` (thread-local; the engine's runner and
   the encoder wrap their forward in it), for a float32 product on the CPU,
   the weight's rows are cut into up to len(streams) + 1 ranges of at least
   `MIN_ROWS` rows (multiples of `ROW_ALIGN`; fewer ranges for a small
   weight, none under 2 * MIN_ROWS): range 0 runs
   on the calling thread's stream, range i on streams[i - 1], and one
   concatenate on the calling stream joins them. Every output element is the
   same dot product the stock call computes (equal to float rounding: a
   one-row product may take another BLAS path, ~1e-6 apart).
3. The ranges are row slices, which MLX makes as views of the weight's
   buffer; they are cached per weight array.
4. `prepare(parts, pool)` (which `setup` calls): OpenBLAS's own threads would now
   compete with the streams for the same cores, so it sets them to 1
   (process-wide, see blas.py). Nothing happens with one part or off the CPU.
5. Side streams are `ThreadLocalStream`s made once per count by the CPU
   backend's `SideStreams` pool and shared by every model it prepares: each
   thread that runs a split forward gets its own MLX streams (each is a
   worker thread). The engine's thread destroys its own when it ends
   (engine/engine.py); an encoder's worker threads keep theirs, one set per
   thread however many models come and go.
6. Only the CPU backend (cpu/backend.py) calls `setup`; the thread-local
   "inside a split forward" mark is a per-call flag, like the kernels' one.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator, Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx.utils import tree_map_with_path

from .blas import set_openblas_threads

ROW_ALIGN = 16   # SkylakeX sgemm kernel's row unroll: ranges start on it
MIN_ROWS = 32    # per part; smaller products are not worth a second stream
MAX_PARTS = 8

_LOCAL = threading.local()


def auto_parts(setting: int | None) -> int:
    """Parts per product: the setting, or one per usable core (at most MAX_PARTS)."""
    if setting is not None:
        return max(1, setting)
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_PARTS))


def on_cpu() -> bool:
    """Whether MLX's default device is the CPU (the only place these paths run)."""
    return mx.default_device().type == mx.DeviceType.cpu


class SideStreams:
    """Rule 5: the side streams of one CPU backend, made once per count."""

    def __init__(self) -> None:
        self._by_count: dict[int, tuple[Any, ...]] = {}

    def get(self, count: int) -> list[Any]:
        streams = self._by_count.get(count)
        if streams is None:
            streams = self._by_count[count] = tuple(
                mx.new_thread_local_stream(mx.cpu) for _ in range(count))
        return list(streams)


def prepare(parts: int, pool: SideStreams) -> list[Any]:
    """The side streams for a split forward of `parts` parts (rules 4, 5); [] = no split."""
    if parts < 2 or not on_cpu():
        return []
    set_openblas_threads(1)
    return pool.get(parts - 1)


def setup(model: nn.Module, setting: int | None, pool: SideStreams) -> list[Any]:
    """`prepare` for the setting's parts and, if it splits, `install` into `model`."""
    streams = prepare(auto_parts(setting), pool)
    if streams:
        install(model)
    return streams


@contextlib.contextmanager
def split_forward(streams: Sequence[Any]) -> Iterator[None]:
    """Marks the calling thread's model calls as split (rule 2) while inside."""
    previous = getattr(_LOCAL, "streams", None)
    _LOCAL.streams = list(streams) or None
    try:
        yield
    finally:
        _LOCAL.streams = previous


def side_streams() -> list[Any]:
    """The side streams of the split forward the calling thread is in ([] outside one);
    the kernels' attention over long rows cuts its products over them too."""
    return list(getattr(_LOCAL, "streams", None) or [])


class _Ranges:
    """Row-range views of one weight (and its bias), rule 3. Not a parameter."""

    __slots__ = ("weight", "streams", "parts")

    def __init__(self, weight: mx.array, streams: int,
                 parts: list[tuple[mx.array, mx.array | None]]) -> None:
        self.weight = weight
        self.streams = streams  # the stream count these ranges were cut for
        self.parts = parts      # empty: too small to split


def _bounds(rows: int, parts: int) -> list[int] | None:
    """Cut points of `rows` into at most `parts` aligned ranges of >= MIN_ROWS; None: < 2."""
    parts = min(parts, rows // MIN_ROWS)
    if parts < 2:
        return None
    cuts = [round(rows * i / parts / ROW_ALIGN) * ROW_ALIGN for i in range(parts + 1)]
    cuts[-1] = rows
    return cuts


def _product(module: nn.Module, x: mx.array, weight: mx.array, bias: mx.array | None) -> mx.array | None:
    """x @ weight.T (+ bias) split over the thread's streams, or None for the stock path."""
    streams = getattr(_LOCAL, "streams", None)
    if not streams or x.dtype != mx.float32 or weight.dtype != mx.float32 or not on_cpu():
        return None
    cached: _Ranges | None = getattr(module, "_frink_ranges", None)
    if cached is None or cached.weight is not weight or cached.streams != len(streams):
        cuts = _bounds(weight.shape[0], len(streams) + 1) or []
        parts = [(weight[a:b], None if bias is None else bias[a:b]) for a, b in zip(cuts, cuts[1:])]
        cached = _Ranges(weight, len(streams), parts)
        object.__setattr__(module, "_frink_ranges", cached)
    if not cached.parts:
        return None
    outs = []
    for i, (w, b) in enumerate(cached.parts):
        stream = streams[i - 1] if i else None
        outs.append(mx.matmul(x, w.T, stream=stream) if b is None
                    else mx.addmm(b, x, w.T, stream=stream))
    return mx.concatenate(outs, axis=-1)


class SplitLinear(nn.Linear):
    """nn.Linear whose product is split inside `split_forward` (rule 2)."""

    def __call__(self, x: mx.array) -> mx.array:
        out = _product(self, x, self["weight"], self["bias"] if "bias" in self else None)
        return super().__call__(x) if out is None else out


class SplitEmbedding(nn.Embedding):
    """nn.Embedding whose `as_linear` (a tied LM head) is split inside `split_forward`."""

    def as_linear(self, x: mx.array) -> mx.array:
        out = _product(self, x, self["weight"], None)
        return super().as_linear(x) if out is None else out


def _adopt(cls: type[nn.Module], stock: nn.Module) -> nn.Module:
    """A `cls` holding `stock`'s arrays (no __init__: it would allocate new weights)."""
    module = cls.__new__(cls)
    nn.Module.__init__(module)
    for key, value in stock.items():
        if isinstance(value, mx.array):
            setattr(module, key, value)
    module.train(stock.training)
    return module


_SWAPS: dict[type, type[nn.Module]] = {nn.Linear: SplitLinear, nn.Embedding: SplitEmbedding}


def install(model: nn.Module) -> int:
    """Rule 1; returns how many layers were swapped (idempotent)."""
    count = 0

    def swap(_path: str, module: Any) -> Any:
        nonlocal count
        cls = _SWAPS.get(type(module))
        if cls is None:
            return module
        count += 1
        return _adopt(cls, module)

    model.update_modules(tree_map_with_path(swap, model.leaf_modules(), is_leaf=nn.Module.is_module))
    return count
