"""What identifies a loaded model's weights, as a short stable digest.

Why: KV blocks kept on disk (engine/kv/disk.py) outlive the process and the
generation that computed them, so their namespace cannot be a generation
number or a registry name: two entries may name the same weights, one name
may point at new weights after an edit of models.toml, a GGUF may be imported
again, the CPU backend dequantizes where Metal does not. What the K/V of a
prompt depends on is the weights *as loaded* and the model's configuration;
this digest is made of exactly those.

Rules:
1. Every parameter contributes its name, shape and dtype, and the bytes of
   SAMPLES_PER_TENSOR elements spread evenly over it (all of them when it is
   smaller). Reading every byte of a 30 GB model at each load would cost
   seconds; a fine-tune, a merge, a re-quantization or a different
   dequantization changes the sampled elements of every tensor it touches.
2. The model's `args` (rope settings, norms, head counts: what changes the
   K/V without changing a weight) join the digest as their sorted repr.
3. Stable across processes and machines: blake2b over a canonical encoding,
   personalised like hashing.py's, no Python `hash()`.

It evaluates a few small gathers: call it on a thread allowed to drive MLX.
"""

from __future__ import annotations

import hashlib
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten

SAMPLES_PER_TENSOR = 1024
_PERSON = b"frink-weights-1"


def weights_digest(model: Any) -> str:
    """Rules 1-3: 32 hex digits naming `model`'s weights as loaded and its config."""
    digest = hashlib.blake2b(digest_size=16, person=_PERSON)
    params: list[tuple[str, mx.array]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    samples: list[mx.array] = []
    for name, value in params:
        digest.update(f"{name}|{tuple(value.shape)}|{value.dtype};".encode())
        flat = value.reshape(-1)
        if flat.size > SAMPLES_PER_TENSOR:
            picks = np.linspace(0, flat.size - 1, SAMPLES_PER_TENSOR).astype(np.uint32)
            flat = mx.take(flat, mx.array(picks))
        samples.append(mx.view(flat, mx.uint8))
    mx.eval(samples)
    for sample in samples:
        digest.update(np.asarray(sample).tobytes())
    args = getattr(model, "args", None)
    fields = vars(args) if args is not None and hasattr(args, "__dict__") else {}
    digest.update(repr(sorted((k, repr(v)) for k, v in fields.items())).encode())
    return digest.hexdigest()
