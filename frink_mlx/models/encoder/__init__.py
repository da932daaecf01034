"""Embedding models: encoder-only checkpoints (BERT family) and, on explicit
request, a generative model pooling its own hidden states.

    load_encoder(path, spec, config, backend) -> Encoder   (encoder-only checkpoint dir)
    encoder_from_generative(loaded, config, backend) -> Encoder   (registry `embeddings = "self"`)

See encoder.py for the batching contract, pooling.py for how the
sentence-transformers config is followed, bert.py for why this is our own model.
"""

from __future__ import annotations

from .causal import encoder_from_generative
from .encoder import Encoder, shrink
from .load import load_encoder
from .pooling import HeadConfig

__all__ = ["Encoder", "HeadConfig", "load_encoder", "shrink", "encoder_from_generative"]
