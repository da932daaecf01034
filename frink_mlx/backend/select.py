"""`select_backend`: the one place that decides which backend this process runs.

Rules, in order:
1. A forced `name` ("metal" or "cpu") wins (tests; a future setting).
2. macOS with Metal available -> "metal"; anything else -> "cpu". MLX's CUDA
   build is left out: it would be a third backend, not a guess made here.
3. With `argv` and `environ` (the entry points: serve, chat, generate), the
   CPU backend may re-execute the process once with OpenBLAS preloaded
   (cpu/blas.py; `environ` is `settings.environ_snapshot()`). That
   must happen before MLX loads, so this module imports no MLX at import
   time, asks MLX about Metal only on macOS (where no re-exec happens), and
   imports the chosen backend's module (which loads MLX) last. The
   composition root (app.py) selects without `argv`: no re-exec there.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping

from ..config import BackendConfig
from ..errors import ConfigError
from .base import Backend, BackendName

NAMES: tuple[BackendName, ...] = ("metal", "cpu")


def backend_name(forced: str | None = None) -> BackendName:
    """Rules 1-2: the backend this process runs."""
    if forced is not None:
        if forced not in NAMES:
            raise ConfigError(f"unknown backend {forced!r}; expected one of {', '.join(NAMES)}")
        return forced
    if sys.platform == "darwin":
        import mlx.core as mx  # no re-exec on macOS (blas.py rule 1), so MLX may load now

        return "metal" if mx.metal.is_available() else "cpu"
    return "cpu"


def select_backend(config: BackendConfig, *, argv: list[str] | None = None,
                   environ: Mapping[str, str] | None = None, name: str | None = None) -> Backend:
    """The backend for this process, chosen once (base.py rule 1; module rules);
    `config` is `Settings.backend_config()`."""
    chosen = backend_name(name)
    if chosen == "metal":
        from .metal import MetalBackend

        return MetalBackend()
    if argv is not None and environ is not None:
        from .cpu.blas import maybe_reexec_with_openblas  # imports no MLX

        maybe_reexec_with_openblas(config, argv, environ)
    from .cpu.backend import CpuBackend  # loads MLX: after the re-exec (rule 3)

    return CpuBackend(matmul_parts=config.cpu_matmul_parts)
