"""A generative model embedding itself: mean-pooled, normalised last hidden states.

Only built when a registry entry says `embeddings = "self"`; never a silent
fallback, because these vectors are not trained for similarity and a client
should not get them by accident. The recipe is fixed and stated
(`HeadConfig.for_hidden_states()`: mean over real tokens, then L2).

Padding needs no attention mask here: rows are right-padded and the model's
attention is causal, so a real token never sees a pad to its right; the pads'
own states are excluded by the pooling mask.

Works for mlx-lm models whose top module keeps the decoder stack (which ends
with the final norm) as `.model` -- llama, qwen, mistral, gemma, phi3, ...;
others are refused by name.
"""

from __future__ import annotations

from typing import Any, Sequence

import mlx.core as mx

from ...backend import Backend
from ...config import EncoderConfig
from ...errors import ModelFormatError
from .encoder import Encoder
from .pooling import HeadConfig


class LMTokenizer:
    """mlx-lm's TokenizerWrapper behind the `TextTokenizer` protocol."""

    def __init__(self, wrapper: Any) -> None:
        self._wrapper = wrapper

    @property
    def vocab_size(self) -> int:
        return int(len(self._wrapper.get_vocab()))

    def encode_batch(
        self, texts: Sequence[str], *, add_special: bool, max_length: int | None
    ) -> list[list[int]]:
        rows = [list(self._wrapper.encode(t, add_special_tokens=add_special)) for t in texts]
        return rows if max_length is None else [r[:max_length] for r in rows]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._wrapper.decode(list(ids)))

    def id_to_piece(self, token_id: int) -> str:
        return str(self._wrapper.convert_ids_to_tokens(int(token_id)))


def encoder_from_generative(loaded: Any, config: EncoderConfig, backend: Backend) -> Encoder:
    """Wrap a LoadedModel (kind generative) as an Encoder over its hidden states."""
    stack = getattr(loaded.model, "model", None)
    if stack is None or not callable(stack):
        raise ModelFormatError(
            f"model '{loaded.spec.name}' ({loaded.config.get('model_type')}) does not expose "
            "its hidden states; it cannot serve embeddings = \"self\""
        )
    dim = int(loaded.config.get("hidden_size") or loaded.config.get("text_config", {}).get("hidden_size", 0))
    if dim <= 0:
        raise ModelFormatError(f"model '{loaded.spec.name}': config.json has no hidden_size")

    def forward(ids: mx.array, mask: mx.array) -> mx.array:
        del mask  # causal attention + right padding: see module docstring
        return stack(ids)

    return Encoder(
        name=str(loaded.spec.name),
        model=forward,
        tokenizer=LMTokenizer(loaded.tokenizer),
        head=HeadConfig.for_hidden_states(),
        dim=dim,
        max_length=int(loaded.context_length),
        batch_size=max(1, config.embed_batch_size),
        arch=str(loaded.config.get("model_type", "generative")),
        forward_scope=backend.prepare_encoder(loaded.model),
    )
