"""Image parts sent to a model that reads text only: the placeholder policy.

Coding agents put images into their history on their own (Claude Code's Read of
a PNG comes back as an `image` block inside a `tool_result`; Codex's `view_image`,
pasted screenshots) and resend the whole history every turn, so refusing an image
part makes every later turn of that session a 400: the session is dead. The
models served today read text only, so, by default:

1. Each image part becomes `IMAGE_PLACEHOLDER`, a short text that says an image
   was left out, in the place the image stood; the adapter records the part's
   path (`messages[3].content[0]`) on `GenRequest.omitted_images`.
2. The response carries `x-frink-images-omitted: N` and the log one line naming
   the parts (adapters/endpoint.py), so the client and the user can tell.
3. `refuse_images` (a setting, and per registry entry: registry rule 11, which
   wins) refuses the first such part by name instead (400), as before this
   policy existed.
"""

from __future__ import annotations

IMAGE_PLACEHOLDER = "[image omitted: the model serving this request reads text only]"
OMITTED_HEADER = "x-frink-images-omitted"


def omit_image(path: str, omitted: list[str]) -> str:
    """Record the image part at `path` as omitted and return the text in its place."""
    omitted.append(path)
    return IMAGE_PLACEHOLDER
