"""A deliberately naive reference for llama.cpp's byte-level BPE, for parity tests.

It shares no code with frink_mlx: the vocabulary is read with the `gguf`
package (llama.cpp's Python reader), not `mx.load`, and tokenization follows
llama.cpp's `llama-vocab.cpp` steps literally:

1. Split the text on special tokens (CONTROL / USER_DEFINED types), longest first.
2. Each regex of the pre-tokenizer's list (llama.cpp's `regex_exprs`; default for
   "smollm" and kin: `\\p{N}` then GPT-2's) splits every piece the previous one
   left, keeping the gaps between matches as pieces (`unicode_regex_split`).
3. With `ignore_merges` (llama.cpp's llama3 family) a piece that is in the vocab
   is one token.
4. Each piece's UTF-8 bytes map to GPT-2's printable byte alphabet.
5. BPE: repeatedly merge the adjacent pair with the lowest merge rank.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path

import regex

GPT2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)")
DIGIT_PRE = {"smollm", "starcoder", "refact", "codeshell"}


def bytes_to_unicode() -> dict[int, str]:
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    n = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(keep, chars)}


def split_keep(pattern: regex.Pattern[str], text: str) -> list[str]:
    """llama.cpp's unicode_regex_split: matches and the gaps between them, in order."""
    pieces, pos = [], 0
    for m in pattern.finditer(text):
        if m.start() > pos:
            pieces.append(text[pos:m.start()])
        pieces.append(m.group())
        pos = m.end()
    if pos < len(text):
        pieces.append(text[pos:])
    return [p for p in pieces if p]


@dataclass
class ReferenceBPE:
    vocab: dict[str, int]
    ranks: dict[tuple[str, str], int]
    specials: list[str]
    splits: list[regex.Pattern[str]]
    ignore_merges: bool = False

    @classmethod
    def from_gguf(cls, path: Path, splits: list[str] | None = None,
                  ignore_merges: bool = False) -> ReferenceBPE:
        """`splits`: llama.cpp's regex list; None = by `tokenizer.ggml.pre` (gpt2 / digits)."""
        import gguf  # type: ignore[import-untyped]

        reader = gguf.GGUFReader(str(path))

        def strings(key: str) -> list[str]:
            field = reader.fields[key]
            return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

        tokens = strings("tokenizer.ggml.tokens")
        merges = strings("tokenizer.ggml.merges")
        types_field = reader.fields["tokenizer.ggml.token_type"]
        types = [int(types_field.parts[i][0]) for i in types_field.data]
        pre_field = reader.fields["tokenizer.ggml.pre"]
        pre = bytes(pre_field.parts[pre_field.data[0]]).decode()
        specials = sorted((t for t, k in zip(tokens, types) if k in (3, 4)), key=len, reverse=True)
        if splits is None:
            splits = [r"\p{N}", GPT2.pattern] if pre in DIGIT_PRE else [GPT2.pattern]
        return cls(vocab={t: i for i, t in enumerate(tokens)},
                   ranks={tuple(m.split(" ", 1)): r for r, m in enumerate(merges)},  # type: ignore[misc]
                   specials=specials, splits=[regex.compile(p) for p in splits],
                   ignore_merges=ignore_merges)

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        special_re = regex.compile("(" + "|".join(regex.escape(s) for s in self.specials) + ")")
        for chunk in special_re.split(text):
            if not chunk:
                continue
            if chunk in self.vocab and chunk in self.specials:
                ids.append(self.vocab[chunk])
                continue
            pieces = [chunk]
            for pattern in self.splits:
                pieces = [p for piece in pieces for p in split_keep(pattern, piece)]
            for word in pieces:
                ids.extend(self.vocab[t] for t in self.bpe(word))
        return ids

    def bpe(self, word: str) -> list[str]:
        table = bytes_to_unicode()
        mapped = "".join(table[b] for b in word.encode("utf-8"))
        if self.ignore_merges and mapped in self.vocab:
            return [mapped]
        parts = list(mapped)
        while len(parts) > 1:
            pairs = [(self.ranks.get(pair, 1 << 60), i) for i, pair in enumerate(itertools.pairwise(parts))]
            rank, i = min(pairs)
            if rank == 1 << 60:
                break
            parts = parts[:i] + [parts[i] + parts[i + 1]] + parts[i + 2:]
        return parts
