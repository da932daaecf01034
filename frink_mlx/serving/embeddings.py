"""Serving embeddings from the hub: which encoder answers, and running it off the loop.

An embedding request is answered by the `embedder` of one leased generation:

    active generation          its embedder
    ------------------------   ---------------------------------------------
    kind = "encoder"           the encoder itself (served as the active model)
    generative, embeddings=E   encoder entry E, loaded next to it (side-car)
    generative, "self"         its own hidden states, mean-pooled (opt-in)
    generative, no embeddings  none: refused by name, never a silent fallback

Rules:
1. Resolution never swaps the chat model out for an embedding it already
   serves: a request naming the active model, `default`, or the side-car
   encoder's name or alias leases the active generation.
2. Any other encoder entry leases through the hub as usual (a just-in-time
   swap makes it the active model). A generative entry without embeddings is
   refused before any swap.
3. The embedder is attached while the hub loads the generation
   (generation.py rule 1), so a side-car that cannot load fails that load by
   name and never a later embedding request.
4. Work runs in a worker thread; each padded batch holds the DecodeGate
   (`exclusive()`: MLX is driven by one thread at a time).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Callable, Sequence

import anyio
import numpy as np

from ..errors import FrinkError, InvalidRequest, ModelNotFound, UnsupportedField
from ..models.encoder.encoder import Encoder, shrink
from ..models.encoder.load import encoder_limits
from ..models.vision import vision_family
from ..registry import ModelSpec, Registry, resolve_source
from .generation import SELF, Gate, Generation
from .hub import Hub


@dataclass(frozen=True, slots=True)
class EmbedResult:
    model: str           # the encoder that made the vectors (honest, even via an alias)
    vectors: np.ndarray  # (N, dim) float32, input order
    num_tokens: int      # tokens actually embedded (after any requested truncation)


# --- resolution (rules 1-2) ---------------------------------------------------------
def serves(gen: Generation, name: str | None, registry: Registry) -> bool:
    """Does the active generation answer embedding requests for `name`?"""
    if getattr(gen, "embedder", None) is None:
        return False
    if gen.answers_to(name):
        return True
    sidecar = gen.spec.embeddings
    if not sidecar or sidecar == SELF:
        return False
    try:
        return bool(registry.resolve(name).name == sidecar)
    except ModelNotFound:
        return False


def no_embedder(name: str) -> InvalidRequest:
    return InvalidRequest(
        f"The model '{name}' does not serve embeddings: give its models.toml entry "
        '`embeddings = "<encoder entry>"` (or "self" to pool its own hidden states), '
        "or request an encoder model.",
        param="model", code="model_not_embedding")


async def embed(
    hub: Hub, registry: Registry, name: str | None, inputs: Sequence[str] | Sequence[Sequence[int]],
    *, truncate: bool = False, dimensions: int | None = None,
) -> EmbedResult:
    """Lease the generation serving `name`, embed `inputs` in a worker thread."""
    name = registry.route(name)  # registry rule 8: unknown names -> "default"
    resident = next((g for g in reversed(hub.resident) if serves(g, name, registry)), None)
    if resident is not None:  # a resident side-car or encoder: no load (hub rule 1)
        lease = await hub.acquire(resident.spec.name)  # no await before the lease: no race
    else:
        spec = registry.resolve(name)
        if spec.kind != "encoder" and not spec.embeddings:
            raise no_embedder(spec.name)
        lease = await hub.acquire(name)
    try:
        encoder = lease.generation.embedder
        if encoder is None:
            raise no_embedder(lease.generation.spec.name)
        check_dimensions(encoder, dimensions)
        work = partial(embed_blocking, encoder, inputs, truncate=truncate,
                       dimensions=dimensions, lock=gate_lock(hub.gate))
        return await anyio.to_thread.run_sync(work)
    finally:
        lease.release()


def gate_lock(gate: Gate) -> Callable[[], Any]:
    """The DecodeGate's `exclusive()` (rule 4), or the gate itself if it is a plain lock."""
    exclusive = getattr(gate, "exclusive", None)
    return exclusive if callable(exclusive) else (lambda: gate)


# --- the work (blocking) ------------------------------------------------------------
def check_dimensions(encoder: Encoder, dimensions: int | None) -> None:
    if dimensions is None or dimensions == encoder.dim:
        return
    if not encoder.truncatable:
        raise UnsupportedField(
            "dimensions",
            f"is not supported by '{encoder.name}': its embeddings are {encoder.dim}-wide and "
            "it was not trained to be shortened (omit it, or send the full width)")
    if not 1 <= dimensions <= encoder.dim:
        raise InvalidRequest(
            f"'dimensions' must be between 1 and {encoder.dim} for '{encoder.name}'.",
            param="dimensions")


def embed_blocking(
    encoder: Encoder, inputs: Sequence[str] | Sequence[Sequence[int]], *, truncate: bool,
    dimensions: int | None, lock: Callable[[], Any] | None,
) -> EmbedResult:
    """Tokenize (texts), check lengths, embed in padded batches, shorten if asked."""
    if inputs and isinstance(inputs[0], str):
        tokens = encoder.tokenize([str(t) for t in inputs], truncate=truncate)
    else:
        tokens = [list(map(int, ids)) for ids in inputs]
    tokens = encoder.check_lengths(tokens, truncate=truncate)
    vectors = encoder.embed(tokens, lock=lock)
    if dimensions is not None and dimensions != encoder.dim:
        vectors = shrink(vectors, dimensions, normalize=encoder.head.normalize)
    return EmbedResult(model=encoder.name, vectors=vectors, num_tokens=sum(map(len, tokens)))


# --- facts for /v1/models -----------------------------------------------------------
def describe(spec: ModelSpec, registry: Registry, current: Generation | None) -> dict[str, Any]:
    """kind, embedding width, max input length and vision of a registry entry.

    From the loaded generation where it is active; for an entry not loaded,
    from its config files (cheap, no weights): an encoder's width and length,
    a local checkpoint's vision (models/vision.py rule 1). None = not known
    without loading the model.
    """
    facts: dict[str, Any] = {"kind": spec.kind, "embedding_dim": None, "max_input_tokens": None,
                             "vision": _vision(spec, current)}
    if current is not None and current.spec.name == spec.name:
        embedder = getattr(current, "embedder", None)
        if embedder is not None:
            facts["embedding_dim"] = embedder.dim
        if spec.kind == "encoder" and embedder is not None:
            facts["max_input_tokens"] = embedder.max_length
        else:  # the served context ceiling (KV plan), else the trained length
            plan = getattr(current, "plan", None)
            facts["max_input_tokens"] = int(plan.context_ceiling if plan is not None
                                            else current.loaded.context_length)
        return facts
    target = spec if spec.kind == "encoder" else _sidecar_spec(spec, registry)
    shape = encoder_shape(target) if target is not None else None
    if shape is not None:
        facts["embedding_dim"] = shape[0]
        if spec.kind == "encoder":
            facts["max_input_tokens"] = shape[1]
    return facts


def _vision(spec: ModelSpec, current: Generation | None) -> bool | None:
    """Whether the entry reads images: the loaded model's answer, else its checkpoint's."""
    if spec.kind != "generative":
        return False
    if current is not None and current.spec.name == spec.name:
        return current.loaded.vision is not None
    try:
        path = Path(resolve_source(spec))
    except FrinkError:
        return None   # a hub or Ollama source: known once loaded
    return vision_family(path) is not None if path.is_dir() else False


def _sidecar_spec(spec: ModelSpec, registry: Registry) -> ModelSpec | None:
    if not spec.embeddings or spec.embeddings == SELF:
        return None
    try:
        return registry.resolve(spec.embeddings)
    except ModelNotFound:
        return None


def encoder_shape(spec: ModelSpec) -> tuple[int, int] | None:
    """(dim, max input tokens) of an encoder entry from its config files; None if unreadable."""
    try:
        return encoder_limits(Path(resolve_source(spec)))
    except FrinkError:
        return None
