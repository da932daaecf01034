"""Tokenizer parity for every pre-tokenizer family we import, on English, code, digits, CJK, emoji.

Byte-level BPE: for each family a vocabulary is trained here with the Hugging
Face `tokenizers` library, configured the way that family's real tokenizer.json
is (GPT-2; SmolLM's digit split; Llama-3's split regex with ignore_merges;
Qwen2's NFC + split regex; Mistral Nemo's tekken; GPT-4o/Phi-4). Its vocab and
merges are written into a GGUF with the `gguf` package, read back by our reader
and rebuilt by our tokenizer.py; the ids must equal both the HF tokenizer's and
those of `bpe_reference` (a naive Python port of llama.cpp's BPE using
llama.cpp's own regex lists, which share no code with ours).

SentencePiece (llama/mistral-v1/phi3 style with a space prefix, gemma style
without): compared with `sentencepiece` itself on a model trained here.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from bpe_reference import ReferenceBPE
from gguf_helpers import close_writer

from frink_mlx.models.gguf.reader import read_header
from frink_mlx.models.gguf.tensors import type_sizes
from frink_mlx.models.gguf.tokenizer import build_tokenizer_files

TEXTS = [
    "The quick brown fox jumps over the lazy dog. It's what we'd've DONE, isn't it?",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n\n\n",
    'for (let i = 0; i < 10; i++) { console.log(`${i}`); }  // JS\r\n',
    "Digits: 0 12 345 6789 3.14159 1,000,000 2026-11-29 and 12345678901234",
    "日本語のテキストと中文文本，한국어 텍스트。東京は晴れ。",
    "Emoji: 😀🎉👍🏽 🇫🇷 — naïve café, Straße, Привет мир",
    "MixedCASE camelCaseWords HTTPServer XMLHttpRequest iPhone  \t tabs\tand   spaces   ",
    "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
]
CORPUS = TEXTS[:-1] * 3 + [
    "Hello world, this is a small corpus for training a byte-level BPE vocabulary.",
    "import numpy as np\nx = np.zeros((4, 4), dtype=np.float32)\nprint(x.sum())",
    "The year 1999 and 2024; numbers like 42, 007 and 3.5e-10.",
    "中文分词测试，日本語の文章、한국어 문장입니다. 😀😀🎉",
    "CamelCase and snake_case and SCREAMING_CASE identifiers in code.",
]
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
# As in Llama-3's, Qwen2's, Mistral Nemo's and GPT-4o's tokenizer.json files:
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
TEKKEN = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?"
          r"[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
          r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CASE = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
GPT4O = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+" + CASE +
         r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*" + CASE +
         r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# llama.cpp's llama-vocab.cpp regex lists (its adaptations for std::regex), for bpe_reference
CPP_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
CPP_CASE = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
CPP_LLAMA3 = CPP_CASE + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                         r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CPP_QWEN2 = CPP_CASE + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
CPP_TEKKEN = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+|[^\r\n\p{L}\p{N}]?"
              r"((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*"
              r"|\s*[\r\n]+|\s+(?!\S)|\s+")
CPP_GPT4O = (r"[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))*((?=[\p{L}])([^A-Z]))+" + f"{CPP_CASE}?"
             r"|[^\r\n\p{L}\p{N}]?((?=[\p{L}])([^a-z]))+((?=[\p{L}])([^A-Z]))*" + f"{CPP_CASE}?"
             r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# tokenizer.ggml.pre -> (HF reference: split regexes or None for GPT-2's ByteLevel, digits first,
#                        NFC, ignore_merges; llama.cpp's regex list)
FAMILIES = {
    "gpt2": (None, False, False, False, [CPP_GPT2]),
    "smollm": (None, True, False, False, [r"\p{N}", CPP_GPT2]),
    "llama-bpe": (LLAMA3, False, False, True, [CPP_LLAMA3]),
    "qwen2": (QWEN2, False, True, False, [CPP_QWEN2]),
    "tekken": (TEKKEN, False, False, False, [CPP_TEKKEN]),
    "gpt-4o": (GPT4O, False, False, False, [CPP_GPT4O]),
}


def train_reference(pre: str):
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    split, digits, nfc, ignore_merges = FAMILIES[pre][:4]
    tok = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    steps = [pre_tokenizers.Digits(individual_digits=True)] if digits else []
    if split is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True))
    else:
        steps += [pre_tokenizers.Split(Regex(split), behavior="isolated"),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    if nfc:
        tok.normalizer = normalizers.NFC()
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer=trainer)
    return tok


def write_tokenizer_gguf(path: Path, tokens: list[str], merges: list[str], pre: str) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
    writer.add_bos_token_id(0)
    writer.add_eos_token_id(2)
    close_writer(writer)
    return path


@pytest.mark.parametrize("pre", sorted(FAMILIES))
def test_bpe_family_matches_hf_and_llama_cpp_references(pre: str, tmp_path: Path) -> None:
    from tokenizers import Tokenizer

    reference = train_reference(pre)
    model = json.loads(reference.to_str())["model"]
    tokens = sorted(model["vocab"], key=model["vocab"].__getitem__)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    path = write_tokenizer_gguf(tmp_path / "tok.gguf", tokens, merges, pre)
    tok_json, tok_config = build_tokenizer_files(read_header(path, type_sizes()).metadata)
    ours = Tokenizer.from_str(tok_json)
    naive = ReferenceBPE.from_gguf(path, splits=FAMILIES[pre][4], ignore_merges=FAMILIES[pre][3])
    assert tok_config["eos_token"] == "<|im_end|>"
    for text in TEXTS:
        got = ours.encode(text, add_special_tokens=False).ids
        assert got == reference.encode(text, add_special_tokens=False).ids, (pre, text)
        assert got == naive.encode(text), (pre, text)
        assert ours.decode(got, skip_special_tokens=False) == text


SPM_TEXTS = [t for t in TEXTS if "<|" not in t] + ["  leading spaces,   runs   of spaces, trailing  "]


@pytest.mark.parametrize("space_prefix", [True, False], ids=["llama-spm", "gemma-spm"])
def test_sentencepiece_matches_sentencepiece(space_prefix: bool, tmp_path: Path) -> None:
    """llama/mistral-v1/phi3 (a space prepended to each text run) and gemma (none)."""
    spm = pytest.importorskip("sentencepiece")
    import gguf
    from tokenizers import Tokenizer

    proto = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS * 4), model_writer=proto, vocab_size=500, model_type="bpe",
        byte_fallback=True, normalization_rule_name="identity", remove_extra_whitespaces=False,
        add_dummy_prefix=space_prefix, split_digits=True, unk_id=0, bos_id=1, eos_id=2, pad_id=-1,
        user_defined_symbols=["<start_of_turn>", "<end_of_turn>"], hard_vocab_limit=False,
        minloglevel=2)
    sp = spm.SentencePieceProcessor(model_proto=proto.getvalue())
    n = sp.get_piece_size()
    types = [2 if sp.is_unknown(i) else 3 if sp.is_control(i) else 6 if sp.is_byte(i)
             else 4 if sp.id_to_piece(i).startswith("<") and sp.id_to_piece(i).endswith("_turn>") else 1
             for i in range(n)]
    writer = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), arch="gemma3" if not space_prefix else "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list([sp.id_to_piece(i) for i in range(n)])
    writer.add_token_scores([sp.get_score(i) for i in range(n)])
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_space_prefix(space_prefix)
    close_writer(writer)
    meta = read_header(tmp_path / "spm.gguf", type_sizes()).metadata
    ours = Tokenizer.from_str(build_tokenizer_files(meta)[0])
    for text in SPM_TEXTS:
        want = sp.encode(text)
        assert ours.encode(text, add_special_tokens=False).ids == want, text
        assert ours.encode(text).ids == [1] + want  # add_bos_token defaults on for SentencePiece
        assert ours.decode(want) == text
    turn = sp.piece_to_id("<start_of_turn>")
    assert ours.encode("<start_of_turn>user", add_special_tokens=False).ids[0] == turn


def test_stop_tokens_and_bos_defaults_follow_llama_cpp() -> None:
    """A phi3-style vocabulary ends turns with <|end|> while its EOS is <|endoftext|>; the llama3
    family adds BOS when the metadata does not say."""
    from frink_mlx.models.gguf.arch import end_of_generation_ids

    tokens = ["<unk>", "<s>", "<|endoftext|>", "hello", "<|end|>", "<|user|>", "<end_of_turn>"]
    meta = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.eos_token_id": 2}
    assert end_of_generation_ids(meta) == [2, 4, 6]
    meta["tokenizer.ggml.eot_token_id"] = 4
    assert end_of_generation_ids(meta) == [2, 4, 6]
    bpe = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b"], "tokenizer.ggml.merges": [],
           "tokenizer.ggml.bos_token_id": 0}
    for pre, add_bos in (("llama-bpe", True), ("qwen2", False), ("gpt2", False)):
        assert build_tokenizer_files({**bpe, "tokenizer.ggml.pre": pre})[1]["add_bos_token"] is add_bos
