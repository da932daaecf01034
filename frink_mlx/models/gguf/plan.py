"""How GGUF tensors become one mlx-lm parameter: the `Plan`, and the model's own layout.

Why: most parameters are one GGUF tensor under another name, but llama.cpp's
converter also reorders rows (rotary Q/K, Qwen3.5's V heads), splits or fuses
projections (Qwen3-Next's qkvz, Granite's shared MLP), stores transformed
values (Mamba's A = -exp(A_log), Gemma's norms + 1) and squeezes shapes (conv
kernels). A `Plan` names the GGUF tensors of one parameter and the exact
inverse steps, so the importer runs one conversion loop for every family and
each family states only its own quirks (arch.py, hybrid_*.py, mixed.py).

Rules (the order the importer applies them in):
1. `sources` are stacked along rows (axis 0 of each tensor's row view, whose
   rows are all axes but the last). Quantization groups run along the last axis,
   so stacking and reordering rows keep MLX affine tensors exact. Sources whose
   types would convert to different bit widths are dequantized and re-quantized
   together at the widest (mx.quantize, group 32).
2. `rows`: HF row i is stacked row rows[i]. A 1-D tensor (one GGUF row) is
   reordered element-wise instead.
3. `col_blocks` (width, order): columns regrouped in blocks of `width`, block j
   of the result being block order[j] of the source. Quantized tensors move
   whole groups when `width` is a multiple of the group size; otherwise the
   parameter is kept dequantized (float32).
4. `values`: an element-wise map on float values (forces float32).
5. `reshape`: the GGUF shape may differ from the model's if the element count
   (and, when quantized, the row length) agrees; otherwise shapes must be equal.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ...errors import ModelFormatError

Meta = dict[str, Any]
# A family's config hook: (metadata, "arch." prefix, config holding the base keys, tensor names,
# rope tensors by name); it adds the family's keys in place.
ConfigFn = Callable[[Meta, str, dict[str, Any], set[str], dict[str, np.ndarray]], None]


@dataclass(slots=True)
class Plan:
    """One mlx-lm parameter from GGUF tensors (module rules 1-5)."""

    sources: tuple[str, ...]
    rows: np.ndarray | None = None
    col_blocks: tuple[int, np.ndarray] | None = None
    values: Callable[[np.ndarray], np.ndarray] | None = None
    reshape: bool = False


@dataclass(slots=True)
class ModelLayout:
    """What the mlx-lm model expects: parameter shapes and the modules that can be quantized."""

    shapes: dict[str, tuple[int, ...]]
    quantizable: set[str]


# A family's plan hook: (plans by parameter, GGUF names nothing claimed yet, config, layout).
# It may add, replace or drop plans, and claims the unplaced names it uses (removing them).
PlanFn = Callable[[dict[str, Plan], list[str], dict[str, Any], ModelLayout], None]


@dataclass(slots=True, frozen=True)
class ArchSpec:
    model_type: str  # mlx-lm model file
    gguf_arch: str  # the gguf package's name map to invert
    permute_qk: bool = False  # arch.py rule 1
    norm_shift: float = 0.0  # arch.py rule 2
    renames: tuple[tuple[str, str], ...] = ()  # HF-name fragments -> mlx-lm's (arch.py rule 3)
    prefix: str = ""  # where mlx-lm nests the text model (qwen3_5: "language_model.")
    config: ConfigFn | None = None  # builds the family's config on the base keys (arch.py rule 10)
    plan: PlanFn | None = None
    skip: tuple[str, ...] = field(default=())  # GGUF name fragments with no mlx-lm parameter


def model_layout(config: dict[str, Any]) -> ModelLayout:
    from mlx.utils import tree_flatten

    module = importlib.import_module(f"mlx_lm.models.{config['model_type']}")
    try:
        model = module.Model(module.ModelArgs.from_dict(config))
    except (TypeError, ValueError, KeyError, AssertionError, IndexError) as exc:
        raise ModelFormatError(
            f"GGUF metadata does not make a valid {config['model_type']} model: {exc}") from None
    flat: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    return ModelLayout(shapes={name: tuple(v.shape) for name, v in flat},
                       quantizable={name for name, m in model.named_modules() if hasattr(m, "to_quantized")})


def num(meta: Meta, key: str, default: Any = None) -> Any:
    """A scalar metadata value; a per-layer array must hold one value throughout."""
    value = meta.get(key, default)
    if value is None:
        raise ModelFormatError(f"GGUF metadata is missing {key}")
    if isinstance(value, np.ndarray):
        if value.size == 0 or not (value == value.flat[0]).all():
            raise ModelFormatError(f"GGUF metadata {key} varies per layer, which mlx-lm cannot express")
        value = value.flat[0].item()
    return value


def per_layer(meta: Meta, key: str, num_layers: int, default: Any = None) -> list[Any]:
    """A per-layer metadata array (a scalar is every layer's value)."""
    value = meta.get(key, default)
    if value is None:
        raise ModelFormatError(f"GGUF metadata is missing {key}")
    if isinstance(value, (np.ndarray, list)):
        values = [v.item() if hasattr(v, "item") else v for v in np.asarray(value).reshape(-1)]
        if len(values) != num_layers:
            raise ModelFormatError(f"GGUF metadata {key} has {len(values)} entries for {num_layers} layers")
        return values
    return [value] * num_layers


_BLOCK = re.compile(r"^blk\.(\d+)\.")


def layer_of(name: str) -> int | None:
    """The block index of a GGUF tensor name (`blk.N.*`), or None."""
    match = _BLOCK.match(name)
    return int(match.group(1)) if match else None


def claim(unplaced: list[str], name: str) -> bool:
    """Take `name` out of the unplaced GGUF names if it is there (a plan hook uses it)."""
    if name in unplaced:
        unplaced.remove(name)
        return True
    return False


def split_gate_up(plans: dict[str, Plan], unplaced: list[str], layout: ModelLayout, gate_suffix: str) -> None:
    """Experts' fused `ffn_gate_up_exps` (per expert: gate rows, then up rows) -> the model's
    separate gate and up parameters ending `gate_suffix` / its up_proj twin."""
    for hf in layout.shapes:
        if not hf.endswith(gate_suffix) or hf in plans:
            continue
        fused = f"blk.{hf.split('.layers.')[1].split('.')[0]}.ffn_gate_up_exps.weight"
        if not claim(unplaced, fused):
            continue
        experts, rows, _ = layout.shapes[hf]
        halves = np.arange(experts * 2 * rows).reshape(experts, 2, rows)
        plans[hf] = Plan((fused,), rows=halves[:, 0].reshape(-1))
        plans[hf.replace(".gate_proj.", ".up_proj.")] = Plan((fused,), rows=halves[:, 1].reshape(-1))


def inverse_permute_rows(num_rows: int, num_heads: int) -> np.ndarray:
    """arch.py rule 1: index array taking GGUF's interleaved rotary rows back to HF's halves.

        GGUF row (head h, pair i, half j) = h*hd + 2*i + j  <-  HF row h*hd + j*hd/2 + i
    """
    head_dim = num_rows // num_heads
    return np.arange(num_rows).reshape(num_heads, head_dim // 2, 2).swapaxes(1, 2).reshape(-1)


def grouped_from_tiled(num_groups: int, per_group: int, width: int) -> np.ndarray:
    """Index array taking heads tiled across groups back to grouped (llama.cpp's V-head reorder).

        tiled   (j, g, d) = j*G*w + g*w + d   <-   grouped (g, j, d) = g*J*w + j*w + d
    """
    return np.arange(num_groups * per_group * width).reshape(per_group, num_groups, width) \
        .swapaxes(0, 1).reshape(-1)


def interleave_blocks(sizes: list[int], num_blocks: int) -> np.ndarray:
    """Rows of sources stacked whole (s0 | s1 | ...) -> per-block interleaved (s0_b s1_b ...)*blocks.

    `sizes` are each source's rows; each splits into `num_blocks` equal blocks."""
    starts = np.cumsum([0, *sizes[:-1]])
    order = [np.arange(start + b * size // num_blocks, start + (b + 1) * size // num_blocks)
             for b in range(num_blocks) for start, size in zip(starts, sizes)]
    return np.concatenate(order)


def take_rows(array: np.ndarray, order: np.ndarray) -> np.ndarray:
    """Rule 2 on one converted array (2-D: rows, then values or packed words)."""
    if array.shape[0] == 1 and array.shape[1] == order.size:  # a 1-D tensor: its elements
        return array[:, order]
    return array[order]


def move_col_blocks(array: np.ndarray, width: int, order: np.ndarray) -> np.ndarray:
    """Rule 3 on one array whose last axis holds `order.size` blocks of `width` entries."""
    lead = array.shape[:-1]
    blocks = array.reshape(*lead, order.size, width)
    return np.ascontiguousarray(blocks[..., order, :]).reshape(*lead, order.size * width)
