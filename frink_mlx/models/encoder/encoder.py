"""Encoder: token ids -> sentence vectors, as padded MLX batches.

One `Encoder` serves /v1/embeddings for one model: an encoder-only checkpoint
(BERT family, `bert.py`) or, when a registry entry asks for it explicitly, a
generative model pooling its own last hidden states (`causal.py`). Both give
the same surface: `tokenize`, `detokenize`, `check_lengths`, `embed`, `dim`,
`max_length`.

Batching (`embed`), stated before the loop:
1. Order the inputs by token count, longest first, so each batch pads little.
2. Cut that order into batches of at most `batch_size` rows
   (settings.embed_batch_size), and also where the next row is shorter
   than `MIN_FILL` of the batch's longest: on the CPU backend a batch of
   ~80-token rows is already compute-bound, so more, tighter batches cost
   nothing while padding costs its full share
   (benchmarks/results/design-notes.md, "Encoder batches").
3. Per batch: right-pad to the batch's longest row with a 0/1 mask,

        row 0: [CLS] a  b  c  [SEP]          mask 1 1 1 1 1
        row 1: [CLS] d  [SEP] pad  pad       mask 1 1 1 0 0

   run the model once, pool by the checkpoint's recipe (`pooling.py`),
   evaluate, and scatter the vectors back to their input positions.
4. The caller's `lock` factory (the DecodeGate's `exclusive`) is entered per
   batch only, so a long embedding request interleaves with generation steps.

`embed` blocks; callers run it off the event loop. Token-id inputs are used
verbatim (no special tokens added): a client that wants `[CLS] ... [SEP]`
sends what `tokenize` with special tokens returned.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Callable, Protocol, Sequence

import mlx.core as mx
import numpy as np

from ...backend import ForwardScope, no_scope
from ...errors import InvalidRequest
from .pooling import HeadConfig, pool

Forward = Callable[[mx.array, mx.array], mx.array]  # (ids (B,L), mask (B,L)) -> states (B,L,D)


class TextTokenizer(Protocol):
    """What an Encoder needs from a tokenizer (HF `tokenizers` or mlx-lm's)."""

    def encode_batch(
        self, texts: Sequence[str], *, add_special: bool, max_length: int | None
    ) -> list[list[int]]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def id_to_piece(self, token_id: int) -> str: ...

    @property
    def vocab_size(self) -> int: ...


@dataclass(slots=True)
class Encoder:
    """A loaded embedding model. Thread-compatible: serialise `embed` via `lock`."""

    name: str
    model: Forward
    tokenizer: TextTokenizer
    head: HeadConfig
    dim: int
    max_length: int
    batch_size: int
    truncatable: bool = False  # Matryoshka-trained: `dimensions` may cut vectors
    arch: str = "bert"
    forward_scope: ForwardScope = no_scope  # the backend's prepare_encoder (backend/base.py)

    # --- tokens -------------------------------------------------------------
    def tokenize(self, texts: Sequence[str], *, truncate: bool = False) -> list[list[int]]:
        """Texts -> ids with special tokens; `truncate` cuts to max_length keeping them."""
        limit = self.max_length if truncate else None
        return self.tokenizer.encode_batch(texts, add_special=True, max_length=limit)

    def tokenize_plain(self, text: str, *, add_special: bool) -> list[int]:
        return self.tokenizer.encode_batch([text], add_special=add_special, max_length=None)[0]

    def detokenize(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))

    def token_pieces(self, ids: Sequence[int]) -> list[str]:
        return [self.tokenizer.id_to_piece(i) for i in ids]

    def check_lengths(
        self, token_lists: Sequence[Sequence[int]], *, truncate: bool = False
    ) -> list[list[int]]:
        """Refuse (or, when asked, cut) inputs the model cannot take; name the index."""
        checked: list[list[int]] = []
        vocab = self.tokenizer.vocab_size
        for index, ids in enumerate(token_lists):
            if len(ids) == 0:
                raise InvalidRequest(f"input[{index}] is empty.", param=f"input[{index}]")
            if len(ids) > self.max_length:
                if not truncate:
                    raise InvalidRequest(
                        f"input[{index}] has {len(ids)} tokens but the encoder '{self.name}' "
                        f"accepts at most {self.max_length}; shorten it or send "
                        '"truncate": true to cut it.',
                        param=f"input[{index}]",
                        code="context_length_exceeded",
                    )
                ids = ids[: self.max_length]
            bad = next((t for t in ids if not 0 <= int(t) < vocab), None)
            if bad is not None:
                raise InvalidRequest(
                    f"input[{index}] holds token id {bad}, outside this model's vocabulary "
                    f"of {vocab}.",
                    param=f"input[{index}]",
                )
            checked.append([int(t) for t in ids])
        return checked

    # --- vectors ------------------------------------------------------------
    def embed(
        self,
        token_lists: Sequence[Sequence[int]],
        *,
        lock: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> np.ndarray:
        """Checked token lists -> float32 (N, dim) vectors in input order. Blocking."""
        num_inputs = len(token_lists)
        out = np.zeros((num_inputs, self.dim), dtype=np.float32)
        order = sorted(range(num_inputs), key=lambda i: len(token_lists[i]), reverse=True)
        for rows in _batches(order, [len(t) for t in token_lists], self.batch_size):
            ids, mask = _pad([token_lists[i] for i in rows])
            with lock() if lock is not None else contextlib.nullcontext():
                vectors = self._run_batch(ids, mask)
            out[rows] = vectors
        return out

    def _run_batch(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        ids_mx, mask_mx = mx.array(ids), mx.array(mask)
        with self.forward_scope():
            vectors = pool(self.model(ids_mx, mask_mx), mask_mx, self.head)
        mx.eval(vectors)
        return np.array(vectors, dtype=np.float32)


MIN_FILL = 0.75


def _batches(order: list[int], lengths: list[int], batch_size: int) -> list[list[int]]:
    """Rule 2: cut the longest-first `order` at `batch_size` rows or under MIN_FILL."""
    batches: list[list[int]] = []
    for i in order:
        current = batches[-1] if batches else None
        if (current is None or len(current) >= batch_size
                or lengths[i] < MIN_FILL * lengths[current[0]]):
            batches.append([i])
        else:
            current.append(i)
    return batches


def _pad(rows: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Right-pad rows with id 0 -> ids (B, L) int32, mask (B, L) int32."""
    width = max(len(r) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    mask = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = row
        mask[i, : len(row)] = 1
    return ids, mask


def shrink(vectors: np.ndarray, dimensions: int, *, normalize: bool) -> np.ndarray:
    """Matryoshka truncation: keep the first `dimensions`, re-normalise if the model does."""
    cut = np.ascontiguousarray(vectors[:, :dimensions])
    if normalize:
        norms = np.linalg.norm(cut, axis=1, keepdims=True)
        cut = cut / np.maximum(norms, 1e-12)
    return cut.astype(np.float32, copy=False)
