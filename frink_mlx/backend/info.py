"""Which device MLX computes on, and how much memory its allocator holds.

Why here: the status page (adapters/status.py) must say "Metal" or "CPU" and
how much memory the daemon holds, but adapters import no MLX. This module
answers those two device questions; MLX is imported inside the call, so
importing this module stays free (tests/test_layering.py).

Rules:
1. `name` is "Metal" when the default device is a GPU and Metal is available,
   "CUDA" for a GPU behind MLX's CUDA backend, "CPU" otherwise.
2. Memory figures are MLX allocator counters (`mx.get_active_memory`, ...):
   what MLX arrays hold now (weights, the KV pool, transient activations), the
   peak since start, and freed buffers kept for reuse. A counter this MLX
   build lacks is None (not measured), never 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class DeviceFacts:
    name: str                     # "Metal" | "CUDA" | "CPU"
    device: str                   # MLX's own spelling, e.g. "Device(cpu, 0)"
    active_bytes: int | None
    peak_bytes: int | None
    cache_bytes: int | None


def _counter(mx: Any, name: str) -> int | None:
    fn: Callable[[], int] | None = getattr(mx, name, None)
    if fn is None:
        return None
    try:
        return int(fn())
    except Exception:  # noqa: BLE001 - a backend without the counter: not measured
        return None


def _gpu_name(mx: Any) -> str:
    metal = getattr(mx, "metal", None)
    if metal is not None and metal.is_available():
        return "Metal"
    cuda = getattr(mx, "cuda", None)
    if cuda is not None and cuda.is_available():
        return "CUDA"
    return "GPU"


def device_facts() -> DeviceFacts:
    """Rules 1 and 2, read now."""
    import mlx.core as mx

    device = mx.default_device()
    name = _gpu_name(mx) if device.type == mx.DeviceType.gpu else "CPU"
    return DeviceFacts(name=name, device=str(device),
                       active_bytes=_counter(mx, "get_active_memory"),
                       peak_bytes=_counter(mx, "get_peak_memory"),
                       cache_bytes=_counter(mx, "get_cache_memory"))
