"""The Metal backend (Apple Silicon), the default: stock mlx-lm, untouched.

Why it does so little: on Metal, MLX's own kernels (`mx.fast`, quantized
matmuls) are what the CPU backend has to work around, so this backend
installs nothing, patches nothing and leaves quantized weights quantized.
tests/backend/test_seam.py pins it: a model prepared and run through the
engine with this backend leaves every `mlx_lm.models.*` module and the model
instance exactly as mlx-lm made them.

Rules:
1. Quantized weights stay quantized (Metal's quantized matmul is fast).
2. Decode steps are pipelined: the GPU runs step t+1 while the host turns
   step t into events (engine/engine.py).
3. The memory budget is Metal's recommended working set; physical RAM where
   MLX does not report one (an old MLX, or this object used off macOS, as
   the seam test does).
4. Grammar masks go through llguidance's Metal kernel.
"""

from __future__ import annotations

from typing import Any, ClassVar

import mlx.core as mx

from .base import (
    Backend,
    BackendName,
    ForwardScope,
    MemoryBudget,
    no_scope,
    physical_ram_bytes,
)


class MetalBackend(Backend):
    name: ClassVar[BackendName] = "metal"

    def dequantize_by_default(self, float32_nbytes: int) -> bool:
        """Rule 1: never; Metal's quantized matmul is fast."""
        del float32_nbytes
        return False

    def pipelines_steps(self) -> bool:
        """Rule 2: yes; the GPU runs step t+1 while the host reads step t back."""
        return True

    def device_token_masks(self) -> bool:
        """Rule 4: yes, through llguidance's Metal kernel."""
        return True

    def memory_budget(self) -> MemoryBudget:
        """Rule 3: Metal's recommended working set, else physical RAM."""
        try:
            if mx.metal.is_available():
                size = int(mx.metal.device_info().get("max_recommended_working_set_size", 0))
                if size > 0:
                    return MemoryBudget(size, "metal")
        except (AttributeError, RuntimeError):  # an MLX without the query
            pass
        return MemoryBudget(physical_ram_bytes(), "ram")

    def prepare_decoder(self, model: Any) -> ForwardScope:
        del model
        return no_scope

    def prepare_encoder(self, model: Any) -> ForwardScope:
        del model
        return no_scope
