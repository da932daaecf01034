"""Adapters and parsers are pure translators: importing them must not load MLX."""

from __future__ import annotations

import subprocess
import sys

MODULES = ["frink_mlx.core.parsers", "frink_mlx.adapters.anthropic",
           "frink_mlx.adapters.llamacpp", "frink_mlx.adapters.openai.responses"]


def test_adapters_and_parsers_import_no_mlx() -> None:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in MODULES) +
            "bad = sorted(m for m in sys.modules if m == 'mlx' or m.startswith(('mlx.', 'mlx_lm')))\n"
            "print(','.join(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "", f"MLX imported by adapters: {out.stdout}"


def test_parsers_import_no_starlette() -> None:
    code = "import sys, frink_mlx.core.parsers\nprint('starlette' in sys.modules)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "False"
