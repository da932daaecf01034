"""A config whose layer types its model file does not know is refused before it loads.

Why: mlx-lm's model files pick each layer's kind by comparing a config list
(`layer_types`, Jamba's `layers_block_type`, Nemotron-H's
`hybrid_override_pattern`) with a few names, and most fall through to a default
kind on any other name: lfm2 serves an unknown type as a short convolution,
gpt_oss and olmo3 as sliding attention. A misspelt or newer layer type would
then be served as the wrong layer (wrong tokens, or an error at the first step)
instead of refused (loader rule 12).

Rules:
1. Only a key the family's own args dataclasses declare is checked (mlx-lm
   ignores the others: Qwen3.5's `layer_types` is not read, its
   `full_attention_interval` is), in the config and in its `text_config`.
2. A name is known when the model file (or a sibling module it imports from)
   spells it as a string literal, or `ELSE_BRANCH` lists it: the names a file
   serves only through its default branch (lfm2's "conv", exaone_moe's
   "full_attention").
3. A string value (a pattern) is read one character per layer, as
   Nemotron-H's is.
4. A config mlx-lm cannot map to a model file is left to mlx-lm's own error.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import re
import sys
from collections.abc import Iterable
from types import ModuleType
from typing import Any

LAYER_KEYS = ("layer_types", "layers_block_type", "hybrid_override_pattern", "block_types")
# rule 2: checked against the family survey's configs (benchmarks/family_survey.py)
ELSE_BRANCH: dict[str, tuple[str, ...]] = {"lfm2": ("conv",), "lfm2_moe": ("conv",),
                                           "exaone_moe": ("full_attention",)}


def unknown_layer_types(config: dict[str, Any]) -> tuple[str, str, list[str]] | None:
    """(family, key, unknown names) for the first key with names the model file does not
    know; None when every checked name is known (module rules)."""
    module = _model_module(config)
    if module is None:
        return None
    family = module.__name__.rsplit(".", 1)[-1]
    fields = _declared_fields(module)
    known = _literals(module) | set(ELSE_BRANCH.get(family, ()))
    for part in (config, config.get("text_config")):
        if not isinstance(part, dict):
            continue
        for key in LAYER_KEYS:
            names = _names(part.get(key)) if key in fields else []
            unknown = sorted({n for n in names if n not in known})
            if unknown:
                return family, key, unknown
    return None


def _model_module(config: dict[str, Any]) -> ModuleType | None:
    try:
        from mlx_lm.utils import _get_classes

        model_class, _ = _get_classes(config)
    except Exception:  # noqa: BLE001 - rule 4
        return None
    return sys.modules[model_class.__module__]


def _declared_fields(module: ModuleType) -> set[str]:
    return {f.name for obj in vars(module).values()
            if inspect.isclass(obj) and dataclasses.is_dataclass(obj)
            and obj.__module__ == module.__name__ for f in dataclasses.fields(obj)}


def _literals(module: ModuleType) -> set[str]:
    """Rule 2: every short string literal of the module and its sibling model modules."""
    siblings = {module.__name__} | {getattr(obj, "__module__", "") for obj in vars(module).values()}
    found: set[str] = set()
    for name in siblings:
        if name.startswith("mlx_lm.models."):
            source = inspect.getsource(importlib.import_module(name))
            found.update(re.findall(r"""["']([A-Za-z0-9_*\-+]{1,40})["']""", source))
    return found


def _names(value: Any) -> Iterable[str]:
    if isinstance(value, str):  # rule 3
        return list(value)
    if isinstance(value, list):
        return [v for v in value if isinstance(v, str)]
    return []
