"""GET / and GET /ui/{name}: the status page and playground, shipped in the package.

Why static files and no build step: a daemon run by launchd must show its page
offline and from a plain `pip install`; the page is plain HTML, CSS and
vanilla JS modules under frink_mlx/ui/, read from the installed package.

Rules:
1. The shell is public, the data is not. `/` and `/ui/*` hold no daemon data
   and need no API key (http/security.py OPEN_PATHS); everything the page
   shows comes from keyed endpoints (/admin/status, /v1/*), so with a key
   configured a visitor without it sees an empty page that asks for the key.
   Host allow-list and Origin checks apply to the shell like to any route.
2. Only files that exist directly in frink_mlx/ui/ and match ASSET_NAME are
   served (no path traversal, no directory listing); anything else is 404.
3. Every page response forbids framing (clickjacking), sniffing and referrers,
   and carries a Content-Security-Policy that allows only this origin's own
   scripts, styles and fetches: no inline script, no third-party host, no
   CDN. The page talks to nothing but the daemon that served it. Images may
   also be `blob:` URLs: the previews of images the user attached in the
   playground, made by the page itself from local files (ui/attachments.js).
4. `Cache-Control: no-cache` with an ETag: a browser revalidates, so an
   upgraded daemon never runs a stale script, and an unchanged one costs a 304.
"""

from __future__ import annotations

import hashlib
import re
from importlib import resources
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from ..errors import NotFound
from ..http.errors import endpoint, openai_error

ASSET_NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}\.(js|css|svg)$")
MEDIA_TYPES = {"html": "text/html; charset=utf-8", "js": "text/javascript; charset=utf-8",
               "css": "text/css; charset=utf-8", "svg": "image/svg+xml"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' blob:; "
       "connect-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'")
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP, "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def ui_dir() -> Any:
    """The packaged frink_mlx/ui directory (a Traversable)."""
    return resources.files("frink_mlx") / "ui"


def _file_response(request: Request, name: str) -> Response:
    item = ui_dir() / name
    if not item.is_file():
        raise NotFound(f"No page asset named '{name}'.", param="name")
    body = item.read_bytes()
    etag = '"' + hashlib.sha256(body).hexdigest()[:32] + '"'
    headers = {**SECURITY_HEADERS, "ETag": etag}
    if request.headers.get("if-none-match") == etag:
        return Response(status_code=304, headers=headers)
    return Response(body, media_type=MEDIA_TYPES[name.rsplit(".", 1)[1]], headers=headers)


@endpoint(openai_error)
async def index(request: Request) -> Response:
    return _file_response(request, "index.html")


@endpoint(openai_error)
async def asset(request: Request) -> Response:
    name = request.path_params["name"]
    if not ASSET_NAME.match(name):
        raise NotFound(f"No page asset named '{name[:80]}'.", param="name")
    return _file_response(request, name)


routes: list[BaseRoute] = [
    Route("/", index, methods=["GET"]),
    Route("/ui/{name}", asset, methods=["GET"]),
]
