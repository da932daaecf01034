"""The status page in a real browser: Debian's Chromium driven by Playwright.

One daemon (uvicorn on a free port, tiny random-weight models) per module.
Its default model, `tiny-a`, is the tiny llama with the embedding rows of its
end tokens zeroed: their logit is then exactly 0 while the best of ~380 random
logits is positive, so greedy decoding never ends early and a long answer
stays long enough to be stopped by hand.

What must hold (issue 22): the page loads with no console errors, shows the
model and the KV numbers /health reports, the chart updates, a chat streams
and can be stopped (the daemon frees the KV blocks), a 401 flow with a key
works, a foreign origin cannot use the daemon, and the page weighs < 100 KB
and renders in < 1 s (both printed; run with -s to see them).
"""

from __future__ import annotations

import http.server
import re
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest
from browser_support import REBIND_HOST, ConsoleLog, chromium
from daemon_support import LiveServer, generation_factory, start_server, write_registry

from frink_mlx.adapters.page import ui_dir
from frink_mlx.app import create_app
from frink_mlx.registry import load_registry
from frink_mlx.settings import Settings

pytestmark = pytest.mark.browser

KEY = "sk-browser-test"
MAX_PAGE_BYTES = 100 * 1024
MAX_RENDER_MS = 1000.0
LONG_ANSWER_TOKENS = 12000


def endless_llama(path: Path) -> Path:
    """The tiny llama whose greedy answers never hit an end token (module docstring)."""
    import mlx.core as mx
    from conftest import make_tiny_llama

    make_tiny_llama(path, max_position_embeddings=16384)
    weights = mx.load(str(path / "model.safetensors"))
    table = weights["model.embed_tokens.weight"]
    table[0] = 0.0  # <|endoftext|>
    table[2] = 0.0  # <|im_end|>, the eos
    weights["model.embed_tokens.weight"] = table
    mx.save_safetensors(str(path / "model.safetensors"), weights, metadata={"format": "mlx"})
    return path


@pytest.fixture(scope="module")
def registry_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from conftest import make_tiny_llama

    root = tmp_path_factory.mktemp("page")
    return write_registry(root, endless_llama(root / "a"), make_tiny_llama(root / "b", seed=1))


def _serve(registry_file: Path, tmp: Path, **kw: Any) -> LiveServer:
    settings = Settings.load(models_path=str(registry_file), min_generation_s=0.0,
                             access_log=False, cache_dir=str(tmp / "cache"),
                             config_dir=str(tmp / "cfg"), **kw)
    return start_server(create_app(settings, registry=load_registry(settings),
                                   factory=generation_factory()))


@pytest.fixture(scope="module")
def daemon(registry_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = _serve(registry_file, tmp_path_factory.mktemp("d"))
    yield live
    live.stop()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with chromium() as b:
        yield b


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context()  # fresh session storage per test
    yield context.new_page()
    context.close()


def health(live: LiveServer, **kw: Any) -> dict[str, Any]:
    return httpx.get(live.url + "/health", timeout=10, **kw).json()


def wait_status(page: Any) -> None:
    page.wait_for_function("() => performance.getEntriesByName('frink:first-status').length > 0")


def test_page_loads_fast_clean_and_shows_health(daemon: LiveServer, page: Any) -> None:
    console = ConsoleLog(page)
    page.goto(daemon.url + "/")
    wait_status(page)
    timing = page.evaluate("""() => {
        const nav = performance.getEntriesByType("navigation")[0];
        const assets = performance.getEntriesByType("resource")
            .filter((r) => r.initiatorType !== "fetch");
        return {
            bytes: nav.decodedBodySize + assets.reduce((n, r) => n + r.decodedBodySize, 0),
            assets: assets.length,
            fcp: performance.getEntriesByName("first-contentful-paint")[0].startTime,
            status: performance.getEntriesByName("frink:first-status")[0].startTime,
        };
    }""")
    shipped = sum(f.stat().st_size for f in Path(str(ui_dir())).iterdir() if f.is_file())
    print(f"\npage weight: {timing['bytes']} bytes loaded ({timing['assets']} assets + html), "
          f"{shipped} bytes shipped; first contentful paint {timing['fcp']:.0f} ms; "
          f"first status rendered {timing['status']:.0f} ms")
    assert timing["bytes"] < MAX_PAGE_BYTES and shipped < MAX_PAGE_BYTES
    assert timing["fcp"] < MAX_RENDER_MS and timing["status"] < MAX_RENDER_MS
    h = health(daemon)
    kv = {k: page.text_content(f"#kv-{k}") for k in ("used", "cached", "total", "block-size")}
    assert kv == {"used": str(h["kv"]["blocks_used"]), "cached": str(h["kv"]["blocks_cached"]),
                  "total": str(h["kv"]["blocks_total"]), "block-size": str(h["kv"]["block_size"])}
    assert page.text_content("#context") == str(h["context_ceiling"])
    assert page.text_content("#state") == f"ready: {h['model']}"
    assert page.text_content("#version") == f"v{h['version']}"
    assert page.text_content("#backend") in ("CPU", "Metal")
    assert page.text_content("#models tr[data-model='tiny-a'] td:nth-child(3)") == "resident"
    assert page.text_content("#models tr[data-model='tiny-b'] td:nth-child(3)") == "available"
    samples = int(page.get_attribute("#chart", "data-samples"))
    page.wait_for_function(f"() => Number(document.querySelector('#chart').dataset.samples) >= {samples + 2}")
    assert console.errors() == []


def streamed_lengths(page: Any, bubble: str, count: int) -> list[int]:
    """The answer's length at `count` moments while it streams (must grow)."""
    lengths: list[int] = []
    deadline = time.monotonic() + 30
    while len(set(lengths)) < count and time.monotonic() < deadline:
        lengths.append(len(page.text_content(bubble) or ""))
        time.sleep(0.05)
    return lengths


def test_chat_streams_stops_and_frees_kv_blocks(daemon: LiveServer, page: Any) -> None:
    console = ConsoleLog(page)
    page.goto(daemon.url + "/")
    wait_status(page)
    page.select_option("#pg-model", "tiny-a")
    page.fill("#pg-max-tokens", str(LONG_ANSWER_TOKENS))
    page.fill("#pg-temperature", "0")
    page.fill("#pg-input", "What is the capital of France?")
    page.click("#pg-send")
    bubble = "#pg-log .msg.assistant .content"
    lengths = streamed_lengths(page, bubble, 3)
    assert len(set(lengths)) >= 3 and lengths == sorted(lengths), lengths  # tokens arrive over time
    assert page.is_enabled("#pg-stop") and health(daemon)["running"] == 1
    clicked = time.monotonic()
    page.click("#pg-stop")
    page.wait_for_selector("#pg-log .msg.assistant[data-finish='stopped']")
    stopped_ms = (time.monotonic() - clicked) * 1000
    while (h := health(daemon))["running"] or h["kv"]["blocks_used"]:
        assert time.monotonic() < clicked + 10, h  # the daemon aborted and freed the blocks
        time.sleep(0.02)
    print(f"\nstop: answer marked stopped {stopped_ms:.0f} ms after the click, KV blocks freed "
          f"within {(time.monotonic() - clicked) * 1000:.0f} ms")
    # the tok/s line of the chart went up while the answer streamed
    page.wait_for_function("() => Number(document.querySelector('#chart').dataset.peaks.split(',')[0]) > 0")
    status = httpx.get(daemon.url + "/admin/status", timeout=10).json()
    chat = [r for r in status["recent"] if r["route"] == "/v1/chat/completions"][-1]
    # Stop aborts the stream: a client that left mid-answer is a 499 (http/access.py rule 6)
    assert chat["status"] == 499 and 0 < chat["completion_tokens"] < LONG_ANSWER_TOKENS
    # a follow-up resends the conversation: usage shows the prefix-cache hit
    page.fill("#pg-max-tokens", "8")
    page.fill("#pg-input", "And of Italy?")
    page.click("#pg-send")
    page.wait_for_selector("#pg-log .msg.assistant[data-finish='length']")
    usage = page.text_content("#pg-usage") or ""
    match = re.search(r"prompt (\d+) · cached (\d+) · completion 8", usage)
    assert match and int(match.group(2)) > 0, usage
    page.wait_for_function("() => document.querySelector('#ttft').textContent !== '–'")
    assert console.errors() == []


@pytest.fixture(scope="module")
def keyed_daemon(registry_file: Path,
                 tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    live = _serve(registry_file, tmp_path_factory.mktemp("k"), api_key=KEY)
    yield live
    live.stop()


def test_key_prompt_wrong_then_right_key(keyed_daemon: LiveServer, page: Any) -> None:
    console = ConsoleLog(page)
    page.goto(keyed_daemon.url + "/")
    page.wait_for_selector("#key-dialog[open]")
    assert page.text_content("#kv-total") == "–"  # nothing shown without the key
    assert "missing API key" in (page.text_content("#key-error") or "")
    page.fill("#key-input", "wrong")
    page.click("#key-form button[type=submit]")
    page.wait_for_function("() => document.querySelector('#key-error').textContent.includes('invalid')")
    assert page.is_visible("#key-dialog")
    page.fill("#key-input", KEY)
    page.click("#key-form button[type=submit]")
    wait_status(page)
    assert not page.is_visible("#key-dialog")
    auth = {"headers": {"authorization": f"Bearer {KEY}"}}
    assert page.text_content("#kv-total") == str(health(keyed_daemon, **auth)["kv"]["blocks_total"])
    assert page.evaluate("sessionStorage.getItem('frink-mlx.api-key')") == KEY
    page.reload()  # the tab keeps the key: no second prompt
    wait_status(page)
    assert not page.is_visible("#key-dialog") and page.is_visible("#forget-key")
    unexpected = [e for e in console.errors() if "401" not in e]
    assert unexpected == []  # only the two refused requests before the key


FOREIGN_PAGE = """<!doctype html><script>
window.results = {};
const daemon = "%s";
const tries = {
  status: [daemon + "/admin/status", {}],
  models: [daemon + "/v1/models", {}],
  chat: [daemon + "/v1/chat/completions", {method: "POST", headers: {"content-type": "application/json"},
         body: JSON.stringify({messages: [{role: "user", content: "hi"}]})}],
  load: [daemon + "/admin/models/load", {method: "POST", mode: "no-cors", body: '{"model":"tiny-b"}'}],
};
Promise.all(Object.entries(tries).map(([name, [url, init]]) =>
  fetch(url, init).then((r) => { window.results[name] = r.type + ":" + r.status; },
                        (e) => { window.results[name] = "blocked:" + e.name; })))
  .then(() => { window.done = true; });
</script>"""


@pytest.fixture
def foreign_site(daemon: LiveServer) -> Iterator[str]:
    body = (FOREIGN_PAGE % daemon.url).encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("content-type", "text/html")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def origin_rejections(live: LiveServer) -> float:
    text = httpx.get(live.url + "/metrics", timeout=10).text
    match = re.search(r'frink_requests_rejected_total\{reason="origin"\} ([0-9.e+]+)', text)
    return float(match.group(1)) if match else 0.0


def test_foreign_origin_and_rebound_host_cannot_use_it(daemon: LiveServer, page: Any,
                                                        foreign_site: str) -> None:
    refused_before = origin_rejections(daemon)
    page.goto(foreign_site)
    page.wait_for_function("() => window.done === true")
    results = page.evaluate("window.results")
    assert results["status"] == results["models"] == results["chat"] == "blocked:TypeError"
    assert results["load"] == "opaque:0"  # sent, refused, unreadable
    assert origin_rejections(daemon) >= refused_before + 3  # status, models, chat's preflight, load
    states = {m["name"]: m["state"]
              for m in httpx.get(daemon.url + "/admin/status", timeout=10).json()["models"]}
    assert states["tiny-b"] == "available"  # the foreign POST loaded nothing
    port = daemon.url.rsplit(":", 1)[1]
    response = page.goto(f"http://{REBIND_HOST}:{port}/")  # DNS rebinding: Host is foreign
    assert response is not None and response.status == 421
