"""A draft model for speculative decoding, loaded beside its target (registry rule 10).

Why a check at load: the draft's tokens are fed to the target as token ids
(engine/speculative/ rule 7). Two tokenizers that disagree on one id would make
every draft of that token wrong at best, and a draft id past the target's
vocabulary would index outside its embedding, so a pair whose vocabularies
differ (size, or any token's id) is refused when the generation loads, with
both names in the message, before anything is served.
"""

from __future__ import annotations

from typing import Any

from ..backend import Backend
from ..config import LoadConfig
from ..errors import ModelFormatError
from ..registry import ModelSpec
from .loader import LoadedModel, load_model


def load_draft(target: LoadedModel, spec: ModelSpec, config: LoadConfig,
               backend: Backend) -> LoadedModel:
    """Load `spec` as `target`'s draft model; ModelFormatError if their tokenizers differ."""
    draft = load_model(spec, config, backend)
    if draft.kind != "generative":
        raise ModelFormatError(f"draft model {spec.name!r} for {target.spec.name!r} "
                               "is not a generative model")
    check_same_tokenizer(target, draft)
    return draft


def check_same_tokenizer(target: LoadedModel, draft: LoadedModel) -> None:
    """The two vocabularies are the same size and map every token to the same id."""
    names = f"draft model {draft.spec.name!r} and its target {target.spec.name!r}"
    mine, theirs = _vocab(target.tokenizer), _vocab(draft.tokenizer)
    if len(mine) != len(theirs):
        raise ModelFormatError(f"{names} have different vocabularies "
                               f"({len(theirs)} tokens vs {len(mine)}); a draft model must "
                               "share its target's tokenizer")
    differ = [token for token, index in theirs.items() if mine.get(token) != index]
    if differ:
        raise ModelFormatError(f"{names} map {len(differ)} tokens to different ids "
                               f"(e.g. {differ[0]!r}); a draft model must share its "
                               "target's tokenizer")


def _vocab(tokenizer: Any) -> dict[str, int]:
    inner = getattr(tokenizer, "_tokenizer", tokenizer)
    vocab: dict[str, int] = inner.get_vocab()
    return vocab
