"""Load an encoder-only checkpoint directory into an `Encoder`.

A checkpoint directory holds `config.json` (model_type bert / roberta /
xlm-roberta), `*.safetensors`, `tokenizer.json` and the sentence-transformers
files (`modules.json`, `<pooling>/config.json`, `sentence_bert_config.json`).
Every missing or unsupported piece is a `ModelFormatError` naming the file.

Rules:
1. The tokenizer is `tokenizers.Tokenizer` from `tokenizer.json`, with the
   file's own padding/truncation switched off: we pad in `Encoder.embed` and
   truncate only when a request asks (tokenizer.json for all-MiniLM-L6-v2
   says 128, while the reference implementation uses `max_seq_length` 256).
2. max_length = sentence_bert_config `max_seq_length`, capped by the
   positions the model has (RoBERTa loses pad_token_id + 1 of them); without
   that file, the position count.
3. Weights load strictly: a missing or misshapen tensor is refused.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

import mlx.core as mx

from ...backend import Backend
from ...config import EncoderConfig
from ...errors import ModelFormatError
from .bert import BertArgs, BertModel
from .encoder import Encoder
from .pooling import read_head_config, read_max_seq_length


class HFTokenizer:
    """`tokenizers.Tokenizer` behind the `TextTokenizer` protocol."""

    def __init__(self, tokenizer_file: Path) -> None:
        from tokenizers import Tokenizer

        try:
            self._tok = Tokenizer.from_file(str(tokenizer_file))
        except Exception as exc:  # noqa: BLE001 - tokenizers raises plain Exception
            raise ModelFormatError(f"{tokenizer_file}: unreadable ({exc})") from None
        self._tok.no_padding()
        self._tok.no_truncation()
        self._truncating: dict[int, Any] = {}

    @property
    def vocab_size(self) -> int:
        return int(self._tok.get_vocab_size(with_added_tokens=True))

    def encode_batch(
        self, texts: Sequence[str], *, add_special: bool, max_length: int | None
    ) -> list[list[int]]:
        tok = self._tok if max_length is None else self._truncating_copy(max_length)
        encodings = tok.encode_batch(list(texts), add_special_tokens=add_special)
        return [list(e.ids) for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=False))

    def id_to_piece(self, token_id: int) -> str:
        return self._tok.id_to_token(int(token_id)) or ""

    def _truncating_copy(self, max_length: int) -> Any:
        """A second Tokenizer that truncates keeping special tokens (cached per length)."""
        if max_length not in self._truncating:
            from tokenizers import Tokenizer

            copy = Tokenizer.from_str(self._tok.to_str())
            copy.enable_truncation(max_length)
            self._truncating[max_length] = copy
        return self._truncating[max_length]


def load_encoder(path: Path, spec: Any, config: EncoderConfig, backend: Backend) -> Encoder:
    """Build the Encoder for `spec` (a registry ModelSpec) from checkpoint dir `path`.

    Blocking (reads weights); call off the event loop.
    """
    path = Path(path)
    args = BertArgs.from_config(_read_config(path))
    model = BertModel(args)
    model.load_weights(list(_read_weights(path, model).items()), strict=True)
    model.eval()
    mx.eval(model.parameters())
    head = read_head_config(path)
    max_length = max_input_tokens(args, head.max_seq_length)
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelFormatError(f"{tokenizer_file}: missing (encoders need a fast tokenizer file)")
    return Encoder(
        name=str(getattr(spec, "name", path.name)),
        model=model,
        tokenizer=HFTokenizer(tokenizer_file),
        head=head,
        dim=args.hidden_size,
        max_length=max_length,
        batch_size=max(1, config.embed_batch_size),
        truncatable=bool(getattr(spec, "matryoshka", False)),
        arch=args.model_type,
        forward_scope=backend.prepare_encoder(model),
    )


def max_input_tokens(args: BertArgs, max_seq_length: int | None) -> int:
    """Rule 2: the sentence-transformers limit, capped by the model's positions."""
    positions = args.max_position_embeddings - args.position_offset
    return min(max_seq_length or positions, positions)


def encoder_limits(path: Path) -> tuple[int, int]:
    """(dim, max input tokens) of a checkpoint dir from its config files, no weights."""
    args = BertArgs.from_config(_read_config(path))
    return args.hidden_size, max_input_tokens(args, read_max_seq_length(path))


def _read_config(path: Path) -> dict[str, Any]:
    config_file = path / "config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelFormatError(f"{config_file}: missing") from None
    except (OSError, ValueError) as exc:
        raise ModelFormatError(f"{config_file}: unreadable ({exc})") from None
    if not isinstance(config, dict):
        raise ModelFormatError(f"{config_file}: expected an object")
    return config


def _read_weights(path: Path, model: BertModel) -> dict[str, mx.array]:
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelFormatError(f"{path}: no *.safetensors weights (convert pytorch_model.bin first)")
    weights: dict[str, mx.array] = {}
    for file in files:
        weights.update(mx.load(str(file)))  # type: ignore[arg-type]
    weights = model.sanitize(weights)
    if not weights:
        raise ModelFormatError(f"{path}: no BERT encoder tensors found in {files[0].name}")
    return weights
