"""GGUF RoPE metadata -> mlx-lm's `rope_scaling` (arch.py rule 6).

Why a module of its own: every family's config builder needs it (arch.py for
the plain ones, mixed.py for gpt-oss), and mixed.py is imported by arch.py, so
the builders share it from below rather than import each other.

Rules:
1. Linear scaling and YaRN map onto mlx-lm's `rope_scaling` of the same type
   (a linear factor of 1 is no scaling); YaRN's beta_fast / beta_slow come
   along when the GGUF has them.
2. Llama-3.1's `rope_freqs.weight` holds one divisor per rotary frequency,
   applied at every position (llama.cpp); mlx-lm's "longrope" with long =
   short = those factors and original = trained context is exactly that (its
   extra input scale is 1 when the two lengths are equal).
3. phi3's `rope_factors_long/short` are longrope itself.
4. Any other scaling type is refused by name (ModelFormatError).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import ModelFormatError
from .plan import num


def rope_scaling(meta: dict[str, Any], p: str, rope: dict[str, np.ndarray],
                  context: int) -> dict[str, Any] | None:
    """The rules above: `rope_scaling` for one architecture prefix `p` (None: no scaling)."""
    kind = str(meta.get(p + "rope.scaling.type") or "none")
    factor = float(num(meta, p + "rope.scaling.factor", 1.0))
    original = int(num(meta, p + "rope.scaling.original_context_length", context))
    if "rope_factors_long.weight" in rope:
        long = rope["rope_factors_long.weight"].tolist()
        short = rope.get("rope_factors_short.weight", rope["rope_factors_long.weight"]).tolist()
        return {"type": "longrope", "long_factor": long, "short_factor": short,
                "original_max_position_embeddings": original}
    if "rope_freqs.weight" in rope:
        factors = rope["rope_freqs.weight"].tolist()
        return {"type": "longrope", "long_factor": factors, "short_factor": factors,
                "original_max_position_embeddings": context}
    if kind in ("none", "") or (kind == "linear" and factor == 1.0):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": factor}
    if kind == "yarn":
        scaling = {"type": "yarn", "factor": factor, "original_max_position_embeddings": original}
        for key in ("beta_fast", "beta_slow"):
            if meta.get(f"{p}rope.scaling.yarn_{key}") is not None:
                scaling[key] = float(num(meta, f"{p}rope.scaling.yarn_{key}"))
        return scaling
    raise ModelFormatError(f"unsupported GGUF RoPE scaling {p}rope.scaling.type={kind!r} "
                           "(supported: linear, yarn, llama3 rope_freqs, phi3 longrope)")
