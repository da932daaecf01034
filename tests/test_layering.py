"""The layering STYLE.md promises, pinned: imports run `app -> adapters -> core <- engine`.

- core/ and the KV accounting / scheduler modules import neither MLX nor Starlette;
- every adapter module imports no MLX (it translates wire formats, nothing more).
Each group is imported in a fresh interpreter and its sys.modules inspected.
"""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import pytest

import frink_mlx.adapters
import frink_mlx.core


def _modules(package: object) -> list[str]:
    prefix = package.__name__ + "."  # type: ignore[attr-defined]
    found = [package.__name__]  # type: ignore[attr-defined]
    found += [m.name for m in pkgutil.walk_packages(package.__path__, prefix)]  # type: ignore[attr-defined]
    return found


ACCOUNTING = ["frink_mlx.engine.scheduler", "frink_mlx.engine.kv.block_pool",
              "frink_mlx.engine.kv.manager", "frink_mlx.engine.kv.hashing",
              "frink_mlx.engine.admission"]


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules) +
            "print('\\n'.join(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def _roots(loaded: set[str], roots: tuple[str, ...]) -> list[str]:
    return sorted(m for m in loaded if m.split(".")[0] in roots)


@pytest.mark.parametrize("group", ["core", "accounting"])
def test_core_and_accounting_import_no_mlx_nor_starlette(group: str) -> None:
    modules = _modules(frink_mlx.core) if group == "core" else ACCOUNTING
    bad = _roots(_loaded_after_import(modules), ("mlx", "mlx_lm", "starlette"))
    assert bad == [], f"{group} pulled in {bad[:5]}"


def test_adapters_import_no_mlx() -> None:
    bad = _roots(_loaded_after_import(_modules(frink_mlx.adapters)), ("mlx", "mlx_lm"))
    assert bad == [], f"adapters pulled in {bad[:5]}"
