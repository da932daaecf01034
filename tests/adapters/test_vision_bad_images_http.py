"""Bad images on every protocol that takes them: a 400 in that protocol's envelope naming
the part (serving/vision.py rule 2); a request beside them is not disturbed; the
daemon's memory and KV books are where they were after a burst of them.

Each bad image is sent second, after a good one, so the 400 must name the right part.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import time
from typing import Any, Callable

import httpx
import pytest

pytest.importorskip("mlx_vlm")
pytest.importorskip("PIL")

from vision_support import png_base64  # noqa: E402

Image = tuple[str, str]   # (declared media type, base64)
GOOD: Image = ("image/png", png_base64(7))


def _encoded(image: Any, fmt: str) -> str:
    buf = io.BytesIO()
    image.save(buf, format=fmt)
    return base64.b64encode(buf.getvalue()).decode()


def _bad_images() -> dict[str, list[Image]]:
    """Each case: the images of one request, the bad one last."""
    from PIL import Image as PILImage

    whole = base64.b64decode(png_base64(4))
    svg = b'<svg xmlns="http://www.w3.org/2000/svg" width="9" height="9"/>'
    return {
        "truncated": [GOOD, ("image/png", base64.b64encode(whole[:len(whole) // 2]).decode())],
        "base64": [GOOD, ("image/png", "@@not base64@@")],
        "huge": [GOOD, ("image/png", _encoded(PILImage.new("1", (20000, 20000)), "PNG"))],
        "svg": [GOOD, ("image/svg+xml", base64.b64encode(svg).decode())],
        "pdf": [GOOD, ("application/pdf", base64.b64encode(b"%PDF-1.4\n%%EOF\n").decode())],
        "tiff": [GOOD, ("image/tiff", _encoded(PILImage.new("RGB", (8, 8)), "TIFF"))],
        # a PNG's bytes called something else: refused where the protocol declares a type
        "declared-pdf": [GOOD, ("application/pdf", png_base64(8))],
        "hundred": [GOOD] * 100,
    }


BAD = _bad_images()
DECLARES = ("chat", "responses", "anthropic", "tool_result")   # the protocols with a media type


def _url(image: Image) -> str:
    return f"data:{image[0]};base64,{image[1]}"


def _block(image: Image) -> dict[str, Any]:
    return {"type": "image", "source": {"type": "base64", "media_type": image[0],
                                        "data": image[1]}}


def _chat(images: list[Image]) -> tuple[str, dict[str, Any], str, int]:
    parts = [{"type": "image_url", "image_url": {"url": _url(i)}} for i in images]
    return "/v1/chat/completions", {"model": "vlm", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"}, *parts]}]}, \
        "messages[0].content[{}]", 1


def _responses(images: list[Image]) -> tuple[str, dict[str, Any], str, int]:
    parts = [{"type": "input_image", "image_url": _url(i)} for i in images]
    return "/v1/responses", {"model": "vlm", "max_output_tokens": 2, "input": [
        {"role": "user", "content": [{"type": "input_text", "text": "look"}, *parts]}]}, \
        "input[0].content[{}]", 1


def _anthropic(images: list[Image]) -> tuple[str, dict[str, Any], str, int]:
    return "/v1/messages", {"model": "vlm", "max_tokens": 2, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "look"},
                                     *[_block(i) for i in images]]}]}, "messages[0].content[{}]", 1


def _tool_result(images: list[Image]) -> tuple[str, dict[str, Any], str, int]:
    """Claude Code's Read of a PNG: the image inside a tool_result."""
    return "/v1/messages", {"model": "vlm", "max_tokens": 2, "messages": [
        {"role": "user", "content": "read shot.png"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "Read",
                                           "input": {"file_path": "shot.png"}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                      "content": [_block(i) for i in images]}]}]}, \
        "messages[2].content[0].content[{}]", 0


def _ollama_chat(images: list[Image]) -> tuple[str, dict[str, Any], str, int]:
    return "/api/chat", {"model": "vlm", "stream": False, "options": {"num_predict": 2},
                         "messages": [{"role": "user", "content": "look",
                                       "images": [b64 for _, b64 in images]}]}, \
        "messages[0].images[{}]", 0


def _ollama_generate(images: list[Image]) -> tuple[str, dict[str, Any], str, int]:
    return "/api/generate", {"model": "vlm", "stream": False, "prompt": "look",
                             "options": {"num_predict": 2},
                             "images": [b64 for _, b64 in images]}, "images[{}]", 0


def _llamacpp(images: list[Image]) -> tuple[str, dict[str, Any], str, int]:
    return "/completion", {"model": "vlm", "n_predict": 2, "prompt": {
        "prompt_string": "<__media__>" * len(images) + "look",
        "multimodal_data": [b64 for _, b64 in images]}}, "prompt.multimodal_data[{}]", 0


PROTOCOLS: dict[str, Callable[[list[Image]], tuple[str, dict[str, Any], str, int]]] = {
    "chat": _chat, "responses": _responses, "anthropic": _anthropic, "tool_result": _tool_result,
    "ollama_chat": _ollama_chat, "ollama_generate": _ollama_generate, "llamacpp": _llamacpp}


def _named_in_envelope(protocol: str, body: Any, part: str) -> bool:
    """The protocol's own error envelope, naming `part`."""
    if protocol in ("chat", "responses"):
        return body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == part
    if protocol in ("anthropic", "tool_result"):
        return body["type"] == "error" and body["error"]["type"] == "invalid_request_error" \
            and f"'{part}'" in body["error"]["message"]
    if protocol.startswith("ollama"):
        return set(body) == {"error"} and f"'{part}'" in body["error"]
    return body["error"]["code"] == 400 and f"'{part}'" in body["error"]["message"]


def _cases() -> list[tuple[str, str]]:
    return [(kind, protocol) for kind in BAD for protocol in PROTOCOLS
            if kind != "declared-pdf" or protocol in DECLARES]


def _send(live: Any, kind: str, protocol: str) -> tuple[httpx.Response, str]:
    path, body, part, first = PROTOCOLS[protocol](BAD[kind])
    bad = 8 if kind == "hundred" else 1    # max_images = 8: the ninth is one too many
    return httpx.post(live.url + path, json=body, timeout=120), part.format(first + bad)


@pytest.mark.parametrize("kind,protocol", _cases())
def test_a_bad_image_is_a_400_in_the_protocols_envelope_naming_it(
        vlive: Any, kind: str, protocol: str) -> None:
    r, part = _send(vlive, kind, protocol)
    assert r.status_code == 400, (kind, protocol, r.text)
    assert _named_in_envelope(protocol, r.json(), part), (part, r.text)


def test_a_png_called_a_pdf_is_read_where_no_type_is_declared(vlive: Any) -> None:
    """Ollama and llama.cpp send bare base64: the bytes decide (a PNG is read)."""
    for protocol in ("ollama_chat", "llamacpp"):
        path, body, _, _ = PROTOCOLS[protocol](BAD["declared-pdf"])
        assert httpx.post(vlive.url + path, json=body, timeout=120).status_code == 200


def _neighbour(live: Any, started: threading.Event) -> tuple[str, float]:
    """A streamed vision request (1500 tokens, greedy): its text and when its last token came."""
    text: list[str] = []
    body = {"model": "vlm", "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
            "stream": True, "messages": [
                {"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": _url(GOOD)}},
                    {"type": "text", "text": "describe the image please"}]}]}
    with httpx.stream("POST", live.url + "/v1/chat/completions", json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[len("data: "):])
                text.append(chunk["choices"][0]["delta"].get("content") or "")
                last = time.monotonic()
                started.set()
    return "".join(text), last


def _burst(live: Any, cases: list[tuple[str, str]]) -> None:
    for kind, protocol in cases:
        assert _send(live, kind, protocol)[0].status_code == 400


def test_a_request_beside_a_burst_of_bad_images_is_not_disturbed(vlive: Any) -> None:
    """Bad images, every kind on the protocols in turn, sent one after another for as long
    as one vision request generates: its output is what it is alone."""
    names = list(PROTOCOLS)
    cases = [(kind, names[k % len(names)]) for k, kind in enumerate(BAD)
             if kind != "declared-pdf"] + [("declared-pdf", "tool_result")]
    alone, _ = _neighbour(vlive, threading.Event())
    started, done, refused = threading.Event(), threading.Event(), []

    def burst() -> None:
        started.wait(120)
        while not done.is_set():
            kind, protocol = cases[len(refused) % len(cases)]
            status = _send(vlive, kind, protocol)[0].status_code
            refused.append((status, time.monotonic()))

    thread = threading.Thread(target=burst)
    thread.start()
    try:
        text, last_token = _neighbour(vlive, started)
    finally:
        done.set()
        thread.join(120)
    assert {status for status, _ in refused} == {400}
    during = [at for _, at in refused if at < last_token]
    assert len(during) >= len(cases) // 2, (len(during), len(refused))  # it overlapped them
    assert text == alone and len(text) > 0


def _books(live: Any) -> dict[str, Any]:
    import mlx.core as mx

    health = httpx.get(live.url + "/health", timeout=30).json()
    rss_kib = next(int(line.split()[1]) for line in open("/proc/self/status")
                   if line.startswith("VmRSS:"))
    return {"kv_used": health["kv"]["blocks_used"], "running": health["running"],
            "queue": health["queue_depth"], "held": health["memory"]["held_bytes"],
            "leases": live.state.hub.num_leases(), "active": mx.get_active_memory(),
            "rss": rss_kib * 1024}


def test_memory_is_back_to_its_level_after_a_burst_of_bad_images(vlive: Any) -> None:
    _burst(vlive, _cases())                          # first use: imports, pools, caches
    before = _books(vlive)
    for _ in range(2):
        _burst(vlive, _cases())
    after = _books(vlive)
    for key in ("kv_used", "running", "queue", "held", "leases"):
        assert after[key] == before[key], (key, before, after)
    assert after["active"] - before["active"] <= 1 << 20, (before, after)
    assert after["rss"] - before["rss"] <= 64 << 20, (before, after)
