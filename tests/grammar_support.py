"""Grammar checks and a steerable tiny model for the custom-tool grammar tests.

`matches` / `is_prefix` judge a text against a client's raw grammar with
llguidance's own matcher over the tiny tokenizer (any tokenization of a text
is accepted), independently of frink-mlx's JSON-quoting rewrite.

`make_bigram_llama` writes a tiny llama whose next-token scores depend only on
the current token (attention and MLP outputs zeroed, one embedding direction
per steered token, a hand-set untied LM head). A random-weight model under
Codex's apply_patch grammar writes one endless file name; this one, greedy,
finishes a patch in a few dozen tokens, so a whole call can be checked.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

CODEX_GRAMMAR = (Path(__file__).parent / "data" / "codex_apply_patch.lark").read_text()


@functools.cache
def ll_tokenizer() -> Any:
    from conftest import build_tiny_tokenizer_json
    from llguidance.hf import from_tokenizer
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(build_tiny_tokenizer_json()))
    return from_tokenizer(hf)


@functools.lru_cache(maxsize=64)
def _compiled(grammar: str, syntax: str) -> Any:
    from llguidance import LLMatcher

    text = LLMatcher.grammar_from_lark(grammar) if syntax == "lark" \
        else LLMatcher.grammar_from_regex(grammar)
    matcher = LLMatcher(ll_tokenizer(), text, log_level=0)
    assert not matcher.is_error(), matcher.get_error()
    return matcher


def _matcher(grammar: str, syntax: str) -> Any:
    return _compiled(grammar, syntax).deep_copy()


def is_prefix(grammar: str, text: str, syntax: str = "lark") -> bool:
    """`text` can still be continued into a string of the grammar."""
    matcher = _matcher(grammar, syntax)
    return bool(matcher.consume_tokens(ll_tokenizer().tokenize_str(text))) \
        and not matcher.is_error()


def matches(grammar: str, text: str, syntax: str = "lark") -> bool:
    """`text` is a whole string of the grammar."""
    matcher = _matcher(grammar, syntax)
    return bool(matcher.consume_tokens(ll_tokenizer().tokenize_str(text))) \
        and not matcher.is_error() and bool(matcher.is_accepting())


def make_bigram_llama(path: Path, after: dict[str, list[str]], default: list[str]) -> Path:
    """A tiny llama that, greedy, picks by the current token: `after[c]` ranks the next
    characters after the single-character token `c` (best first), `default` after
    any other token. Unranked tokens score 0 (ties go to the lowest id)."""
    import mlx.core as mx
    from conftest import make_tiny_llama

    path = make_tiny_llama(path, tie_word_embeddings=False)
    vocab = json.loads((path / "tokenizer.json").read_text())["model"]["vocab"]
    chars = {*after, *default, *(c for ranked in after.values() for c in ranked)}
    ids = {c: vocab[{" ": "\u0120"}.get(c, c)] for c in chars}   # byte-level BPE's space
    weights = dict(mx.load(str(path / "model.safetensors")))
    num_tokens, hidden = weights["model.embed_tokens.weight"].shape
    embed = mx.zeros((num_tokens, hidden))
    embed[:, 0] = 1.0   # every token: the direction that carries `default`
    head = mx.zeros((num_tokens, hidden))
    for score, c in enumerate(reversed(default), start=1):
        head[ids[c], 0] = float(score)
    for k, (prev, ranked) in enumerate(after.items(), start=1):
        embed[ids[prev], k] = 1.0
        for score, c in enumerate(reversed(ranked), start=10):
            head[ids[c], k] = float(score)
    weights["model.embed_tokens.weight"], weights["lm_head.weight"] = embed, head
    for name in list(weights):
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = mx.zeros(weights[name].shape)
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path
