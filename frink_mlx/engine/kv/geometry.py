"""What a stock mlx-lm model's attention layers look like to the paged cache.

Why apart from paged.py: the budget (models/budget.py), the engine and the
draft model read a model's geometry without building any pool.
"""

from __future__ import annotations

from typing import Any

# mlx-lm model files whose attention scores queries reshaped per KV group (paged.py rule 5).
_GROUPED_SCORE_MODULES = frozenset({"mlx_lm.models.gemma2"})


def groups_queries_per_kv_head(model: Any) -> bool:
    """True if `model` needs paged.py rule 5's grouped mask (its attention repeats queries per KV head)."""
    if type(model).__module__ not in _GROUPED_SCORE_MODULES:
        return False
    layers = getattr(model, "layers", None) or []
    return any(getattr(getattr(layer, "self_attn", None), "repeats", 1) > 1 for layer in layers)


def model_kv_geometry(model: Any) -> tuple[int, int, int]:
    """(num_layers, n_kv_heads, head_dim) of a stock mlx-lm model."""
    layers = getattr(model, "layers", None)
    if layers is None:
        raise ValueError("model has no `layers`; cannot size a paged KV cache for it")
    attn = getattr(layers[0], "self_attn", None)
    args = getattr(model, "args", None)
    n_kv = getattr(attn, "n_kv_heads", None) or getattr(args, "num_key_value_heads", None)
    head_dim = getattr(attn, "head_dim", None) or getattr(args, "head_dim", None)
    if head_dim is None and args is not None:
        head_dim = args.hidden_size // args.num_attention_heads
    if n_kv is None or head_dim is None:
        raise ValueError("cannot read n_kv_heads/head_dim from the model's attention layers")
    return len(layers), int(n_kv), int(head_dim)
