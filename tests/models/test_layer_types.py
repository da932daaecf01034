"""models/layer_types.py: a layer type its model file does not know is found before load
(loader rule 12); the names a file does know, and keys it never reads, pass."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from frink_mlx.models.layer_types import unknown_layer_types

sys.path.insert(0, str(Path(__file__).parents[1] / "engine"))
from hybrid_support import CONFIGS, config  # noqa: E402


@pytest.mark.parametrize("family", sorted(CONFIGS))
def test_the_hybrid_families_layer_types_are_known(family: str) -> None:
    assert unknown_layer_types(config(family)) is None


def test_an_unknown_name_in_layer_types_is_found_where_the_file_would_serve_a_default() -> None:
    cfg = config("lfm2")  # lfm2 serves every name but "full_attention" as a convolution
    cfg["layer_types"][2] = "mystery_mixer"
    assert unknown_layer_types(cfg) == ("lfm2", "layer_types", ["mystery_mixer"])
    cfg = config("gpt_oss")
    cfg["layer_types"] = ["chunked_attention", "full_attention"]
    assert unknown_layer_types(cfg) == ("gpt_oss", "layer_types", ["chunked_attention"])


def test_a_pattern_string_is_read_one_layer_per_character() -> None:
    cfg = config("nemotron_h")
    cfg["hybrid_override_pattern"] = "M*?M"
    assert unknown_layer_types(cfg) == ("nemotron_h", "hybrid_override_pattern", ["?"])


def test_keys_the_file_never_reads_and_its_default_branch_names_pass() -> None:
    cfg = config("qwen3_5")  # Qwen3.5's file reads full_attention_interval, not layer_types
    cfg["text_config"]["layer_types"] = ["linear_attention", "anything"]
    assert unknown_layer_types(cfg) is None
    assert unknown_layer_types({"model_type": "exaone_moe", "layer_types": [
        "sliding_attention", "full_attention"]}) is None
    assert unknown_layer_types({"model_type": "no_such_architecture"}) is None
