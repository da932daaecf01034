"""Re-execute once with the system OpenBLAS preloaded (Linux CPU backend).

Why: MLX's Linux CPU wheel bundles reference BLAS, ~30x slower than OpenBLAS
on the matmuls that dominate CPU inference. The BLAS symbols are resolved when
MLX's shared library loads, so the only reliable switch is `LD_PRELOAD` before
the interpreter starts: we exec the same interpreter with the same argv once.

Rules:
1. Only on Linux, only when `config.use_openblas`, only when Debian's
   `libopenblas0-pthread` library exists (PyPI's `cmeel-openblas` dies with an
   illegal instruction on some CPUs, so it is not used).
2. Never loops: the new process carries `FRINK_MLX_BLAS_REEXEC=1`; if that
   marker is set (or OpenBLAS is already in LD_PRELOAD) nothing happens.
3. The environment is handed in by the entry point (`settings.environ_snapshot()`:
   settings.py is the only reader of os.environ).
4. Must run before anything imports mlx; a failed exec is not fatal.
5. Kernel choice: OpenBLAS picks its kernels from the CPU's model number and
   falls back to generic SSE3 ("Prescott") kernels on CPUs it does not know,
   e.g. the anonymous "Intel Xeon Processor" of many VMs. On such a VM
   Prescott kernels are several times slower than the AVX-512 ones
   (benchmarks/results/cpu_backend-measurements.md). So when the detected core is a weaker class than
   the CPU's flags (/proc/cpuinfo) allow, the re-exec also sets
   `OPENBLAS_CORETYPE` to the strongest class the flags support. A value the
   user already set is kept.
6. Threads: where the engine splits its matmuls over MLX CPU streams itself
   (split.py), OpenBLAS's own threads are set to 1 at run time through
   `openblas_set_num_threads`, which the preloaded library exports.
"""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

from ...config import BackendConfig

MARKER = "FRINK_MLX_BLAS_REEXEC"  # settings.ENV_PREFIX + "BLAS_REEXEC"
_ARCH_DIRS = {"x86_64": "x86_64-linux-gnu", "amd64": "x86_64-linux-gnu",
              "aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu"}


def openblas_path() -> Path | None:
    """Debian's OpenBLAS for this machine, if installed."""
    arch = _ARCH_DIRS.get(platform.machine().lower())
    if arch is None:
        return None
    path = Path("/usr/lib") / arch / "libopenblas.so.0"
    return path if path.exists() else None


# Rule 5: OpenBLAS core names by kernel class; 0 = generic (anything not listed).
_AVX2_CORES = {"haswell", "zen", "skylake", "broadwell"}
_AVX512_CORES = {"skylakex", "cooperlake", "sapphirerapids"}
_AVX512_FLAGS = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
_CLASS_CORE = {1: "Haswell", 2: "SkylakeX"}


def cpu_flags(cpuinfo: str) -> set[str]:
    """The feature flags of the first CPU in a /proc/cpuinfo text."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "flags":
            return set(value.split())
    return set()


def _flags_class(flags: set[str]) -> int:
    if _AVX512_FLAGS <= flags:
        return 2
    return 1 if {"avx2", "fma"} <= flags else 0


def _core_class(core: str) -> int:
    name = core.strip().lower()
    return 2 if name in _AVX512_CORES else 1 if name in _AVX2_CORES else 0


def coretype_override(detected: str | None, flags: set[str]) -> str | None:
    """Rule 5: the OPENBLAS_CORETYPE to force, or None to keep OpenBLAS's own choice."""
    if detected is None:
        return None
    wanted = _flags_class(flags)
    return _CLASS_CORE[wanted] if wanted > _core_class(detected) else None


def detected_core(lib: Path) -> str | None:
    """The kernel class OpenBLAS picks on this CPU (loads the library; None if it cannot)."""
    try:
        fn = ctypes.CDLL(str(lib)).openblas_get_corename
        fn.restype = ctypes.c_char_p
        return fn().decode()
    except (OSError, AttributeError, UnicodeDecodeError):
        return None


def set_openblas_threads(count: int) -> bool:
    """Rule 6: OpenBLAS's thread count for this process; False where OpenBLAS
    is not loaded (MLX's bundled reference BLAS, Accelerate on macOS)."""
    try:
        fn = ctypes.CDLL(None).openblas_set_num_threads
    except (OSError, AttributeError):
        return False
    fn(ctypes.c_int(count))
    return True


def suggested_coretype(lib: Path | None = None,
                       probe: Callable[[Path], str | None] = detected_core) -> str | None:
    """Rule 5 for this machine: the OPENBLAS_CORETYPE to set, or None."""
    lib = lib or openblas_path()
    if lib is None:
        return None
    try:
        flags = cpu_flags(Path("/proc/cpuinfo").read_text())
    except OSError:
        return None
    return coretype_override(probe(lib), flags)


def reexec_env(config: BackendConfig, environ: dict[str, str],
               probe: Callable[[Path], str | None] = detected_core) -> dict[str, str] | None:
    """The environment to re-exec with, or None when no re-exec is wanted (rules 1-2, 5)."""
    if not sys.platform.startswith("linux") or not config.use_openblas:
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
    if "OPENBLAS_CORETYPE" not in environ:
        core = suggested_coretype(lib, probe)
        if core is not None:
            env["OPENBLAS_CORETYPE"] = core
    return env


def reexec_args(argv: list[str]) -> list[str]:
    """The interpreter command line to exec: `sys.orig_argv` keeps `-m pkg` and
    interpreter flags, which `sys.argv` loses; use it when its tail is argv[1:]."""
    orig = list(getattr(sys, "orig_argv", []))
    tail = argv[1:]
    if orig and (not tail or orig[-len(tail):] == tail):
        return [sys.executable, *orig[1:]]
    return [sys.executable, *argv]


def maybe_reexec_with_openblas(config: BackendConfig, argv: list[str],
                               environ: Mapping[str, str]) -> None:
    """Exec this process again with OpenBLAS preloaded, at most once; returns if not.

    `argv` is this process's `sys.argv` (argv[0] = the script)."""
    env = reexec_env(config, dict(environ))
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


if __name__ == "__main__":
    # `python -m frink_mlx.backend.cpu.blas` prints rule 5's choice (empty: none), for the
    # Makefile and the benchmarks, which preload OpenBLAS themselves.
    print(suggested_coretype() or "")
