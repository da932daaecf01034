"""Test-only helpers for the browser tests: the system Chromium driven by Playwright.

Why the system browser: CI installs Debian's `chromium` (.ci/run); Playwright's
own browser downloads are never used (no network in tests), so the executable
is found on PATH and handed to Playwright as `executable_path`.

Why LD_PRELOAD is dropped while Playwright starts: `make test` preloads
OpenBLAS for MLX, and Playwright's Node driver and Chromium inherit the
environment; OpenBLAS's thread pool inside them makes Node fail
(`pthread_create: Invalid argument`) and the renderer crash.
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from typing import Any, Iterator

import pytest

CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
# Names the browser tests resolve to 127.0.0.1, as a DNS-rebinding page would.
REBIND_HOST = "rebind.frink.test"


def chromium_executable() -> str | None:
    for name in CANDIDATES:
        path = shutil.which(name)
        if path:
            return path
    return None


@contextmanager
def _without_preload() -> Iterator[None]:
    saved = os.environ.pop("LD_PRELOAD", None)
    try:
        yield
    finally:
        if saved is not None:
            os.environ["LD_PRELOAD"] = saved


@contextmanager
def chromium() -> Iterator[Any]:
    """A headless system Chromium (skips the test when there is none)."""
    executable = chromium_executable()
    if executable is None:
        pytest.skip("no Chromium on PATH (Debian: apt-get install chromium; .ci/run does)")
    from playwright.sync_api import sync_playwright

    with _without_preload():
        playwright = sync_playwright().start()
    try:
        browser = playwright.chromium.launch(
            executable_path=executable,
            args=[f"--host-resolver-rules=MAP {REBIND_HOST} 127.0.0.1"])
        try:
            yield browser
        finally:
            browser.close()
    finally:
        playwright.stop()


class ConsoleLog:
    """Every console message and page error of one page, for 'no errors' checks."""

    def __init__(self, page: Any) -> None:
        self.messages: list[tuple[str, str]] = []
        page.on("console", lambda m: self.messages.append((m.type, m.text)))
        page.on("pageerror", lambda e: self.messages.append(("pageerror", str(e))))

    def errors(self) -> list[str]:
        return [text for kind, text in self.messages if kind in ("error", "pageerror")]
