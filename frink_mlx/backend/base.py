"""The one object that answers device questions: the `Backend` interface.

Why one object: the product is Apple-Silicon-first, and on Metal stock mlx-lm
must run untouched; the Linux CPU specialisation (BLAS re-exec, dequantized
weights, our own attention/SwiGLU/RoPE kernels, matmuls split over streams) is
a second backend, not a set of `if on_cpu()` branches spread over the engine,
the loader and the budget. Every layer that used to ask MLX which device it
runs on now asks the backend it was handed (vLLM's `platforms/interface.py`
has the same shape: one class per platform, chosen once).

Rules:
1. Chosen once at start-up by `select_backend` (select.py) in the entry
   points and the composition root, then passed down; nothing reads a
   module-level "current backend".
2. Constructing a backend does nothing: no MLX call, no patching. Work
   happens only when asked (`prepare_decoder`, `memory_budget`, ...). The
   one process-wide step, the CPU backend's OpenBLAS re-exec, is taken by
   `select_backend` itself, before the backend's module (and MLX) loads.
3. `prepare_decoder` / `prepare_encoder` may change the *model instance* they
   are given (the CPU backend swaps its layers' classes), never a module of
   mlx-lm or MLX; they return the `ForwardScope` the caller wraps around each
   of its forwards. The Metal backend changes nothing and returns a no-op.
4. Interface only here: this module imports no MLX, so the entry points can
   import it before the BLAS re-exec (cpu/blas.py rule 4).
"""

from __future__ import annotations

import contextlib
import os
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from .info import DeviceFacts, device_facts

BackendName = Literal["metal", "cpu"]
BudgetSource = Literal["metal", "ram"]

# Entered around each forward of a prepared model (rule 3).
ForwardScope = Callable[[], AbstractContextManager[None]]


def no_scope() -> AbstractContextManager[None]:
    """The ForwardScope of a backend with nothing to select per forward."""
    return contextlib.nullcontext()


@dataclass(frozen=True, slots=True)
class MemoryBudget:
    """How many bytes the device can hold for weights and KV, and who said so."""

    nbytes: int
    source: BudgetSource


def physical_ram_bytes() -> int:
    """Physical RAM of this machine; 0 where the OS does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


class Backend(ABC):
    """What the rest of frink-mlx may ask about the device (module rules)."""

    name: ClassVar[BackendName]

    @abstractmethod
    def dequantize_by_default(self, float32_nbytes: int) -> bool:
        """Whether a quantized model whose float32 weights take `float32_nbytes`
        should be dequantized at load when neither the setting nor models.toml says."""

    @abstractmethod
    def pipelines_steps(self) -> bool:
        """Whether the engine dispatches decode step t+1 before reading step t back
        (engine/engine.py explains why only a GPU gains from it)."""

    @abstractmethod
    def device_token_masks(self) -> bool:
        """Whether grammar masks are applied by llguidance's device kernel
        (engine/constraints.py rule 5) instead of host-built masks."""

    @abstractmethod
    def memory_budget(self) -> MemoryBudget:
        """The device budget the KV plan starts from (models/budget.py rule 1)."""

    @abstractmethod
    def prepare_decoder(self, model: Any) -> ForwardScope:
        """Ready a loaded mlx-lm model for the engine's forwards (rule 3)."""

    @abstractmethod
    def prepare_encoder(self, model: Any) -> ForwardScope:
        """Ready an embedding model (models/encoder/) for its forwards (rule 3)."""

    def device_facts(self) -> DeviceFacts:
        """The device MLX computes on and its allocator's counters, read now (info.py)."""
        return device_facts()

    def release_freed_memory(self) -> None:
        """Hand a freed generation's memory back to the OS: gc, MLX's buffer cache and,
        on glibc, the free heap (backend/memory.py). Blocking; run off the event loop."""
        from .memory import release_freed_memory

        release_freed_memory()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"
