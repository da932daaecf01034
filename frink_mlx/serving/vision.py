"""Image requests on a vision generation: decode, bound, render, key for the cache.

Why here: the adapters only record image parts (core/images.py); whether they
are read, omitted or refused depends on the generation a request leased, which
only the serving layer knows.

Rules:
1. A request with image parts on a generation without vision: each part's
   placeholder text is what the model reads (core/images.py rule 2), or, with
   `refuse_images` for that entry, the first part is refused by name.
2. On a vision generation every image is checked before any byte is sent, each
   failure a 400 naming the part: at most `max_images` per request; a declared
   media type (a data: URL's, an Anthropic source's) that is one of those
   formats (MEDIA_TYPES; a generic `application/octet-stream` counts as
   undeclared), since a client that calls its bytes a PDF or an SVG did not
   mean a picture; base64 that decodes, to at most `max_image_bytes`; an image
   Pillow can open (PNG, JPEG, WebP, GIF, BMP -- SVG, TIFF and other formats
   are refused by name, whatever was declared) whose width x
   height, read from its header before the pixels are decoded, is at most
   `max_image_pixels`; truncated data is refused when the pixels load. Remote
   URLs are not fetched by default: a local daemon should not reach out to
   arbitrary hosts on a client's behalf, so an http(s) image URL is refused by
   name unless `fetch_image_urls` is set; then it is fetched (FETCH_TIMEOUT_S,
   no more than `max_image_bytes`, a non-200 or a timeout a 400 naming it).
3. The prompt renders with content parts (core/prompt.py rule 7) and goes
   through the model's processor (models/vision.py rule 3), so the ids are
   exactly what mlx-vlm would feed the model.
4. The prefix cache keys image positions by the image, not its token id: each
   position of image k is replaced in `key_ids` by a negative integer from a
   digest of the image's bytes and the position within its run, so two
   different screenshots never share a block and the same one in the next turn
   of a conversation hits (kv/hashing.py hashes any signed 64-bit ints).
5. This is CPU work (base64, image decoding, the processor): the Frontend runs it
   off the event loop.
6. A raw prompt (llama.cpp's /completion, adapters/llamacpp/translate.py rule
   10) is not templated: each image's placeholder in its text becomes what the
   family's chat template writes for an image part (`Vision.image_markup`,
   models/vision.py), and BOS is prepended where `render_raw` would add it, so
   a raw prompt spelled like the template's output reads exactly as the chat
   request does.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import io
from typing import Any

from ..config import ImageLimits
from ..core.images import IMAGE_PLACEHOLDER, ImageRef
from ..core.prompt import RenderedPrompt, encode_text, render_chat_text
from ..core.request import GenRequest
from ..errors import InvalidRequest, UnsupportedField
from ..models.vision import ImageFeatures, Vision

FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")
MEDIA_TYPES = frozenset({"image/png", "image/x-png", "image/jpeg", "image/jpg", "image/pjpeg",
                         "image/webp", "image/gif", "image/bmp", "image/x-ms-bmp"})
UNDECLARED = frozenset({"", "application/octet-stream"})
FETCH_TIMEOUT_S = 10.0


def request_images(request: GenRequest) -> list[ImageRef]:
    """Every image the rendered prompt holds, in order (history's included)."""
    if request.messages is None:
        return list(request.images) if isinstance(request.prompt, str) else []   # rule 6
    return [ref for m in request.messages for ref in m.images]


def raw_text(vision: Vision, tokenizer: Any, request: GenRequest) -> str:
    """Rule 6: a raw prompt's text with each image placeholder as the family's markup."""
    prompt = request.prompt if isinstance(request.prompt, str) else ""
    text = vision.image_markup.join(prompt.split(IMAGE_PLACEHOLDER, len(request.images)))
    bos = getattr(tokenizer, "bos_token", None)
    if request.add_special_tokens and bos and not text.startswith(bos) and \
            encode_text(tokenizer, "", add_special_tokens=True) == [tokenizer.bos_token_id]:
        text = bos + text
    return text


def decode_image(ref: ImageRef, limits: ImageLimits) -> tuple[Any, bytes]:
    """Rule 2: (a loaded RGB PIL image, its bytes) or a 400 naming `ref.path`."""
    from PIL import Image, UnidentifiedImageError

    media = (ref.media_type or "").strip().lower()
    if media not in MEDIA_TYPES and media not in UNDECLARED:
        raise UnsupportedField(ref.path, f"is declared as {ref.media_type!r}; send an image "
                               f"of one of {', '.join(FORMATS)}")
    raw = _image_bytes(ref, limits)
    try:
        image = Image.open(io.BytesIO(raw))
    except Image.DecompressionBombError:
        raise InvalidRequest(f"'{ref.path}' has more than {limits.max_image_pixels} pixels.",
                             param=ref.path) from None
    except (UnidentifiedImageError, OSError):
        raise UnsupportedField(ref.path, "is not an image this server can read "
                               f"({', '.join(FORMATS)})") from None
    if image.format not in FORMATS:
        raise UnsupportedField(ref.path, f"is a {image.format} image; send one of "
                               f"{', '.join(FORMATS)}")
    width, height = image.size
    if width * height > limits.max_image_pixels:
        raise InvalidRequest(f"'{ref.path}' is {width}x{height} pixels; at most "
                             f"{limits.max_image_pixels} pixels are accepted.", param=ref.path)
    try:
        image.load()
    except (OSError, ValueError, Image.DecompressionBombError):
        raise InvalidRequest(f"'{ref.path}' is a truncated or corrupt image.",
                             param=ref.path) from None
    return image.convert("RGB"), raw


def _image_bytes(ref: ImageRef, limits: ImageLimits) -> bytes:
    """Rule 2: the image's bytes from its base64, or from its URL when fetching is on."""
    if ref.data is None:
        remote = bool(ref.url) and str(ref.url).startswith(("http://", "https://"))
        if remote and limits.fetch_urls:
            return _fetch(ref, limits)
        if remote:
            raise UnsupportedField(ref.path, "is a remote image URL; this daemon does not "
                                   "fetch URLs (fetch_image_urls is off): send the image as "
                                   "a data: URL (base64)")
        raise InvalidRequest(f"'{ref.path}' holds no image data (expected base64).",
                             param=ref.path)
    if len(ref.data) > limits.max_image_bytes * 4 // 3 + 4:
        raise InvalidRequest(f"'{ref.path}' is larger than {limits.max_image_bytes} bytes.",
                             param=ref.path)
    try:
        return base64.b64decode(ref.data, validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"'{ref.path}' is not valid base64.", param=ref.path) from None


def _fetch(ref: ImageRef, limits: ImageLimits) -> bytes:
    """Rule 2's fetch: streamed, cut at max_image_bytes, within FETCH_TIMEOUT_S."""
    import httpx

    body = bytearray()
    try:
        with httpx.stream("GET", str(ref.url), timeout=FETCH_TIMEOUT_S,
                          follow_redirects=True) as r:
            if r.status_code != 200:
                raise InvalidRequest(f"'{ref.path}': fetching the image URL answered "
                                     f"{r.status_code}.", param=ref.path)
            for piece in r.iter_bytes():
                body += piece
                if len(body) > limits.max_image_bytes:
                    raise InvalidRequest(f"'{ref.path}' is larger than "
                                         f"{limits.max_image_bytes} bytes.", param=ref.path)
    except httpx.HTTPError as exc:
        raise InvalidRequest(f"'{ref.path}': the image URL could not be fetched ({exc}).",
                             param=ref.path) from None
    return bytes(body)


def key_ids(ids: list[int], spans: list[tuple[int, int]], digests: list[bytes]) -> list[int]:
    """Rule 4: the ids the prefix cache keys, image positions replaced by a digest of
    the image and the position in its run."""
    keyed = list(ids)
    for (start, length), digest in zip(spans, digests):
        base = int.from_bytes(digest[:7], "little")
        for j in range(length):
            keyed[start + j] = -1 - ((base + j) % (1 << 62))
    return keyed


def render_vision(vision: Vision, tokenizer: Any, request: GenRequest, template: str | None,
                  limits: ImageLimits, tool_format: str | None = None
                  ) -> tuple[RenderedPrompt, ImageFeatures, list[int]]:
    """Rules 2-4: the rendered prompt, the engine's image inputs and the cache keys."""
    refs = request_images(request)
    if len(refs) > limits.max_images:
        raise InvalidRequest(f"At most {limits.max_images} images per request; "
                             f"'{refs[limits.max_images].path}' is one too many.",
                             param=refs[limits.max_images].path)
    decoded = [decode_image(ref, limits) for ref in refs]
    text = raw_text(vision, tokenizer, request) if request.messages is None else \
        render_chat_text(tokenizer, request, template, image_parts=True, tool_format=tool_format)
    try:
        prompt = vision.prepare(text, [image for image, _ in decoded])
    except (ValueError, IndexError) as exc:
        raise InvalidRequest(f"The model's processor could not read these images: {exc}",
                             param=refs[0].path) from None
    if len(prompt.spans) != len(refs):
        raise InvalidRequest(f"The prompt holds {len(prompt.spans)} image runs for "
                             f"{len(refs)} images.", param=refs[0].path)
    digests = [hashlib.blake2b(raw, digest_size=16).digest() for _, raw in decoded]
    rendered = RenderedPrompt(prompt.ids, text)
    return rendered, ImageFeatures(vision, prompt), key_ids(prompt.ids, prompt.spans, digests)
