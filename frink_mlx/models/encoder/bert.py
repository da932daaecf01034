"""A compact MLX BERT encoder (also RoBERTa / XLM-RoBERTa), for embeddings.

Why our own and not `mlx-embeddings` (evaluated first, 0.1.0):
1. It is not a good citizen for an always-on daemon: `mlx_embeddings.utils`
   imports `mlx_vlm` at module top, and `mlx-vlm` pulls in opencv, mlx-audio,
   datasets, fastapi, cryptography and `starlette>=1.0.1` (a pin on the web
   stack we serve with) -- hundreds of MB to run a 6-layer BERT.
2. Its BERT hard-codes mean pooling + L2 normalisation whatever the
   checkpoint's sentence-transformers config says; we must follow the config
   (`pooling.py`).
3. It loads through `huggingface_hub` / `transformers.AutoTokenizer`; we read a
   local directory with `tokenizers` only.
It does load all-MiniLM-L6-v2 and gives the same vectors at about the same
speed (same maths; benchmarks/embed_bench.py), so nothing is lost. The model
itself is ~150 lines, so owning it costs less
than the dependency.

Shapes: B rows, L tokens (right-padded), D = hidden_size, H heads, d = D / H.

    input_ids (B, L) -> word + position + token-type embeddings -> LayerNorm
      -> N x [ self-attention (additive mask over padded keys) -> Add&Norm
               -> Linear(D, 4D) -> act -> Linear(4D, D) -> Add&Norm ]
      -> token states (B, L, D)      (the pooler head is unused and not loaded)

Weight names mirror Hugging Face's `BertModel` so a checkpoint loads as-is
after stripping a `bert.` / `roberta.` prefix. RoBERTa differs only in its
positions: they start at `pad_token_id + 1`. Refused by name: `nomic_bert`
(rotary + SwiGLU; a different model file), relative position embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import mlx.core as mx
import mlx.nn as nn

from ...errors import ModelFormatError

SUPPORTED_TYPES = ("bert", "roberta", "xlm-roberta")

_ACTIVATIONS: dict[str, Callable[[mx.array], mx.array]] = {
    "gelu": nn.gelu,
    "gelu_new": nn.gelu_approx,
    "gelu_pytorch_tanh": nn.gelu_approx,
    "gelu_fast": nn.gelu_fast_approx,
    "relu": nn.relu,
    "silu": nn.silu,
    "swish": nn.silu,
}


@dataclass(frozen=True, slots=True)
class BertArgs:
    model_type: str
    vocab_size: int
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    intermediate_size: int
    max_position_embeddings: int
    type_vocab_size: int = 2
    layer_norm_eps: float = 1e-12
    hidden_act: str = "gelu"
    pad_token_id: int = 0

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "BertArgs":
        model_type = str(config.get("model_type", ""))
        if model_type not in SUPPORTED_TYPES:
            raise ModelFormatError(
                f"encoder model_type '{model_type}' is not supported "
                f"(supported: {', '.join(SUPPORTED_TYPES)})"
            )
        if config.get("position_embedding_type", "absolute") != "absolute":
            raise ModelFormatError(
                f"position_embedding_type '{config['position_embedding_type']}' is not supported"
            )
        if str(config.get("hidden_act", "gelu")) not in _ACTIVATIONS:
            raise ModelFormatError(f"hidden_act '{config['hidden_act']}' is not supported")
        fields = cls.__dataclass_fields__
        return cls(**{k: v for k, v in config.items() if k in fields and v is not None})

    @property
    def position_offset(self) -> int:
        """RoBERTa numbers real tokens from pad_token_id + 1; BERT from 0."""
        return self.pad_token_id + 1 if self.model_type != "bert" else 0


class BertEmbeddings(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.word_embeddings = nn.Embedding(args.vocab_size, args.hidden_size)
        self.position_embeddings = nn.Embedding(args.max_position_embeddings, args.hidden_size)
        self.token_type_embeddings = nn.Embedding(args.type_vocab_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)
        self.position_offset = args.position_offset

    def __call__(self, input_ids: mx.array) -> mx.array:
        length = input_ids.shape[1]
        positions = mx.arange(self.position_offset, self.position_offset + length)
        token_types = mx.zeros_like(input_ids)
        x = (
            self.word_embeddings(input_ids)
            + self.position_embeddings(positions)[None]
            + self.token_type_embeddings(token_types)
        )
        return self.LayerNorm(x)


class BertSelfAttention(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.num_heads = args.num_attention_heads
        self.head_dim = args.hidden_size // args.num_attention_heads
        self.scale = self.head_dim**-0.5
        self.query = nn.Linear(args.hidden_size, args.hidden_size)
        self.key = nn.Linear(args.hidden_size, args.hidden_size)
        self.value = nn.Linear(args.hidden_size, args.hidden_size)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        B, L, D = x.shape

        def heads(t: mx.array) -> mx.array:  # (B, L, D) -> (B, H, L, d)
            return t.reshape(B, L, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        out = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
        return out.transpose(0, 2, 1, 3).reshape(B, L, D)


class BertSelfOutput(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class BertAttention(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.self = BertSelfAttention(args)
        self.output = BertSelfOutput(args)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        return self.output(self.self(x, mask), x)


class BertIntermediate(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.dense = nn.Linear(args.hidden_size, args.intermediate_size)
        self.act = _ACTIVATIONS[args.hidden_act]

    def __call__(self, x: mx.array) -> mx.array:
        return self.act(self.dense(x))


class BertOutput(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.dense = nn.Linear(args.intermediate_size, args.hidden_size)
        self.LayerNorm = nn.LayerNorm(args.hidden_size, eps=args.layer_norm_eps)

    def __call__(self, x: mx.array, residual: mx.array) -> mx.array:
        return self.LayerNorm(self.dense(x) + residual)


class BertLayer(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.attention = BertAttention(args)
        self.intermediate = BertIntermediate(args)
        self.output = BertOutput(args)

    def __call__(self, x: mx.array, mask: mx.array) -> mx.array:
        attended = self.attention(x, mask)
        return self.output(self.intermediate(attended), attended)


class BertEncoder(nn.Module):
    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.layer = [BertLayer(args) for _ in range(args.num_hidden_layers)]


class BertModel(nn.Module):
    """input_ids (B, L) int32 + attention_mask (B, L) 0/1 -> token states (B, L, D)."""

    def __init__(self, args: BertArgs) -> None:
        super().__init__()
        self.args = args
        self.embeddings = BertEmbeddings(args)
        self.encoder = BertEncoder(args)

    def __call__(self, input_ids: mx.array, attention_mask: mx.array) -> mx.array:
        x = self.embeddings(input_ids)
        # Additive key mask (B, 1, 1, L): 0 for real tokens, a large negative for padding.
        # Every row has at least one real token, so no softmax row is all-masked.
        neg = mx.array(mx.finfo(x.dtype).min, x.dtype)
        mask = mx.where(attention_mask[:, None, None, :] > 0, mx.array(0, x.dtype), neg)
        for layer in self.encoder.layer:
            x = layer(x, mask)
        return x

    @staticmethod
    def sanitize(weights: dict[str, mx.array]) -> dict[str, mx.array]:
        """Strip `bert.`/`roberta.` prefixes; drop the pooler, position_ids and heads."""
        clean: dict[str, mx.array] = {}
        for name, value in weights.items():
            for prefix in ("bert.", "roberta.", "model."):
                if name.startswith(prefix):
                    name = name[len(prefix):]
            if name.startswith(("embeddings.", "encoder.")) and not name.endswith("position_ids"):
                clean[name] = value
        return clean
