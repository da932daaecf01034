"""Re-execute once with the system OpenBLAS preloaded (Linux CPU backend).

Why: MLX's Linux CPU wheel bundles reference BLAS, ~30x slower than OpenBLAS
on the matmuls that dominate CPU inference. The BLAS symbols are resolved when
MLX's shared library loads, so the only reliable switch is `LD_PRELOAD` before
the interpreter starts: we exec the same interpreter with the same argv once.

Rules:
1. Only on Linux, only when `settings.use_openblas`, only when Debian's
   `libopenblas0-pthread` library exists (PyPI's `cmeel-openblas` dies with an
   illegal instruction on some CPUs, so it is not used).
2. Never loops: the new process carries `FRINK_MLX_BLAS_REEXEC=1`; if that
   marker is set (or OpenBLAS is already in LD_PRELOAD) nothing happens.
3. The environment comes from `settings.environ_snapshot()` (settings.py is the
   only reader of os.environ).
4. Must run before anything imports mlx; a failed exec is not fatal.
"""

from __future__ import annotations

import os
import platform
import sys
from pathlib import Path

from ..settings import ENV_PREFIX, Settings, blas_reexec_marker, environ_snapshot

MARKER = ENV_PREFIX + "BLAS_REEXEC"
_ARCH_DIRS = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu",
              "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}


def openblas_path() -> Path | None:
    """Debian's OpenBLAS for this machine, if installed."""
    arch = _ARCH_DIRS.get(platform.machine().lower())
    if arch is None:
        return None
    path = Path("/usr/lib") / arch / "libopenblas.so.0"
    return path if path.exists() else None


def reexec_env(settings: Settings, environ: dict[str, str]) -> dict[str, str] | None:
    """The environment to re-exec with, or None when no re-exec is wanted (rules 1-2)."""
    if not sys.platform.startswith("linux") or not settings.use_openblas:
        return None
    if environ.get(MARKER):
        return None
    lib = openblas_path()
    if lib is None:
        return None
    preload = environ.get("LD_PRELOAD", "")
    if "libopenblas" in preload:
        return None
    env = dict(environ)
    env["LD_PRELOAD"] = f"{lib}:{preload}" if preload else str(lib)
    env[MARKER] = "1"
    return env


def reexec_args(argv: list[str]) -> list[str]:
    """The interpreter command line to exec: `sys.orig_argv` keeps `-m pkg` and
    interpreter flags, which `sys.argv` loses; use it when its tail is argv[1:]."""
    orig = list(getattr(sys, "orig_argv", []))
    tail = argv[1:]
    if orig and (not tail or orig[-len(tail):] == tail):
        return [sys.executable, *orig[1:]]
    return [sys.executable, *argv]


def maybe_reexec_with_openblas(settings: Settings, argv: list[str]) -> None:
    """Exec this process again with OpenBLAS preloaded, at most once; returns if not.

    `argv` is this process's `sys.argv` (argv[0] = the script)."""
    if blas_reexec_marker():
        return
    env = reexec_env(settings, environ_snapshot())
    if env is None:
        return
    if "mlx" in sys.modules or "mlx.core" in sys.modules:
        return  # too late to swap BLAS in this process; rule 4
    args = reexec_args(argv)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, args, env)
    except OSError:
        return
