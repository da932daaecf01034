"""What `frink-mlx serve` (and `make run`) says while it converts and loads a model:
one line before each long step, on the module loggers (stderr under serve)."""

from __future__ import annotations

import logging
from pathlib import Path

from gguf_helpers import write_float_gguf

from frink_mlx.models.gguf import import_gguf


def _messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name.startswith("frink_mlx.models")]


def test_a_gguf_conversion_says_so_once(tiny_llama_dir: Path, tmp_path: Path, caplog) -> None:
    path = write_float_gguf(tiny_llama_dir, tmp_path / "tiny.gguf")
    with caplog.at_level(logging.INFO, logger="frink_mlx.models"):
        import_gguf(path, tmp_path / "cache")
    first = _messages(caplog)
    assert len(first) == 2
    assert first[0].startswith("converting tiny.gguf (") and "(once; later starts reuse it)" in first[0]
    assert first[1].startswith("converted tiny.gguf in ")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="frink_mlx.models"):
        import_gguf(path, tmp_path / "cache")      # cached: nothing to say
    assert _messages(caplog) == []


def test_loading_names_the_model_and_its_steps(tiny_llama_dir: Path, caplog) -> None:
    from frink_mlx.config import EncoderConfig, LoadConfig
    from frink_mlx.models.loader import load_model
    from frink_mlx.registry import ModelSpec

    spec = ModelSpec(name="tiny", source=str(tiny_llama_dir))
    config = LoadConfig(cache_dir="/nonexistent", dequantize=None,
                        encoder=EncoderConfig(embed_batch_size=4, cpu_matmul_parts=None))
    with caplog.at_level(logging.INFO, logger="frink_mlx.models"):
        load_model(spec, config)
    assert _messages(caplog) == [f"loading tiny from {tiny_llama_dir}", "tiny: warming up (one forward pass)"]
