"""What `frink-mlx serve` (and `make run`) says while it loads a model: one line before
each long step, on the module logger (stderr under serve). GGUF conversion progress is
the importer's own (models/gguf/importer.py and its tests)."""

from __future__ import annotations

import logging
from pathlib import Path

from frink_mlx.backend import select_backend
from frink_mlx.models.loader import load_model
from frink_mlx.registry import ModelSpec
from frink_mlx.settings import Settings


def test_loading_names_the_model_and_its_steps(tiny_llama_dir: Path, tmp_path: Path, caplog) -> None:
    spec = ModelSpec(name="tiny", source=str(tiny_llama_dir))
    config = Settings(cache_dir=str(tmp_path)).load_config()
    with caplog.at_level(logging.INFO, logger="frink_mlx.models"):
        load_model(spec, config, select_backend(Settings().backend_config()))
    said = [r.getMessage() for r in caplog.records if r.name == "frink_mlx.models"]
    # one line as each step starts and one as it ends (models/progress.py), naming the model
    assert said[0] == f"tiny: load {tiny_llama_dir}" and said[2] == "tiny: warm-up"
    assert [m.split(" done in ")[0] for m in said[1::2]] == ["tiny: load", "tiny: warm-up"]
