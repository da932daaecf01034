"""The CPU backend (MLX's CPU device, Linux first): where the CPU specialisation lives.

Why a backend of its own: MLX's Linux CPU build lacks the fast kernels Metal
has (no CPU `mx.fast.scaled_dot_product_attention`, a ~1 GFLOP/s quantized
matmul, a scalar `mx.exp`), so serving well on it takes four deliberate
changes, all made here and nowhere else:

1. OpenBLAS instead of MLX's bundled reference BLAS: a one-time re-exec at
   start-up (blas.py), taken by `select_backend` before this module loads.
2. Quantized weights are dequantized to float32 at load when the float32
   weights fit in `DEQUANT_RAM_FRACTION` of physical RAM (float32 goes
   through BLAS); the setting or models.toml still decide first (loader.py).
3. `prepare_decoder` routes the model's attention, SwiGLU and RoPE through
   kernels.py and its plain linear layers through split.py, on this model
   instance only; the scope it returns marks each engine forward so those
   paths run there and nowhere else (another thread using the same model,
   mlx-lm's own generate, and every other model keep stock mlx-lm).
   `prepare_encoder` splits the matmuls only.
4. Decode steps are not pipelined (engine/engine.py says why), the memory
   budget is physical RAM, and grammar masks are built on the host
   (llguidance's mask kernel is Metal-only).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any, ClassVar

from ..base import Backend, BackendName, ForwardScope, MemoryBudget, physical_ram_bytes
from . import kernels, rope, split

DEQUANT_RAM_FRACTION = 0.25


class CpuBackend(Backend):
    name: ClassVar[BackendName] = "cpu"

    def __init__(self, *, matmul_parts: int | None = None, ram_bytes: int | None = None) -> None:
        """`matmul_parts`: split.py's parts per product (None: one per usable core,
        1: off); `ram_bytes`: physical RAM (None: ask the OS)."""
        self.matmul_parts = matmul_parts
        self._ram_bytes = ram_bytes
        self._side_streams = split.SideStreams()

    def ram_bytes(self) -> int:
        return self._ram_bytes if self._ram_bytes is not None else physical_ram_bytes()

    def dequantize_by_default(self, float32_nbytes: int) -> bool:
        """Rule 2: dequantize when the float32 weights fit in DEQUANT_RAM_FRACTION of RAM."""
        ram = self.ram_bytes()
        return ram > 0 and float32_nbytes <= DEQUANT_RAM_FRACTION * ram

    def pipelines_steps(self) -> bool:
        """Rule 4: never (engine/engine.py says why the CPU backend does not pipeline)."""
        return False

    def device_token_masks(self) -> bool:
        """Rule 4: no; grammar masks are built on the host (llguidance's kernel is Metal-only)."""
        return False

    def memory_budget(self) -> MemoryBudget:
        """Rule 4: physical RAM."""
        return MemoryBudget(self.ram_bytes(), "ram")

    def prepare_decoder(self, model: Any) -> ForwardScope:
        """Rule 3: kernels and split matmuls installed into `model`; the engine's scope."""
        streams = split.setup(model, self.matmul_parts, self._side_streams)
        kernels.install(model)
        return functools.partial(_decoder_forward, streams)

    def prepare_encoder(self, model: Any) -> ForwardScope:
        """Rule 3: split matmuls only (encoders have no paged cache nor RoPE of ours)."""
        streams = split.setup(model, self.matmul_parts, self._side_streams)
        return functools.partial(split.split_forward, streams)


@contextlib.contextmanager
def _decoder_forward(streams: Sequence[Any]) -> Iterator[None]:
    with rope.engine_forward(), split.split_forward(streams):
        yield
