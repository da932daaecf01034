"""Vision-language checkpoints: mlx-vlm's towers and processors, our paged engine.

Why mlx-vlm: it is the well-kept library of MLX vision-language models -- the
vision towers, projectors, image processors and chat templates of each family,
checked against their upstream references. We reuse its model code whole and
run only its *language model* on frink's engine, so batching, the prefix
cache, speculation, structured output and residency work for image requests as
for text: the image features go into the language model as input embeddings at
the image token positions, which is also how mlx-vlm itself feeds them.

Installed part (the `vision` extra): `mlx-vlm` with `--no-deps` plus Pillow.
mlx-vlm declares audio (mlx-audio, miniaudio), video (opencv-python), dataset
(datasets) and server (fastapi) dependencies that its image path never imports;
the rest of what it imports (transformers, jinja2, numpy, huggingface_hub)
frink-mlx already depends on.

Rules:
1. A checkpoint is a vision checkpoint when its config.json has a
   `vision_config` and its `model_type` is in `VISION_FAMILIES` (the families
   whose language model speaks mlx-lm's cache protocol, with standard RoPE
   positions or with rule 6's M-RoPE ids, so the paged cache can hold it;
   tests/models/test_vision.py holds each to mlx-vlm's own greedy ids). Any
   other multimodal checkpoint loads as text through mlx-lm, as before.
2. `VisionLM` is what the engine runs: mlx-vlm's language model behind
   mlx-lm's call signature (`model(ids, cache=..., input_embeddings=...)` ->
   logits), exposing `layers` for the paged cache's geometry.
3. `Vision.prepare(text, images)` runs mlx-vlm's processor: the rendered
   prompt's image markers expanded to the image token run, the pixel inputs
   for the tower. It is CPU work on decoded images; call it off the event loop.
4. `Vision.features(prepared, first)` runs the tower and projector (MLX: the
   engine thread) on images `first`.. and returns one embedding row per image
   token of theirs, in prompt order, exactly the rows mlx-vlm's
   `get_input_embeddings` puts at those positions. An image is encoded once
   per cached prefix: a prefix-cache hit that covers the first k images of a
   prompt (the screenshots of an agent's earlier turns) encodes only the rest,
   in one tower call (`ImageFeatures.rows`). The earlier images' tokens become
   padding, their pixel inputs are cut away (`_split_inputs`: one batch row
   per image, or Qwen's patch rows counted by `image_grid_thw`); inputs that
   cannot be cut per image (a processor's crops, say) encode every image.
5. `Vision.embed(ids)` is the language model's own token embedding (what the
   language model would compute from ids), so a prefill chunk that holds image
   positions is the text embeddings with the feature rows put in their place.
6. M-RoPE (`MROPE_FAMILIES`: Qwen2.5-VL). The language model rotates queries
   and keys by 3-D position ids (time, row, column; a text position is one
   number thrice), which mlx-vlm's `get_rope_index` computes from the prompt's
   ids and each image's grid: an image's token run takes positions spanning
   its grid, not its length, so every index after it is shifted by
   `rope_delta` (the largest position + 1 - the prompt's length) and a
   generated token at index i sits at i + rope_delta. mlx-vlm keeps this as
   the language model's state for one sequence (and reads the cache offset
   back to the host every step); the engine batches many rows and keeps steps
   in flight, so `VisionLM` runs the language model's body with explicit
   `position_ids` on every forward, then its head: the layer
   caches' `rope_positions` (kv/paged.py rule 3, which the runner fills from
   each row's `ImageInputs.rope_positions`), or, when no row of the forward
   has images, each row's offset + 0..L-1 (what `get_rope_index` gives text).
   KV slots and the causal mask follow token indices as for any model; only
   the rotation differs. `Vision.rope_index(prompt)` runs on the MLX thread,
   once per prompt (`ImageFeatures` keeps it), also when a prefix-cache hit
   spares the tower.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from ..errors import ModelFormatError

VISION_FAMILIES = frozenset({"gemma3", "qwen2_5_vl"})
# what each family's chat template writes for one image part: the text a raw
# prompt's image stands for (serving/vision.py rule 6), as mtmd's markers are
IMAGE_MARKUP = {"gemma3": "<start_of_image>",
                "qwen2_5_vl": "<|vision_start|><|image_pad|><|vision_end|>"}
MROPE_FAMILIES = frozenset({"qwen2_5_vl"})   # rule 6


def vision_family(path: Path) -> str | None:
    """Rule 1: the mlx-vlm family of the checkpoint at `path`, or None (text)."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        return None
    family = config.get("model_type")
    if "vision_config" not in config or family not in VISION_FAMILIES:
        return None
    return str(family)


def vision_available() -> bool:
    try:
        import mlx_vlm  # noqa: F401
        import PIL  # noqa: F401
    except ImportError:
        return False
    return True


class VisionLM(nn.Module):
    """Rule 2: mlx-vlm's language model behind mlx-lm's call signature, with `layers`."""

    def __init__(self, vlm: nn.Module, mrope: bool = False) -> None:
        super().__init__()
        self.vlm = vlm
        self.mrope = mrope   # rule 6: explicit 3-D position ids on every forward

    @property
    def layers(self) -> list[nn.Module]:
        return list(self.vlm.language_model.layers)

    def make_cache(self) -> list[Any]:
        """mlx-vlm's cache entries as the mlx-lm classes they mirror (engine/kv/specs.py
        reads kinds by mlx-lm's classes); any other kind is left for it to refuse. A
        language model without `make_cache` (Qwen2.5-VL's) has one KV cache per layer,
        as mlx-lm's `make_prompt_cache` gives such a model."""
        from mlx_lm.models import cache as lm

        language = self.vlm.language_model
        if not hasattr(language, "make_cache"):
            return [lm.KVCache() for _ in self.layers]
        out: list[Any] = []
        for entry in language.make_cache():
            kind = type(entry).__name__
            if kind == "KVCache":
                out.append(lm.KVCache())
            elif kind == "RotatingKVCache":
                out.append(lm.RotatingKVCache(max_size=entry.max_size, keep=entry.keep))
            else:
                out.append(entry)
        return out

    def __call__(self, inputs: mx.array, cache: Any = None,
                 input_embeddings: mx.array | None = None) -> mx.array:
        lm = self.vlm.language_model
        if self.mrope:   # rule 6: its body with explicit ids, then its head; no state
            hidden = lm.model(inputs, inputs_embeds=input_embeddings, cache=cache,
                              position_ids=mrope_ids(inputs.shape, cache))
            tied = getattr(lm.args, "tie_word_embeddings", False)
            return lm.model.embed_tokens.as_linear(hidden) if tied else lm.lm_head(hidden)
        out = lm(inputs, inputs_embeds=input_embeddings, cache=cache)
        return out.logits if hasattr(out, "logits") else out


def mrope_ids(shape: tuple[int, ...], cache: Any) -> mx.array:
    """Rule 6: (3, B, L) position ids of a forward over `cache` (a list of layer caches)."""
    first = cache[0] if cache else None
    given = getattr(first, "rope_positions", None)
    if given is not None:
        return given
    batch, length = shape[0], shape[1]
    offset = getattr(first, "offset", 0)
    starts = offset if isinstance(offset, mx.array) else mx.array([int(offset)])
    ids = starts.reshape(-1, 1).astype(mx.int32) + mx.arange(length, dtype=mx.int32)[None]
    return mx.broadcast_to(ids[None], (3, batch, length))


@dataclass(frozen=True, slots=True)
class VisionPrompt:
    """What the processor made of one prompt and its images (rule 3)."""

    ids: list[int]
    inputs: dict[str, mx.array]   # pixel_values and whatever else the tower takes
    positions: list[int]          # prompt indices of the image tokens, in order
    spans: list[tuple[int, int]]  # (start, length) of each image's token run


class Vision:
    """One loaded vision checkpoint's processor, tower and embeddings (rules 3-5)."""

    def __init__(self, vlm: nn.Module, processor: Any, family: str) -> None:
        self.vlm = vlm
        self.processor = processor
        self.family = family
        config = vlm.config
        token = getattr(config, "image_token_index", None)
        self.image_token_id = int(token if token is not None else config.image_token_id)
        self.mrope = family in MROPE_FAMILIES
        self.image_markup = IMAGE_MARKUP.get(family, "")

    def prepare(self, text: str, images: list[Any]) -> VisionPrompt:
        """Rule 3: `images` are PIL images, in the order their markers stand in `text`."""
        from mlx_vlm.utils import prepare_inputs

        out = prepare_inputs(self.processor, images=images, prompts=[text],
                             image_token_index=self.image_token_id)
        ids = [int(i) for i in np.array(out["input_ids"][0])]
        positions = [i for i, t in enumerate(ids) if t == self.image_token_id]
        if not positions:
            raise ModelFormatError("the processor put no image tokens in the prompt")
        inputs = {k: v for k, v in out.items() if k not in ("input_ids", "attention_mask")}
        return VisionPrompt(ids, inputs, positions, _runs(positions))

    def features(self, prompt: VisionPrompt, first: int = 0) -> tuple[mx.array, int]:
        """Rule 4: (rows, image index they start at) -- the image tokens' rows of
        images `first`.. (or of all of them, from 0, when the inputs cannot be cut)."""
        inputs = _split_inputs(prompt, first) if first else None
        if inputs is None:
            first, inputs = 0, prompt.inputs
        skipped = {p for start, length in prompt.spans[:first]
                   for p in range(start, start + length)}
        pad = int(getattr(self.vlm.config, "pad_token_id", None) or 0)
        ids = mx.array([[pad if i in skipped else t for i, t in enumerate(prompt.ids)]])
        mask = mx.ones(ids.shape, dtype=mx.int32)
        embedded = self.vlm.get_input_embeddings(ids, mask=mask, **inputs)
        kept = [p for p in prompt.positions if p not in skipped]
        return embedded.inputs_embeds[0][mx.array(kept, dtype=mx.int32)], first

    def embed(self, ids: mx.array) -> mx.array:
        """Rule 5: the language model's own token embedding of `ids`."""
        return self.vlm.language_model.model.embed_tokens(ids)

    def rope_index(self, prompt: VisionPrompt) -> tuple[np.ndarray, int] | None:
        """Rule 6: the prompt's (3, P) M-RoPE position ids and its rope_delta, or
        None for a family with standard RoPE (positions are the indices)."""
        if not self.mrope:
            return None
        ids = mx.array([prompt.ids])
        positions, delta = self.vlm.language_model.get_rope_index(
            ids, prompt.inputs.get("image_grid_thw"), None, mx.ones(ids.shape, dtype=mx.int32))
        return np.array(positions[:, 0, :]).astype(np.int64), int(np.array(delta).reshape(-1)[0])


def _split_inputs(prompt: VisionPrompt, first: int) -> dict[str, mx.array] | None:
    """Rule 4: the pixel inputs of images `first`.., or None when they cannot be cut."""
    inputs, num_images = prompt.inputs, len(prompt.spans)
    pixels, grid = inputs.get("pixel_values"), inputs.get("image_grid_thw")
    if pixels is None or set(inputs) - {"pixel_values", "image_grid_thw"}:
        return None
    if grid is None:   # one batch row per image (SigLIP-style towers)
        return {"pixel_values": pixels[first:]} if pixels.shape[0] == num_images else None
    if grid.shape[0] != num_images:
        return None
    skip = int(np.array(grid[:first]).prod(axis=1).sum())   # Qwen: t*h*w patch rows each
    return {"pixel_values": pixels[skip:], "image_grid_thw": grid[first:]}


def _runs(positions: list[int]) -> list[tuple[int, int]]:
    spans: list[tuple[int, int]] = []
    for p in positions:
        if spans and spans[-1][0] + spans[-1][1] == p:
            spans[-1] = (spans[-1][0], spans[-1][1] + 1)
        else:
            spans.append((p, 1))
    return spans


def load_vision(path: Path, name: str, tokenizer_config: dict[str, Any] | None = None
                ) -> tuple[VisionLM, Vision, Any, dict[str, Any]]:
    """(engine model, Vision, mlx-lm tokenizer, config) of the checkpoint at `path`;
    `tokenizer_config` as mlx_lm.load takes it (the registry's chat_template)."""
    if not vision_available():
        raise ModelFormatError(
            f"model {name!r} is a vision-language checkpoint; install mlx-vlm and Pillow "
            "to serve it (pip install Pillow && pip install --no-deps mlx-vlm==0.7.10, as "
            "`make` does; or pip install 'frink-mlx[vision]')")
    from mlx_lm.utils import load_tokenizer
    from mlx_vlm.utils import load_model, load_processor

    family = vision_family(path) or "?"
    try:
        vlm = load_model(path)
        processor = load_processor(path, add_detokenizer=False)
    except (ValueError, FileNotFoundError, KeyError, OSError) as exc:
        raise ModelFormatError(f"model {name!r}: cannot load {path} ({family}): {exc}") from None
    config = json.loads((path / "config.json").read_text())
    text_config = dict(config.get("text_config") or {})
    merged = {**config, **{k: v for k, v in text_config.items() if k not in config}}
    eos = config.get("eos_token_id")
    tokenizer = load_tokenizer(path, tokenizer_config_extra=tokenizer_config,
                               eos_token_ids=eos if isinstance(eos, list) else None)
    vision = Vision(vlm, processor, family)
    return VisionLM(vlm, vision.mrope), vision, tokenizer, merged


class ImageFeatures:
    """engine/types.py `ImageInputs` for one prepared prompt: each image encoded once,
    and none that a prefix-cache hit covers (rule 4)."""

    def __init__(self, vision: Vision, prompt: VisionPrompt) -> None:
        self.vision = vision
        self.prompt = prompt
        self.positions = prompt.positions
        self._rows: mx.array | None = None
        self._from = 0   # the image-token index self._rows starts at
        self._rope: tuple[np.ndarray, int] | None = None

    def rows(self, lo: int, hi: int) -> mx.array:
        """Image tokens lo..hi-1's rows; the first call encodes the image holding
        token lo and every one after it (a prefill chunk never goes back, except a
        recompute after preemption, which encodes again from where it starts)."""
        if self._rows is None or lo < self._from:
            first = next(k for k, (start, length) in enumerate(self.prompt.spans)
                         if self.positions[lo] < start + length)
            self._rows, first = self.vision.features(self.prompt, first)
            self._from = sum(length for _, length in self.prompt.spans[:first])
        return self._rows[lo - self._from:hi - self._from]

    def embed(self, ids: mx.array) -> mx.array:
        return self.vision.embed(ids)

    def rope_positions(self, start: int, length: int) -> np.ndarray | None:
        """Rule 6: (3, length) position ids of indices start.., past the prompt
        index + rope_delta; None when the family's positions are the indices."""
        if not self.vision.mrope:
            return None
        if self._rope is None:
            self._rope = self.vision.rope_index(self.prompt)
            if self._rope is None:
                return None
        table, delta = self._rope
        index = np.arange(start, start + length)
        inside = index < table.shape[1]
        past = np.broadcast_to(index + delta, (3, length))
        return np.where(inside[None], table[:, np.minimum(index, table.shape[1] - 1)], past)
