"""backend/distributed.py rules 3-4 without a group: which split, what is refused, and
what a pipeline stage keeps (its layers, its weights, its KV bytes per token)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import mlx.core as mx
import numpy as np
import pytest
from conftest import make_tiny_qwen2
from mlx_lm.models import llama, qwen2

from frink_mlx.backend import select_backend
from frink_mlx.backend.distributed import DistributedGroup, choose_split, shard_model, split_code
from frink_mlx.engine.kv.layout import BatchLayout, RowSpan
from frink_mlx.engine.kv.paged import PagedKVStore, PagedLayerCache
from frink_mlx.errors import ConfigError, ModelFormatError
from frink_mlx.models.budget import kv_bytes_per_token, weights_nbytes
from frink_mlx.models.loader import load_model
from frink_mlx.registry import ModelSpec
from frink_mlx.settings import Settings

CONFIG = {"model_type": "qwen2", "hidden_size": 32, "num_hidden_layers": 3, "intermediate_size": 64,
          "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
          "vocab_size": 64, "tie_word_embeddings": True}


def _qwen2(**overrides: int) -> qwen2.Model:
    return qwen2.Model(qwen2.ModelArgs.from_dict({**CONFIG, **overrides}))


def _llama() -> llama.Model:
    return llama.Model(llama.ModelArgs.from_dict({**CONFIG, "model_type": "llama"}))


@dataclass
class FakeGroup:
    """What `PipelineMixin.pipeline` asks of a group: its rank and size."""

    r: int
    n: int

    def rank(self) -> int:
        return self.r

    def size(self) -> int:
        return self.n


def _group(rank: int, size: int, split: str) -> DistributedGroup:
    return DistributedGroup(FakeGroup(rank, size), rank, size, "ring", split)  # type: ignore[arg-type]


def test_auto_takes_tensor_where_heads_divide_else_pipeline():
    assert choose_split(_qwen2(), 2) == "tensor"
    assert choose_split(_qwen2(num_key_value_heads=1), 2) == "pipeline"
    assert choose_split(_qwen2(), 2, "pipeline") == "pipeline"
    assert choose_split(_llama(), 2) == "tensor"


def test_a_split_the_model_cannot_make_is_refused_with_the_reason():
    with pytest.raises(ModelFormatError, match="num_key_value_heads=1 does not divide by the "
                                               "group size 2"):
        choose_split(_qwen2(num_key_value_heads=1), 2, "tensor")
    with pytest.raises(ModelFormatError, match="pipeline parallel: the model file has no `pipeline`"):
        choose_split(_llama(), 2, "pipeline")
    with pytest.raises(ModelFormatError, match="3 layers cannot give each of 4 ranks one"):
        choose_split(_qwen2(num_attention_heads=3, num_key_value_heads=3), 4)


def test_a_model_allowing_neither_split_is_refused_naming_both_reasons():
    neither = SimpleNamespace(args=SimpleNamespace(num_attention_heads=4))
    with pytest.raises(ModelFormatError) as info:
        choose_split(neither, 2)
    assert "tensor parallel: the model file has no `shard`" in str(info.value)
    assert "pipeline parallel: the model file has no `pipeline`" in str(info.value)


def test_the_commit_round_tells_the_kinds_apart():
    """serving/distributed.py rule 2: ranks that split differently load nothing."""
    assert len({split_code("tensor"), split_code("pipeline"), split_code(None)}) == 3
    assert split_code(None) == 0


def test_the_setting_is_checked_and_reaches_the_group_config():
    assert Settings(distributed_split="pipeline").group_config().split == "pipeline"
    assert Settings().group_config().split == "auto"
    with pytest.raises(ConfigError, match="distributed_split 'layers'"):
        Settings(distributed_split="layers").group_config()


@pytest.mark.parametrize(("rank", "kept"), [(0, 2), (1, 1)])
def test_a_pipeline_stage_loads_and_prices_only_its_layers(tmp_path: Path, rank: int, kept: int,
                                                           monkeypatch: pytest.MonkeyPatch):
    """Rank 0 keeps the last two of three layers, rank 1 the first (mlx-lm's split); the
    other layers are never read from disk (models/loader.py rule 9). The cache-spec probe
    (loader rule 10) builds a stage's send and receive, which a fake group cannot: the
    group tests (tests/serving/test_distributed*.py) run it over a real one."""
    import frink_mlx.models.loader as loader

    monkeypatch.setattr(loader, "model_cache_spec", lambda model, evaluate: None)
    path = make_tiny_qwen2(tmp_path / "q", num_hidden_layers=3)
    spec = ModelSpec(name="q", source=str(path))
    backend = select_backend(Settings().backend_config())  # this machine's (backend/select.py)
    config = Settings(cache_dir=str(tmp_path / "cache")).load_config()
    whole = load_model(spec, config, backend)
    shard = functools.partial(lambda group, model: (shard_model(model, group), group.size),
                              _group(rank, 2, "pipeline"))
    before = mx.get_active_memory()
    mx.reset_peak_memory()
    part = load_model(spec, config, backend, shard=shard)
    loaded_bytes = mx.get_peak_memory() - before
    assert (part.parallel, part.num_ranks) == ("pipeline", 2)
    assert len(part.model.layers) == kept
    per_layer = kv_bytes_per_token(whole.model, whole.dtype) // 3
    assert kv_bytes_per_token(part.model, part.dtype) == kept * per_layer
    layer_bytes = weights_nbytes(whole.model.layers[0])
    assert weights_nbytes(part.model) == weights_nbytes(whole.model) - (3 - kept) * layer_bytes
    assert loaded_bytes < weights_nbytes(part.model) + layer_bytes // 2


def _address(pool: mx.array) -> int:
    return int(np.asarray(pool).__array_interface__["data"][0])


def test_a_layer_cache_takes_back_its_keys_plus_a_dependency_only():
    """paged.py rule 6, and rule 1 still holds after it: the next write stays in place."""
    store = PagedKVStore(num_layers=2, num_blocks=2, block_size=4, n_kv_heads=1, head_dim=4,
                         dtype=mx.float32)
    address = _address(store.keys[1])
    for step in range(2):
        layout = BatchLayout([RowSpan(step, 1, [0])], block_size=4, trash_slot=store.trash_slot)
        cache = PagedLayerCache(store, 1, layout)
        sent = mx.ones((1,)) * step  # stands for the hidden state sent to the next stage
        cache.update_and_fetch(mx.full((1, 1, 1, 4), step + 1.0), mx.zeros((1, 1, 1, 4)))
        cache.keys = mx.depends(cache.keys, sent)  # what a pipeline stage does
        mx.eval(store.arrays())
    assert store.keys[1][0, :2, 0].tolist() == [1.0, 2.0]
    assert _address(store.keys[1]) == address
    with pytest.raises(ValueError, match="rule 6"):
        cache.keys = mx.zeros((1, 8, 4))


def _family(family: str, **text: int) -> object:
    """hybrid_support.py's tiny config of `family` (text_config fields overridden), unweighted."""
    import importlib
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "engine"))
    from hybrid_support import config

    cfg = config(family)
    cfg.get("text_config", cfg).update(text)
    module = importlib.import_module(f"mlx_lm.models.{cfg['model_type']}")
    return module.Model(module.ModelArgs.from_dict(cfg))


def test_hybrid_families_split_as_their_model_files_allow():
    """Rule 4 over issue 29's families: qwen3_5 (and its MoE) has both, its heads read from
    its text_config, its GatedDeltaNet heads must divide too; qwen3_next has a pipeline only;
    the others have neither and are refused naming the model file."""
    assert choose_split(_family("qwen3_5"), 2) == "tensor"
    assert choose_split(_family("qwen3_5_moe"), 2) == "tensor"
    assert choose_split(_family("qwen3_5", linear_num_key_heads=1), 2) == "pipeline"
    with pytest.raises(ModelFormatError, match="linear_num_key_heads=1 does not divide"):
        choose_split(_family("qwen3_5", linear_num_key_heads=1), 2, "tensor")
    assert choose_split(_family("qwen3_next"), 2) == "pipeline"
    for family in ("lfm2", "nemotron_h", "granitemoehybrid", "falcon_h1", "gemma3_text"):
        with pytest.raises(ModelFormatError) as info:
            choose_split(_family(family), 2)
        line = str(info.value)
        assert "\n" not in line and line.startswith(f"model file {family} cannot be split")
        assert "no `shard`" in line and "no `pipeline`" in line
