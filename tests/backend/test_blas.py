"""The one-time OpenBLAS re-exec: when it happens, that it never loops."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from frink_mlx.backend.cpu import blas
from frink_mlx.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
LIB = Path("/usr/lib/x86_64-linux-gnu/libopenblas.so.0")


def test_reexec_env_rules(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    lib = tmp_path / "libopenblas.so.0"
    monkeypatch.setattr(blas, "openblas_path", lambda: lib)
    monkeypatch.setattr(blas.sys, "platform", "linux")
    on, off = Settings().backend_config(), Settings(use_openblas=False).backend_config()
    env = blas.reexec_env(on, {"PATH": "/bin", "LD_PRELOAD": "/x.so"})
    assert env == {"PATH": "/bin", "LD_PRELOAD": f"{lib}:/x.so", "FRINK_MLX_BLAS_REEXEC": "1"}
    assert blas.reexec_env(on, {})["LD_PRELOAD"] == str(lib)  # type: ignore[index]
    assert blas.reexec_env(off, {}) is None                                   # setting off
    assert blas.reexec_env(on, {"FRINK_MLX_BLAS_REEXEC": "1"}) is None        # marker: never loops
    assert blas.reexec_env(on, {"LD_PRELOAD": "/usr/lib/libopenblas.so"}) is None  # already there
    monkeypatch.setattr(blas, "suggested_coretype", lambda lib, probe: "SkylakeX")
    assert blas.reexec_env(on, {})["OPENBLAS_CORETYPE"] == "SkylakeX"  # type: ignore[index]
    kept = blas.reexec_env(on, {"OPENBLAS_CORETYPE": "Haswell"})         # the user's choice stays
    assert kept is not None and kept["OPENBLAS_CORETYPE"] == "Haswell"
    monkeypatch.setattr(blas, "suggested_coretype", lambda lib, probe: None)
    monkeypatch.setattr(blas, "openblas_path", lambda: None)
    assert blas.reexec_env(on, {}) is None                                    # not installed
    monkeypatch.setattr(blas.sys, "platform", "darwin")
    monkeypatch.setattr(blas, "openblas_path", lambda: lib)
    assert blas.reexec_env(on, {}) is None                                    # Linux only


AVX512 = {"sse3", "avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}


def test_coretype_override_only_upgrades_a_weaker_detection() -> None:
    assert blas.coretype_override("Prescott", AVX512) == "SkylakeX"   # unknown VM CPU
    assert blas.coretype_override("Prescott", {"avx2", "fma"}) == "Haswell"
    assert blas.coretype_override("Haswell", AVX512) == "SkylakeX"
    assert blas.coretype_override("SkylakeX", AVX512) is None          # detection was right
    assert blas.coretype_override("Zen", {"avx2", "fma"}) is None
    assert blas.coretype_override("Prescott", {"sse3", "avx"}) is None  # nothing better to pick
    assert blas.coretype_override(None, AVX512) is None                 # library not loadable


def test_cpu_flags_reads_the_first_cpu() -> None:
    text = "processor\t: 0\nflags\t\t: fpu sse avx2 fma\n\nprocessor\t: 1\nflags\t: fpu\n"
    assert blas.cpu_flags(text) == {"fpu", "sse", "avx2", "fma"}
    assert blas.cpu_flags("") == set()


@pytest.mark.skipif(not LIB.exists(), reason="Debian's OpenBLAS is not installed")
def test_detected_core_names_a_kernel_class() -> None:
    core = blas.detected_core(LIB)
    assert core and core.isprintable()
    assert blas.detected_core(Path("/nonexistent/libopenblas.so.0")) is None


SCRIPT = """
import os, sys
sys.path.insert(0, {root!r})
from frink_mlx.settings import Settings, environ_snapshot
from frink_mlx.backend.cpu.blas import maybe_reexec_with_openblas
print("run", os.environ.get("LD_PRELOAD", ""), os.environ.get("FRINK_MLX_BLAS_REEXEC", ""),
      sys.argv[1:], flush=True)
maybe_reexec_with_openblas(Settings.load().backend_config(), sys.argv, environ_snapshot())
import mlx.core
maybe_reexec_with_openblas(Settings.load().backend_config(), sys.argv, environ_snapshot())
print("done", flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or not LIB.exists(),
                    reason="needs Debian's libopenblas0-pthread")
def test_reexecs_exactly_once_with_the_same_argv(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(SCRIPT.format(root=str(ROOT)))
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "FRINK_MLX_BLAS_REEXEC", "FRINK_MLX_USE_OPENBLAS")}
    out = subprocess.run([sys.executable, str(script), "a", "--b"], env=env, capture_output=True,
                         text=True, timeout=60).stdout.splitlines()
    assert out == ["run   ['a', '--b']", f"run {LIB} 1 ['a', '--b']", "done"]
    env["FRINK_MLX_USE_OPENBLAS"] = "false"
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                         text=True, timeout=60).stdout.splitlines()
    assert out == ["run   []", "done"]


def test_set_openblas_threads_reports_whether_openblas_is_loaded():
    import ctypes

    try:
        ctypes.CDLL(None).openblas_set_num_threads  # noqa: B018 - the lookup is the probe
        loaded = True
    except AttributeError:
        loaded = False
    assert blas.set_openblas_threads(1) is loaded
