"""Structured output, the engine half: grammar specs -> per-row token masks.

core/structured.py turns a request into a `GrammarSpec`; this module compiles
it with llguidance against the model's tokenizer and hands the engine one
`GrammarConstraint` per row (the `RowConstraint` protocol of engine/types.py).

Why it is shaped this way:
1. Compiling is the expensive part (the tokenizer wrap ~1 s once per model; a
   grammar 1-1000 ms), so `GrammarCompiler` keeps one pristine matcher per
   distinct spec in a bounded LRU and gives every row a `deep_copy()` of it.
   Compiling blocks: the daemon calls `build_constraints` (a worker thread via
   anyio), never the event loop, and any grammar error surfaces there as
   `InvalidRequest` -- before a single response byte is sent.
   `engine/grammars.py` writes a spec as llguidance's grammar text.
2. Each row owns its matcher; the runner asks `allowed_mask()` before sampling
   and reports the sampled id with `accept()`. A dead end (no token allowed, or
   the matcher errors) only ever finishes that row, with `error` set.
3. llguidance computes an int32 bitmask over the *tokenizer's* vocabulary. The
   model's logits may be wider (padded embeddings) or, rarely, narrower, so the
   bool mask is padded with False / trimmed to the logits width:

       bitmask  [w0 w1 ... w(W-1)]      W = ceil(tokenizer_vocab / 32) int32 words
       unpack   bit j of word i -> token 32*i + j   (little-endian bit order)
       mask     [0 .. tokenizer_vocab) from the bits, [tokenizer_vocab .. vocab) False

4. A prompt that ends inside an open think block (`markup.prompt_opens_thinking`)
   leaves the row unconstrained (`allowed_mask() -> None`) until the model
   closes the block (`think_end` seen in the decoded output); the grammar
   then shapes the answer, never the reasoning.
5. `apply_constraints` masks a batch of logits: where the backend says so
   (`Backend.device_token_masks`: Metal) with llguidance's own kernel
   (`llguidance.mlx.apply_token_bitmask`, which raises "No Metal back-end"
   elsewhere), otherwise with numpy-unpacked masks and `mx.where`.
6. Speculation (engine/speculative/) verifies k drafted tokens in one step, so a
   row needs the masks of all 1 + k positions at once: `masks_along` walks the
   matcher over the draft and rolls it back (it ends where it started). It
   stops at the first draft token the grammar forbids; the masks after it
   repeat, harmlessly, since verification never accepts past a forbidden
   token. The matcher then advances (`accept`) over accepted tokens only.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import anyio
import numpy as np

from ..core.parsers import MarkupInfo
from ..core.request import GenRequest
from ..core.structured import GrammarSpec, grammar_for_request
from ..errors import InvalidRequest, UnsupportedField
from .grammars import MAX_ERROR_CHARS, describe, to_llguidance
from .types import RowConstraint


@dataclass(slots=True)
class CompiledGrammar:
    """A pristine matcher for one spec (never advanced; rows get deep copies)."""

    spec: GrammarSpec
    matcher: Any  # llguidance.LLMatcher
    compile_s: float


class GrammarConstraint:
    """One row's llguidance matcher behind the engine's `RowConstraint` protocol.

    Called only on the engine's MLX thread; not thread-safe by itself.
    """

    __slots__ = ("_matcher", "_vocab_size", "_tokenizer_vocab", "_bitmask", "_error",
                 "num_accepted", "_free_until", "_decode", "_tail")

    def __init__(self, matcher: Any, *, vocab_size: int, tokenizer_vocab: int,
                 free_until: str | None = None, decode: Callable[[int], str] | None = None) -> None:
        self._matcher = matcher
        self._vocab_size = vocab_size
        self._tokenizer_vocab = tokenizer_vocab
        self._bitmask = np.full((1, (tokenizer_vocab + 31) // 32), -1, dtype=np.int32)
        self._error: str | None = None
        self.num_accepted = 0
        if free_until and decode is None:
            raise ValueError("free_until needs a decode function")
        self._free_until = free_until or None   # rule 4: unconstrained until this text appears
        self._decode = decode
        self._tail = ""

    @property
    def in_free_prefix(self) -> bool:
        return self._free_until is not None

    @property
    def error(self) -> str | None:
        return self._error

    def bitmask(self) -> np.ndarray:
        """The next-token bitmask, int32 (ceil(tokenizer_vocab / 32),); all zero on a dead end."""
        from llguidance.numpy import fill_next_token_bitmask

        if self._error is None:
            fill_next_token_bitmask(self._matcher, self._bitmask, 0)
            if self._matcher.is_error():
                self._fail(self._matcher.get_error() or "the grammar matcher failed")
            elif not self._bitmask.any():
                self._fail("the grammar allows no further token (dead end)")
        if self._error is not None:
            self._bitmask.fill(0)
        return self._bitmask[0]

    def allowed_mask(self) -> np.ndarray | None:
        """A bool (vocab_size,) mask of the tokens the grammar allows next (None: free, rule 4)."""
        if self._free_until is not None:
            return None
        return unpack_bitmask(self.bitmask(), self._tokenizer_vocab, self._vocab_size)

    def masks_along(self, draft: Sequence[int]) -> list[np.ndarray | None]:
        """The allowed masks of a verify row's 1 + k positions (rule 6): position j's
        is the grammar's after draft[:j]."""
        masks: list[np.ndarray | None] = []
        free, tail, consumed = self._free_until, self._tail, 0
        for j in range(len(draft) + 1):
            mask = None if free is not None else self._peek_mask()
            masks.append(mask)
            if j == len(draft):
                break
            token = draft[j]
            if free is not None:  # rule 4's watch, on copies of its state
                assert self._decode is not None
                tail = (tail + self._decode(token))[-4 * len(free):]
                if free in tail:
                    free, tail = None, ""
                continue
            # a stopped matcher (its end-of-sequence consumed) may "consume" more
            # tokens without moving, which a rollback would then overcount
            if mask is None or not 0 <= token < mask.shape[0] or not mask[token] \
                    or self._matcher.is_stopped() or not self._matcher.consume_token(token):
                break
            consumed += 1
        if consumed:
            self._matcher.rollback(consumed)
        return masks + [masks[-1]] * (len(draft) + 1 - len(masks))

    def _peek_mask(self) -> np.ndarray:
        """The next-token mask now, without failing the row on a dead end."""
        from llguidance.numpy import fill_next_token_bitmask

        if self._error is None:
            words = np.zeros_like(self._bitmask)
            fill_next_token_bitmask(self._matcher, words, 0)
            if not self._matcher.is_error():
                return unpack_bitmask(words[0], self._tokenizer_vocab, self._vocab_size)
        return np.zeros(self._vocab_size, dtype=bool)

    def accept(self, token_id: int) -> bool:
        if self._error is not None:
            return False
        if self._free_until is not None:
            self._watch_free_prefix(token_id)
            return True
        if not 0 <= token_id < self._tokenizer_vocab:
            self._fail(f"token {token_id} is outside the tokenizer's vocabulary")
            return False
        if not self._matcher.consume_token(token_id):
            self._fail(self._matcher.get_error() or f"token {token_id} is not allowed by the grammar")
            return False
        self.num_accepted += 1
        return True

    def is_done(self) -> bool:
        """The grammar is complete and admits nothing but end-of-sequence."""
        return self._error is None and self._free_until is None \
            and bool(self._matcher.is_stopped()) and not self._matcher.is_error()

    def _watch_free_prefix(self, token_id: int) -> None:
        """Rule 4: keep a short text tail; the grammar starts once it ends the free prefix."""
        assert self._free_until is not None and self._decode is not None
        self._tail = (self._tail + self._decode(token_id))[-4 * len(self._free_until):]
        if self._free_until in self._tail:
            self._free_until = None
            self._tail = ""

    def _fail(self, why: str) -> None:
        self._error = f"Structured output failed: {why[:MAX_ERROR_CHARS]}"


def unpack_bitmask(words: np.ndarray, tokenizer_vocab: int, vocab_size: int) -> np.ndarray:
    """int32 bitmask words -> bool mask of width `vocab_size` (see rule 3)."""
    bits = np.unpackbits(words.view(np.uint8), bitorder="little")
    n = min(tokenizer_vocab, vocab_size)
    if n == vocab_size:
        return bits[:n].astype(bool)
    mask = np.zeros(vocab_size, dtype=bool)
    mask[:n] = bits[:n]
    return mask


class GrammarCompiler:
    """Compiles grammar specs for one tokenizer; a bounded LRU of compiled grammars.

    Thread-safe: any worker thread may call `compile` / `new_constraints`.
    """

    def __init__(self, hf_tokenizer: Any, *, vocab_size: int, eos_token_ids: Iterable[int] = (),
                 max_cached: int = 64) -> None:
        self._hf_tokenizer = hf_tokenizer
        self._eos_token_ids = sorted(set(eos_token_ids)) or None
        self.vocab_size = vocab_size
        self.max_cached = max_cached
        self._ll_tokenizer: Any = None
        self._cache: OrderedDict[tuple[object, ...], CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0

    @classmethod
    def for_tokenizer(cls, tokenizer: Any, *, vocab_size: int, max_cached: int = 64) -> GrammarCompiler:
        """From mlx-lm's TokenizerWrapper (or a bare HF fast tokenizer)."""
        hf = getattr(tokenizer, "_tokenizer", tokenizer)
        eos = set(getattr(tokenizer, "eos_token_ids", None) or ())
        if getattr(hf, "eos_token_id", None) is not None:
            eos.add(hf.eos_token_id)
        return cls(hf, vocab_size=vocab_size, eos_token_ids=eos, max_cached=max_cached)

    @property
    def ll_tokenizer(self) -> Any:
        """llguidance's view of the tokenizer, built on first use (~1 s for 50k tokens)."""
        with self._lock:
            if self._ll_tokenizer is None:
                from llguidance.hf import from_tokenizer

                try:
                    self._ll_tokenizer = from_tokenizer(self._hf_tokenizer,
                                                        eos_token=self._eos_token_ids)
                except Exception as exc:  # noqa: BLE001 - e.g. a slow (non-Rust) tokenizer
                    raise UnsupportedField(
                        "response_format",
                        f"cannot be enforced with this model's tokenizer ({exc})") from exc
            return self._ll_tokenizer

    @property
    def num_cached(self) -> int:
        return len(self._cache)

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar for `spec` (cached). Blocking; raises InvalidRequest."""
        with self._lock:
            hit = self._cache.get(spec.key)
            if hit is not None:
                self._cache.move_to_end(spec.key)
                return hit
        compiled = self._compile_uncached(spec)
        with self._lock:
            self._cache[spec.key] = compiled
            self._cache.move_to_end(spec.key)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
            self.num_compiled += 1
        return compiled

    def new_constraints(self, spec: GrammarSpec, n: int = 1, *,
                        free_until: str | None = None) -> list[GrammarConstraint]:
        """`n` fresh row constraints for `spec`. Blocking; raises InvalidRequest.

        `free_until`: leave rows unconstrained until this text is generated (rule 4).
        """
        compiled = self.compile(spec)
        tokenizer_vocab = int(self.ll_tokenizer.vocab_size)
        return [GrammarConstraint(compiled.matcher.deep_copy(), vocab_size=self.vocab_size,
                                  tokenizer_vocab=tokenizer_vocab, free_until=free_until,
                                  decode=self.decode_token) for _ in range(n)]

    def decode_token(self, token_id: int) -> str:
        """One token's text, special tokens included (for rule 4's watch)."""
        return str(self._hf_tokenizer.decode([token_id], skip_special_tokens=False))

    def _compile_uncached(self, spec: GrammarSpec) -> CompiledGrammar:
        import time

        import llguidance

        t0 = time.perf_counter()
        grammar = to_llguidance(spec)
        matcher = llguidance.LLMatcher(self.ll_tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise InvalidRequest(describe(spec, matcher.get_error()), param=spec.param)
        return CompiledGrammar(spec, matcher, time.perf_counter() - t0)


async def build_constraints(req: GenRequest, markup: MarkupInfo,
                            compiler: GrammarCompiler) -> list[RowConstraint] | None:
    """Per-row constraints for `req` (None = unconstrained), compiled off the event loop.

    Raises InvalidRequest (400) for a bad schema/grammar; call it before any
    response header is sent.
    """
    spec = grammar_for_request(req, markup)
    if spec is None:
        return None
    free_until = markup.think_end if markup.prompt_opens_thinking else None
    rows = await anyio.to_thread.run_sync(
        functools.partial(compiler.new_constraints, spec, max(1, req.n), free_until=free_until))
    return list(rows)


def apply_constraints(logits: Any, rows: Sequence[RowConstraint | None], *,
                      device_masks: bool = False) -> Any:
    """Mask a (batch, vocab) mx.array of logits row by row; None rows stay as they are.

    With `device_masks` (rule 5), GrammarConstraints go through llguidance's
    kernel; everything else through bool masks and `mx.where`. A row whose `allowed_mask()` is
    None is left unconstrained; a mask shorter than the logits forbids the rest.
    """
    import mlx.core as mx

    if all(r is None for r in rows):
        return logits
    if device_masks and all(isinstance(r, GrammarConstraint) or r is None for r in rows):
        from llguidance.mlx import apply_token_bitmask

        words = _stack_bitmasks(rows, logits.shape[-1])
        return apply_token_bitmask(logits, words)
    num_rows, vocab = logits.shape
    masks = np.ones((num_rows, vocab), dtype=bool)
    touched = False
    for i, row in enumerate(rows):
        allowed = row.allowed_mask() if row is not None else None
        if allowed is not None:
            n = min(vocab, allowed.shape[0])
            masks[i, :n] = allowed[:n]
            masks[i, n:] = False  # a short mask forbids the tokens it does not cover
            touched = True
    if not touched:
        return logits
    return mx.where(mx.array(masks), logits, mx.array(-float("inf"), dtype=logits.dtype))


def _stack_bitmasks(rows: Sequence[RowConstraint | None], vocab_size: int) -> np.ndarray:
    num_words = (vocab_size + 31) // 32
    words = np.full((len(rows), num_words), -1, dtype=np.int32)
    for i, row in enumerate(rows):
        if isinstance(row, GrammarConstraint) and not row.in_free_prefix:
            bits = row.bitmask()
            n = min(len(bits), num_words)
            words[i, :n] = bits[:n]
            words[i, n:] = 0  # past the tokenizer's vocab: never allowed
    return words
