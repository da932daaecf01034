"""Rebuild a Hugging Face `tokenizer.json` from a GGUF's `tokenizer.ggml.*` metadata.

Why: mlx-lm (and every chat template) wants an HF tokenizer; a GGUF carries the
same vocabulary as flat arrays. We rebuild it with the `tokenizers` library so
the ids match what llama.cpp produces from the same file.

Rules (mirroring llama.cpp's `llama-vocab.cpp`):
1. `tokenizer.ggml.model = gpt2` is byte-level BPE: `tokens` are the vocab
   (id = index), `merges` are ranked pairs "a b" in order.
2. Token types: 3 (CONTROL) become special added tokens; 4 (USER_DEFINED) become
   non-special added tokens. Both are matched verbatim before BPE runs.
3. The byte-level pre-tokenizer is chosen by `tokenizer.ggml.pre` (PRE_TOKENIZERS,
   llama.cpp's families: its regexes applied in turn, each splitting the pieces
   the previous one left, gaps kept; then bytes -> GPT-2's printable alphabet).
   The llama3 family also takes a piece that is itself in the vocabulary as one
   token (`ignore_merges`, as llama.cpp and Llama-3's tokenizer.json do). Where
   llama.cpp rewrote a regex for std::regex (llama3, tekken, gpt-4o) we keep the
   original from the model's tokenizer.json, which `tokenizers` runs natively.
   An unknown name is refused rather than guessed.
4. `add_bos_token` prepends the BOS id through a post-processor (default when
   the key is absent, as in llama.cpp: on for SentencePiece and the llama3
   family, off for other byte-level BPEs).
5. `tokenizer.ggml.model = llama` is SentencePiece BPE: merges are derived from
   the piece scores, unknown bytes fall back to <0xXX> pieces, spaces become
   U+2581 with one prepended per text run (`add_space_prefix`); UNKNOWN (2) is
   special too.

Deliberately left out: WordPiece/Unigram vocabularies; refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ...errors import ModelFormatError

TOKEN_NORMAL, TOKEN_UNKNOWN, TOKEN_CONTROL, TOKEN_USER_DEFINED = 1, 2, 3, 4

GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
LLAMA3_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
QWEN2_REGEX = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral Nemo's "tekken" and GPT-4o's (Phi-4) split case runs; as in their tokenizer.json files
TEKKEN_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
GPT4O_REGEX = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", GPT2_REGEX, r"\p{N}+", r"[0-9][0-9][0-9]")


@dataclass(slots=True, frozen=True)
class PreTokenizer:
    """llama.cpp's pre-tokenizer for one `tokenizer.ggml.pre` family (rule 3)."""

    splits: tuple[str, ...]  # regexes applied in turn, each splitting the previous pieces
    ignore_merges: bool = False  # a piece already in the vocab is one token (llama3 family)


_GPT2 = PreTokenizer((GPT2_REGEX,))
_DIGITS = PreTokenizer((r"\p{N}", GPT2_REGEX))
_LLAMA3 = PreTokenizer((LLAMA3_REGEX,), ignore_merges=True)
_QWEN2 = PreTokenizer((QWEN2_REGEX,))
PRE_TOKENIZERS: dict[str, PreTokenizer] = {
    "default": PreTokenizer(DEFAULT_SPLITS),
    **dict.fromkeys(("gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion"), _GPT2),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva-7b"), _DIGITS),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"), _LLAMA3),
    **dict.fromkeys(("smaug-bpe", "dbrx"), PreTokenizer((LLAMA3_REGEX,))),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "hunyuan"), _QWEN2),
    "tekken": PreTokenizer((TEKKEN_REGEX,)),
    "gpt-4o": PreTokenizer((GPT4O_REGEX,)),
}


def _pre_tokenizer(pre: str) -> dict[str, Any]:
    if pre not in PRE_TOKENIZERS:
        raise ModelFormatError(
            f"unsupported GGUF pre-tokenizer tokenizer.ggml.pre={pre!r} "
            f"(supported: {', '.join(sorted(PRE_TOKENIZERS))})"
        )
    steps: list[dict[str, Any]] = [
        {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}
        for regex in PRE_TOKENIZERS[pre].splits]
    steps.append({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                  "use_regex": False})
    return {"type": "Sequence", "pretokenizers": steps}


def _post_processor(bos: str | None, bos_id: int | None) -> dict[str, Any]:
    if bos is None or bos_id is None:
        return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False,
                "use_regex": True}
    return {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                 {"SpecialToken": {"id": bos, "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }


def _int(meta: dict[str, Any], key: str) -> int | None:
    value = meta.get(key)
    return None if value is None else int(value.item() if hasattr(value, "item") else value)


def _bool(meta: dict[str, Any], key: str, default: bool) -> bool:
    value = meta.get(key)
    return default if value is None else bool(value.item() if hasattr(value, "item") else value)


def _added_tokens(tokens: list[str], types: list[int], *,
                  unknown_is_special: bool) -> list[dict[str, Any]]:
    """Rule 2: CONTROL (and SentencePiece's UNKNOWN) -> special added token,
    USER_DEFINED -> plain added token."""
    special = {TOKEN_CONTROL, TOKEN_UNKNOWN} if unknown_is_special else {TOKEN_CONTROL}
    return [
        {"id": i, "content": tok, "single_word": False, "lstrip": False, "rstrip": False,
         "normalized": False, "special": t in special}
        for i, (tok, t) in enumerate(zip(tokens, types))
        if t in special or t == TOKEN_USER_DEFINED
    ]


def _tokenizer_config(meta: dict[str, Any], tokens: list[str], added: list[dict[str, Any]],
                      add_bos_default: bool) -> dict[str, Any]:
    def name(key: str) -> str | None:
        i = _int(meta, "tokenizer.ggml." + key)
        return tokens[i] if i is not None and 0 <= i < len(tokens) else None

    unk = name("unknown_token_id")
    config: dict[str, Any] = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": name("bos_token_id"),
        "eos_token": name("eos_token_id"),
        "pad_token": name("padding_token_id"),
        "unk_token": unk if unk not in (name("bos_token_id"), name("eos_token_id")) else None,
        "add_bos_token": _bool(meta, "tokenizer.ggml.add_bos_token", add_bos_default),
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1 << 30,
        "added_tokens_decoder": {
            str(a["id"]): {k: a[k] for k in ("content", "lstrip", "normalized", "rstrip",
                                              "single_word", "special")}
            for a in added
        },
    }
    template = meta.get("tokenizer.chat_template")
    if template:
        config["chat_template"] = str(template)
    return config


def _byte_level_parts(meta: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    """tokenizer.ggml.model = gpt2: byte-level BPE with ranked merges (rules 1, 3)."""
    pre = str(meta.get("tokenizer.ggml.pre") or "default")
    return {
        "normalizer": None,
        "pre_tokenizer": _pre_tokenizer(pre),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True,
                    "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": PRE_TOKENIZERS[pre].ignore_merges,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": list(meta.get("tokenizer.ggml.merges") or []),
        },
    }


def spm_merges(tokens: list[str], scores: list[float]) -> list[list[str]]:
    """SentencePiece BPE has no merge list: a pair merges when the joined piece is in
    the vocab, higher-scored pieces first (transformers' SentencePieceExtractor)."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges: list[tuple[float, int, int, str, str]] = []
    for piece, score in zip(tokens, scores):
        for cut in range(1, len(piece)):
            left, right = piece[:cut], piece[cut:]
            if left in vocab and right in vocab:
                merges.append((-score, vocab[left], vocab[right], left, right))
    merges.sort()
    return [[left, right] for _, _, _, left, right in merges]


def _sentencepiece_parts(meta: dict[str, Any], tokens: list[str]) -> dict[str, Any]:
    """tokenizer.ggml.model = llama: SentencePiece BPE with byte fallback (rule 5).

    Like llama.cpp, a space is prepended to every text run that starts the input
    or follows a special token (`add_space_prefix`), and spaces become U+2581."""
    raw_scores = meta.get("tokenizer.ggml.scores")
    if raw_scores is None:
        raise ModelFormatError("GGUF SentencePiece tokenizer has no tokenizer.ggml.scores")
    unk_id = _int(meta, "tokenizer.ggml.unknown_token_id")
    steps: list[dict[str, Any]] = [{"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]
    decoders: list[dict[str, Any]] = [
        {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}]
    if _bool(meta, "tokenizer.ggml.add_space_prefix", True):  # gemma: off
        steps.insert(0, {"type": "Prepend", "prepend": "\u2581"})
        decoders.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {
        "normalizer": {"type": "Sequence", "normalizers": steps},
        "pre_tokenizer": None,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": None, "continuing_subword_prefix": None,
            "unk_token": tokens[unk_id] if unk_id is not None else None,
            "end_of_word_suffix": None, "fuse_unk": True, "byte_fallback": True,
            "ignore_merges": False,
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": spm_merges(tokens, [float(x) for x in raw_scores.tolist()]),
        },
    }


def build_tokenizer_files(meta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """Return (tokenizer.json text, tokenizer_config.json dict) from GGUF metadata."""
    model = meta.get("tokenizer.ggml.model")
    if model not in ("gpt2", "llama"):
        raise ModelFormatError(f"unsupported GGUF tokenizer tokenizer.ggml.model={model!r} "
                               "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece BPE)")
    tokens: list[str] = list(meta.get("tokenizer.ggml.tokens") or [])
    if not tokens:
        raise ModelFormatError("GGUF has no tokenizer.ggml.tokens")
    raw_types = meta.get("tokenizer.ggml.token_type")
    types = raw_types.tolist() if raw_types is not None else [TOKEN_NORMAL] * len(tokens)
    spm = model == "llama"
    added = _added_tokens(tokens, types, unknown_is_special=spm)
    pre = PRE_TOKENIZERS.get(str(meta.get("tokenizer.ggml.pre") or "default"))
    config = _tokenizer_config(meta, tokens, added, add_bos_default=spm or pre is _LLAMA3)
    parts = _sentencepiece_parts(meta, tokens) if spm else _byte_level_parts(meta, tokens)
    bos_id = _int(meta, "tokenizer.ggml.bos_token_id")
    post = _post_processor(config["bos_token"] if config["add_bos_token"] else None, bos_id)
    tokenizer = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
                 **parts, "post_processor": post}
    return json.dumps(tokenizer, ensure_ascii=False), config
