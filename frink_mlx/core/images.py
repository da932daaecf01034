"""Image parts of a request: what the adapters keep of them, and the text-only policy.

Coding agents put images into their history on their own (Claude Code's Read of
a PNG comes back as an `image` block inside a `tool_result`; Codex's `view_image`,
pasted screenshots) and resend the whole history every turn, so refusing an image
part makes every later turn of that session a 400: the session is dead. A vision
model reads them (models/vision.py); a text-only model cannot, so:

1. Each image part becomes `IMAGE_PLACEHOLDER` in its message's text, in the
   place the image stood, and an `ImageRef` (where it was in the request, its
   bytes or URL) on `GenRequest.images`; `attach_images` then hands each new
   message the refs of the placeholders it holds (`Message.images`), so a
   conversation kept for a later turn (Responses' `previous_response_id`) keeps
   its images. The adapters only translate: nothing is decoded here.
2. On a text-only model the placeholder text is what the model reads; the
   response carries `x-frink-images-omitted: N` and the log one line naming the
   parts (adapters/endpoint.py), so the client and the user can tell.
3. `refuse_images` (a setting, and per registry entry: registry rule 11, which
   wins) refuses the first such part by name instead (400), as before this
   policy existed. A vision model never omits nor refuses them.
4. On a vision model each message's placeholders become the template's image
   parts, in order (serving/vision.py). A client text that happens to hold the
   placeholder's exact wording is read as text once the message's images are
   used up.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence, TypeVar

IMAGE_PLACEHOLDER = "[image omitted: the model serving this request reads text only]"
OMITTED_HEADER = "x-frink-images-omitted"


@dataclass(frozen=True, slots=True)
class ImageRef:
    """One image part as the client sent it (rule 1): base64 `data`, or a `url`."""

    path: str                   # where in the request: "messages[3].content[0]"
    data: str | None = None     # base64 (a data: URL's payload, Anthropic's / Ollama's data)
    url: str | None = None      # a remote URL (fetched only when a setting allows it)
    media_type: str | None = None   # as the client declared it (data: URL, Anthropic)


def image_part(ref: ImageRef, images: list[ImageRef]) -> str:
    """Rule 1: record `ref` and return the text that stands in its place."""
    images.append(ref)
    return IMAGE_PLACEHOLDER


def from_url(path: str, url: object) -> ImageRef:
    """An OpenAI-style image URL (a `data:` URL or a remote one) as an ImageRef."""
    text = url if isinstance(url, str) else ""
    if text.startswith("data:"):
        header, _, payload = text.partition(",")
        media = header[5:].split(";", 1)[0] or None
        return ImageRef(path, data=payload if ";base64" in header else None, media_type=media,
                        url=None if ";base64" in header else text)
    return ImageRef(path, url=text or None)


class HoldsImages(Protocol):
    """What `attach_images` reads of a message (core/request.py's `Message` is one; this
    module stays below request.py, which imports ImageRef from it)."""

    content: str
    images: list[ImageRef]


M = TypeVar("M", bound=HoldsImages)


def attach_images(messages: list[M], images: Sequence[ImageRef]) -> list[M]:
    """Rule 1: each message takes, in order, the refs of the placeholders it holds."""
    queue = list(images)
    for message in messages:
        count = message.content.count(IMAGE_PLACEHOLDER)
        if count and queue and not message.images:
            message.images, queue = queue[:count], queue[count:]
    return messages
