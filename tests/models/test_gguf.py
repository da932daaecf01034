"""GGUF import: round trips against the original checkpoint, refusals, the cache,
and the real SmolLM2 file (config, tokenizer parity with an independent BPE)."""

from __future__ import annotations

import itertools
import json
import os
from pathlib import Path

import mlx.core as mx
import pytest
from gguf_helpers import patch_tensor_type, write_float_gguf, write_quantized_gguf

from frink_mlx.errors import ModelFormatError
from frink_mlx.models.gguf import IMPORTER_VERSION, content_hash, import_gguf

TOKENS = [[1, 5, 20, 100, 7, 300, 42, 2, 11]]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 12345 and 3.14159, 2026!",
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "  spaces   and\ttabs\n\n",
]


def logits(ckpt: Path) -> mx.array:
    import mlx_lm

    model, _ = mlx_lm.load(str(ckpt))
    return model(mx.array(TOKENS)).astype(mx.float32)


@pytest.fixture(scope="module")
def original(tiny_llama_dir: Path) -> mx.array:
    return logits(tiny_llama_dir)


def test_f32_round_trip_matches_original_logits(tiny_llama_dir: Path, tmp_path: Path,
                                                 original: mx.array) -> None:
    path = write_float_gguf(tiny_llama_dir, tmp_path / "tiny-f32.gguf")
    ckpt = import_gguf(path, tmp_path / "cache")
    config = json.loads((ckpt / "config.json").read_text())
    # Q/K rows are inverse-permuted back to the HF layout, so no traditional rope is needed
    assert not config.get("rope_traditional") and config["tie_word_embeddings"] is True
    assert "quantization" not in config and config["gguf"]["tensor_types"] == ["F32"]
    assert mx.allclose(logits(ckpt), original, atol=1e-4).item()
    imported = mx.load(str(ckpt / "model.safetensors"))
    source = mx.load(str(tiny_llama_dir / "model.safetensors"))
    assert imported.keys() == source.keys()
    assert all(mx.array_equal(imported[k], source[k]).item() for k in source)


def test_f16_round_trip_is_close(tiny_llama_dir: Path, tmp_path: Path, original: mx.array) -> None:
    path = write_float_gguf(tiny_llama_dir, tmp_path / "tiny-f16.gguf", dtype=mx.float16)
    ckpt = import_gguf(path, tmp_path / "cache")
    out = logits(ckpt)
    assert mx.abs(out - original).max().item() < 0.05
    assert (mx.argmax(out, -1) == mx.argmax(original, -1)).all().item()


def test_untied_output_becomes_lm_head(make_tiny_llama, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    ckpt = make_tiny_llama(tmp_path / "untied", tie_word_embeddings=False, seed=5)
    ckpt_out = import_gguf(write_float_gguf(ckpt, tmp_path / "untied.gguf"), tmp_path / "cache")
    assert json.loads((ckpt_out / "config.json").read_text())["tie_word_embeddings"] is False
    assert mx.allclose(logits(ckpt_out), logits(ckpt), atol=1e-4).item()


def test_imported_tokenizer_matches_original(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    ckpt = import_gguf(write_float_gguf(tiny_llama_dir, tmp_path / "t.gguf"), tmp_path / "cache")
    ours, theirs = load_tokenizer(ckpt), load_tokenizer(tiny_llama_dir)
    for text in TEXTS:
        assert ours.encode(text) == theirs.encode(text), text
        assert ours.decode(ours.encode(text)) == text
    assert ours.eos_token_id == theirs.eos_token_id
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == \
        theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def test_add_bos_token_prepends_bos(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    path = write_float_gguf(tiny_llama_dir, tmp_path / "bos.gguf", add_bos=True)
    tokenizer = load_tokenizer(import_gguf(path, tmp_path / "cache"))
    plain = load_tokenizer(tiny_llama_dir)
    assert tokenizer.encode("hello there") == [0] + plain.encode("hello there")
    assert tokenizer.encode("hello there", add_special_tokens=False) == plain.encode("hello there")


SPM_TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n",
    "Numbers 12345 and 3.14159, 2026!",
    "  leading spaces,   runs   of spaces, trailing  ",
    "Emoji 😀🎉 and accents: naïve café, 東京",
]


def test_sentencepiece_gguf_tokenizer_matches_sentencepiece(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """tokenizer.ggml.model = llama: compare with sentencepiece itself on a model
    trained here (BPE, byte fallback, no normalization, like Llama/Mistral)."""
    spm = pytest.importorskip("sentencepiece")
    import io

    from conftest import TRAIN_LINES
    from gguf_helpers import gguf_metadata, gguf_tensors
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(TRAIN_LINES), model_writer=proto, vocab_size=420, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, hard_vocab_limit=False,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i) else 1
             for i in range(n)]
    meta = gguf_metadata(tiny_llama_dir, tokenizer_model="llama")
    del meta["tokenizer.ggml.merges"]
    meta.update({
        "tokenizer.ggml.tokens": [sp.id_to_piece(i) for i in range(n)],
        "tokenizer.ggml.scores": mx.array([sp.get_score(i) for i in range(n)], dtype=mx.float32),
        "tokenizer.ggml.token_type": mx.array(types, dtype=mx.int32),
        "tokenizer.ggml.unknown_token_id": mx.array(0, dtype=mx.uint32),
        "tokenizer.ggml.bos_token_id": mx.array(1, dtype=mx.uint32),
        "tokenizer.ggml.eos_token_id": mx.array(2, dtype=mx.uint32),
    })
    mx.save_gguf(str(tmp_path / "spm.gguf"), gguf_tensors(tiny_llama_dir), meta)
    ours = load_tokenizer(import_gguf(tmp_path / "spm.gguf", tmp_path / "cache"))
    for text in SPM_TEXTS:
        want = sp.encode(text)
        assert ours.encode(text, add_special_tokens=False) == want, text
        assert ours.encode(text) == [1] + want  # add_bos_token defaults on for SentencePiece
        assert ours.decode(want) == text
    assert ours.encode("<s>hi</s>", add_special_tokens=False) == [1, *sp.encode("hi"), 2]
    assert ours.eos_token_id == 2


def test_quantized_tensors_stay_quantized_and_match_llama_cpp_dequantization(
        tiny_llama_dir: Path, tmp_path: Path) -> None:
    pytest.importorskip("gguf")
    from gguf_helpers import gguf_name

    qtypes = {"token_embd": "Q8_0", "attn_q": "Q4_0", "attn_k": "Q4_1", "ffn_": "Q4_0",
              "attn_output": "Q8_0"}
    path, reference = write_quantized_gguf(tiny_llama_dir, tmp_path / "q.gguf", qtypes)
    ckpt = import_gguf(path, tmp_path / "cache")
    quant = json.loads((ckpt / "config.json").read_text())["quantization"]
    assert quant["model.embed_tokens"] == {"group_size": 32, "bits": 8}
    assert quant["model.layers.1.self_attn.q_proj"] == {"group_size": 32, "bits": 4}
    assert quant["model.layers.0.self_attn.o_proj"]["bits"] == 8
    assert "model.layers.0.self_attn.v_proj" not in quant  # left F32

    # The float checkpoint llama.cpp's dequantization describes, in HF layout.
    ref_dir = tmp_path / "ref"
    ref_dir.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (ref_dir / name).write_text((tiny_llama_dir / name).read_text())
    hf_names = {gguf_name(k): k for k in mx.load(str(tiny_llama_dir / "model.safetensors"))}
    ref = {hf: mx.array(reference[g]) for g, hf in hf_names.items()}
    config = json.loads((tiny_llama_dir / "config.json").read_text())
    config["rope_traditional"] = True  # reference keeps GGUF's permuted Q/K rows
    (ref_dir / "config.json").write_text(json.dumps(config))
    mx.save_safetensors(str(ref_dir / "model.safetensors"), ref)
    got, want = logits(ckpt), logits(ref_dir)
    assert mx.abs(got - want).max().item() < 0.05 * mx.abs(want).max().item()


def test_cache_is_keyed_by_content_and_reused(tiny_llama_dir: Path, tmp_path: Path) -> None:
    path = write_float_gguf(tiny_llama_dir, tmp_path / "a.gguf")
    first = import_gguf(path, tmp_path / "cache")
    assert first == tmp_path / "cache" / "checkpoints" / f"{content_hash(path)}-v{IMPORTER_VERSION}"
    stamp = (first / "model.safetensors").stat().st_mtime_ns
    assert import_gguf(path, tmp_path / "cache") == first
    assert (first / "model.safetensors").stat().st_mtime_ns == stamp
    other = write_float_gguf(tiny_llama_dir, tmp_path / "b.gguf", dtype=mx.float16)
    assert import_gguf(other, tmp_path / "cache") != first
    leftovers = [p.name for p in (tmp_path / "cache" / "checkpoints").iterdir() if p.name.startswith(".")]
    assert leftovers == []


@pytest.fixture(scope="module")
def f32_gguf(tiny_llama_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_float_gguf(tiny_llama_dir, tmp_path_factory.mktemp("g") / "tiny.gguf")


def refused(path: Path, tmp_path: Path) -> str:
    with pytest.raises(ModelFormatError) as info:
        import_gguf(path, tmp_path / "cache")
    assert "\n" not in info.value.message
    assert not (tmp_path / "cache" / "checkpoints").exists() or not any(
        (tmp_path / "cache" / "checkpoints").iterdir())
    return info.value.message


def test_refuses_missing_not_gguf_and_truncated(f32_gguf: Path, tmp_path: Path) -> None:
    assert "GGUF file not found" in refused(tmp_path / "absent.gguf", tmp_path)
    bad = tmp_path / "bad.gguf"
    bad.write_text("definitely not a gguf")
    assert "not a GGUF file (bad magic)" in refused(bad, tmp_path)
    data = f32_gguf.read_bytes()
    short = tmp_path / "short.gguf"
    short.write_bytes(data[: len(data) - 1000])
    assert "truncated GGUF (tensor" in refused(short, tmp_path)
    short.write_bytes(data[:2000])
    assert "truncated GGUF (header ends early)" in refused(short, tmp_path)


def test_refuses_every_unsupported_tensor_type_by_name(f32_gguf: Path, tmp_path: Path) -> None:
    path = tmp_path / "k.gguf"
    path.write_bytes(f32_gguf.read_bytes())
    patch_tensor_type(path, "blk.0.attn_q.weight", 15)  # Q8_K: llama.cpp-internal, no dequantizer
    patch_tensor_type(path, "blk.1.attn_q.weight", 15)
    patch_tensor_type(path, "blk.0.attn_k.weight", 26)  # I32
    message = refused(path, tmp_path)
    assert "unsupported GGUF tensor types: I32 (1 tensors, e.g. blk.0.attn_k.weight); " \
        "Q8_K (2 tensors, e.g. blk.0.attn_q.weight)" in message
    assert "Q4_K" in message and "IQ4_XS" in message and "re-quantize" in message


@pytest.mark.parametrize(
    ("meta", "expected"),
    [
        ({"arch": "falcon"}, "unsupported GGUF architecture 'falcon'"),
        ({"tokenizer_model": "bert"}, "unsupported GGUF tokenizer tokenizer.ggml.model='bert'"),
        ({"pre": "martian"}, "unsupported GGUF pre-tokenizer tokenizer.ggml.pre='martian'"),
    ],
)
def test_refuses_unsupported_arch_and_tokenizer(tiny_llama_dir: Path, tmp_path: Path,
                                                meta: dict[str, str], expected: str) -> None:
    path = write_float_gguf(tiny_llama_dir, tmp_path / "x.gguf", **meta)
    message = refused(path, tmp_path)
    assert message.startswith(f"{path}: ") and expected in message


def test_rope_scaling_eot_yarn_and_rope_freqs(tiny_llama_dir: Path, tmp_path: Path) -> None:
    from gguf_helpers import gguf_metadata, gguf_tensors

    tensors, meta = gguf_tensors(tiny_llama_dir), gguf_metadata(tiny_llama_dir)
    meta.update({"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": mx.array(2.0),
                 "tokenizer.ggml.eot_token_id": mx.array(1, dtype=mx.uint32)})
    mx.save_gguf(str(tmp_path / "lin.gguf"), tensors, meta)
    config = json.loads((import_gguf(tmp_path / "lin.gguf", tmp_path / "c1") / "config.json").read_text())
    assert config["rope_scaling"] == {"type": "linear", "factor": 2.0}
    assert config["eos_token_id"] == [2, 1, 0]  # + <|endoftext|>: llama.cpp's end-of-generation set
    meta.update({"llama.rope.scaling.type": "yarn", "llama.rope.scaling.factor": mx.array(4.0),
                 "llama.rope.scaling.original_context_length": mx.array(512, dtype=mx.uint32)})
    mx.save_gguf(str(tmp_path / "yarn.gguf"), tensors, meta)
    config = json.loads((import_gguf(tmp_path / "yarn.gguf", tmp_path / "c2") / "config.json").read_text())
    assert config["rope_scaling"] == {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}
    meta["llama.rope.scaling.type"] = "ntk-by-parts"
    mx.save_gguf(str(tmp_path / "odd.gguf"), tensors, meta)
    assert "rope.scaling.type='ntk-by-parts'" in refused(tmp_path / "odd.gguf", tmp_path)
    del meta["llama.rope.scaling.type"]
    factors = mx.array([1.0, 1.0, 2.0, 8.0, 8.0, 8.0, 8.0, 8.0])
    mx.save_gguf(str(tmp_path / "l3.gguf"), {**tensors, "rope_freqs.weight": factors}, meta)
    config = json.loads((import_gguf(tmp_path / "l3.gguf", tmp_path / "c3") / "config.json").read_text())
    assert config["rope_scaling"]["type"] == "longrope"
    assert config["rope_scaling"]["long_factor"] == factors.tolist() == config["rope_scaling"]["short_factor"]


def test_vision_tensors_are_skipped(tiny_llama_dir: Path, tmp_path: Path, original: mx.array,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """Ollama's gemma3 blobs carry the vision tower beside the text model (v.*, mm.*)."""
    from gguf_helpers import gguf_metadata, gguf_tensors

    extra = {"v.blk.0.attn_q.weight": mx.zeros((32, 32)), "mm.input_projection.weight": mx.zeros((64, 32))}
    mx.save_gguf(str(tmp_path / "mm.gguf"), {**gguf_tensors(tiny_llama_dir), **extra},
                 gguf_metadata(tiny_llama_dir))
    with caplog.at_level("INFO", logger="frink_mlx.gguf"):
        ckpt = import_gguf(tmp_path / "mm.gguf", tmp_path / "cache")
    assert "ignoring 2 vision/projector tensors" in caplog.text
    assert mx.allclose(logits(ckpt), original, atol=1e-4).item()


def test_mistral_arch_is_accepted(tiny_llama_dir: Path, tmp_path: Path, original: mx.array) -> None:
    path = write_float_gguf(tiny_llama_dir, tmp_path / "m.gguf", arch="mistral")
    assert mx.allclose(logits(import_gguf(path, tmp_path / "cache")), original, atol=1e-4).item()


# --- the real default model -------------------------------------------------------------


def test_smollm2_checkpoint_config(smollm2_dir: Path) -> None:
    config = json.loads((smollm2_dir / "config.json").read_text())
    assert config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert config["num_key_value_heads"] == 3 and config["max_position_embeddings"] == 8192
    assert config["tie_word_embeddings"] is True and not config.get("rope_traditional")
    assert config["quantization"]["model.embed_tokens"]["bits"] == 8   # Q8_0
    assert config["quantization"]["model.layers.0.mlp.down_proj"]["bits"] == 4  # Q4_1
    tok_config = json.loads((smollm2_dir / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|im_end|>" and tok_config["bos_token"] == "<|im_start|>"
    assert "You are a helpful AI assistant named SmolLM" in tok_config["chat_template"]


PARITY_TEXTS = [
    "What is the capital of France? The capital of France is Paris.",
    "Hello,   world!\n\nHow's it going? I'm fine; they'll see, we've done it.",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    'for (let i = 0; i < 10; i++) { console.log(`${i}`); }  // JS',
    "Digits: 0 12 345 6789 3.14159 1,000,000 2026-11-29",
    "Emoji: 😀🎉👍🏽 🇫🇷 — naïve café, Straße, 東京, Привет",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n"
    "<|im_start|>assistant\n",
    "<|endoftext|>trailing\ttab and <file_sep> <repo_name>x",
]


def test_smollm2_tokenizer_matches_an_independent_reference_bpe(
        smollm2_gguf_path: Path, smollm2_dir: Path) -> None:
    from bpe_reference import ReferenceBPE
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    reference = ReferenceBPE.from_gguf(smollm2_gguf_path)
    ours = load_tokenizer(smollm2_dir)
    for text in PARITY_TEXTS:
        assert ours.encode(text, add_special_tokens=False) == reference.encode(text), text
        assert ours.decode(ours.encode(text)) == text


def test_content_hash_streams_the_whole_file(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"x" * (5 << 20))
    b.write_bytes(b"x" * ((5 << 20) - 1) + b"y")  # differs only in the last byte
    assert content_hash(a) != content_hash(b) and len(content_hash(a)) == 16
    os.utime(b, (0, 0))
    assert content_hash(b) == content_hash(b)


def test_import_logs_progress_and_time(tiny_llama_dir: Path, tmp_path: Path,
                                       caplog: pytest.LogCaptureFixture) -> None:
    from frink_mlx.models.gguf import ImportProgress

    reports: list[ImportProgress] = []
    path = write_float_gguf(tiny_llama_dir, tmp_path / "p.gguf")
    with caplog.at_level("INFO", logger="frink_mlx.gguf"):
        import_gguf(path, tmp_path / "cache", progress=reports.append)
    text = caplog.text
    assert "hashed p.gguf" in text and "importing p.gguf: llama, 20 tensors (F32)" in text
    assert "converting: 100%" in text and "imported p.gguf in " in text
    phases = [r.phase for r in reports]
    assert phases[0] == "hash" and phases[-1] == "convert"
    last = reports[-1]
    assert last.done_bytes == last.total_bytes > 0
    assert all(a.done_bytes <= b.done_bytes for a, b in itertools.pairwise(reports) if a.phase == b.phase)
