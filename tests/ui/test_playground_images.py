"""The playground takes images for a vision model (ui/attachments.js), in a real browser.

One daemon with the tiny Gemma 3 VLM (tests/vision_support.py) and a tiny text
llama. An image picked, dropped or pasted goes with the message as an OpenAI
`image_url` part: the answer is exactly the one /v1/chat/completions gives for
that image and text, and the next turn's usage shows the prefix cache covering
the image. On the text-only model the Image button is hidden.
"""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from browser_support import ConsoleLog, chromium
from daemon_support import LiveServer, start_server

pytest.importorskip("mlx_vlm")
pytest.importorskip("PIL")

from vision_support import make_tiny_gemma3_vlm, png_base64  # noqa: E402

pytestmark = pytest.mark.browser
PROMPT = "describe the image please"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    from adapters.scripted import write_models_toml
    from conftest import make_tiny_llama

    from frink_mlx.app import create_app
    from frink_mlx.registry import load_registry
    from frink_mlx.settings import Settings

    root = tmp_path_factory.mktemp("pg-vision")
    path = write_models_toml(root, {"vlm": make_tiny_gemma3_vlm(root / "vlm"),
                                    "tiny": make_tiny_llama(root / "tiny")}, default="tiny")
    settings = Settings.load(models_path=str(path), min_generation_s=0.0, access_log=False,
                             cache_dir=str(root / "cache"), config_dir=str(root / "cfg"))
    live = start_server(create_app(settings, registry=load_registry(settings)))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with chromium() as browser:
        context = browser.new_context()
        yield context.new_page()
        context.close()


def _answer_over_http(live: LiveServer, b64: str) -> str:
    r = httpx.post(live.url + "/v1/chat/completions", timeout=120, json={
        "model": "vlm", "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + b64}},
            {"type": "text", "text": PROMPT}]}]})
    assert r.status_code == 200, r.text
    return str(r.json()["choices"][0]["message"]["content"])


def _send(page: Any, text: str, turn: int) -> None:
    page.fill("#pg-input", text)
    page.click("#pg-send")
    page.wait_for_selector(f"#pg-log .msg.assistant:nth-of-type({2 * turn})[data-finish]")


DROP = """([b64, name, type, kind]) => {
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const data = new DataTransfer();
  data.items.add(new File([bytes], name, { type }));
  const event = kind === "drop"
    ? new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true })
    : new ClipboardEvent("paste", { clipboardData: data, bubbles: true, cancelable: true });
  document.getElementById(kind === "drop" ? "pg-log" : "pg-input").dispatchEvent(event);
}"""


def test_an_attached_image_reads_as_the_chat_route_and_stays_cached(
        daemon: LiveServer, page: Any, tmp_path: Path) -> None:
    console = ConsoleLog(page)
    page.goto(daemon.url + "/")
    page.wait_for_function("() => performance.getEntriesByName('frink:first-status').length > 0")
    assert page.is_hidden("#pg-attach")               # the default model reads text only
    page.select_option("#pg-model", "vlm")
    page.wait_for_selector("#pg-attach", state="visible")
    b64 = png_base64(0)
    (tmp_path / "cat.png").write_bytes(base64.b64decode(b64))
    page.set_input_files("#pg-image", str(tmp_path / "cat.png"))
    page.wait_for_selector("#pg-attachments[data-count='1']")
    page.fill("#pg-max-tokens", "8")
    page.fill("#pg-temperature", "0")
    _send(page, PROMPT, 1)
    assert page.text_content("#pg-log .msg.assistant .content") == _answer_over_http(daemon, b64)
    assert page.locator("#pg-log .msg.user img.thumb").count() == 1
    assert page.get_attribute("#pg-attachments", "data-count") == "0"
    _send(page, "and the second one?", 2)
    usage = page.text_content("#pg-usage") or ""
    cached = re.search(r"cached (\d+)", usage)
    assert cached and int(cached.group(1)) >= 12, usage   # the image's tokens stand at 8..11
    assert console.errors() == []


def test_drop_and_paste_take_images_and_other_files_are_named(daemon: LiveServer,
                                                              page: Any) -> None:
    page.goto(daemon.url + "/")
    page.wait_for_function("() => performance.getEntriesByName('frink:first-status').length > 0")
    page.select_option("#pg-model", "vlm")
    page.wait_for_selector("#pg-attach", state="visible")
    page.evaluate(DROP, [png_base64(1), "a.png", "image/png", "drop"])
    page.wait_for_selector("#pg-attachments[data-count='1']")
    page.evaluate(DROP, [png_base64(2), "b.png", "image/png", "paste"])
    page.wait_for_selector("#pg-attachments[data-count='2']")
    page.evaluate(DROP, [base64.b64encode(b"%PDF-1.4").decode(), "doc.pdf", "application/pdf",
                         "drop"])
    page.wait_for_function("() => document.querySelector('#pg-attach-note').textContent"
                           ".includes('doc.pdf')")
    assert page.get_attribute("#pg-attachments", "data-count") == "2"
    page.click("#pg-attachments .unattach >> nth=0")
    assert page.get_attribute("#pg-attachments", "data-count") == "1"
    page.select_option("#pg-model", "tiny")           # a text model: no images, none pending
    page.wait_for_selector("#pg-attach", state="hidden")
    assert page.get_attribute("#pg-attachments", "data-count") == "0"
