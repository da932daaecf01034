"""serving/vision.py rule 2: remote image URLs are refused unless fetching is on, then fetched
within the byte limit; a bad answer is a 400 naming the part."""

from __future__ import annotations

import base64
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Iterator

import pytest

pytest.importorskip("PIL")

from vision_support import png_base64  # noqa: E402

from frink_mlx.config import ImageLimits  # noqa: E402
from frink_mlx.core.images import ImageRef  # noqa: E402
from frink_mlx.errors import FrinkError, UnsupportedField  # noqa: E402
from frink_mlx.serving.vision import decode_image  # noqa: E402

PNG = base64.b64decode(png_base64(5))


@pytest.fixture(scope="module")
def host() -> Iterator[str]:
    class Files(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            body = PNG if self.path == "/cat.png" else PNG * 50 if self.path == "/big.png" else b""
            self.send_response(200 if body else 404)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def limits(fetch: bool) -> ImageLimits:
    return ImageLimits(max_images=4, max_image_bytes=len(PNG) * 10, max_image_pixels=10_000,
                       fetch_urls=fetch)


def test_off_by_default_refused_by_name(host: str) -> None:
    with pytest.raises(UnsupportedField) as err:
        decode_image(ImageRef("messages[0].content[1]", url=f"{host}/cat.png"), limits(False))
    assert err.value.param == "messages[0].content[1]"


def test_fetched_when_on(host: str) -> None:
    image, raw = decode_image(ImageRef("p", url=f"{host}/cat.png"), limits(True))
    assert raw == PNG and image.size == (50, 40)


@pytest.mark.parametrize("name", ["missing.png", "big.png"])
def test_a_bad_answer_or_too_many_bytes_is_a_400(host: str, name: str) -> None:
    with pytest.raises(FrinkError) as err:
        decode_image(ImageRef("p", url=f"{host}/{name}"), limits(True))
    assert err.value.status == 400 and err.value.param == "p"
