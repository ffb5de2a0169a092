"""Shared by the browser tests (importable as `web_pages`): the system's Chromium through
Playwright, a console watcher, and the steps every page test takes (open a page, ask a
question and wait for the answer, save a screenshot, read the x-cache header).

Needs a Chromium binary (`apt-get install chromium` on Debian; `.ci/run` installs it) or
VISION_GATEWAY_CHROMIUM=/path/to/chrome; without one the tests marked `NEEDS_CHROMIUM` are
skipped, saying so. VISION_GATEWAY_SCREENSHOTS=DIR saves the pages' screenshots there.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
WAIT_MS = 120_000  # a loaded 2-core CI machine runs the vision tower in seconds


def _chromium() -> str | None:
    named = os.environ.get("VISION_GATEWAY_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


CHROMIUM = _chromium()
NEEDS_CHROMIUM = pytest.mark.skipif(
    CHROMIUM is None,
    reason="no Chromium binary on PATH (Debian: apt-get install chromium, as .ci/run does; "
    "or set VISION_GATEWAY_CHROMIUM)",
)


class Console:
    """Console errors and uncaught exceptions of the pages it watches."""

    def __init__(self) -> None:
        self.errors: list[str] = []

    def watch(self, page: Page) -> Page:
        page.on("console", self._console)
        page.on("pageerror", lambda exc: self.errors.append(f"uncaught: {exc}"))
        return page

    def _console(self, message: ConsoleMessage) -> None:
        if message.type == "error":
            self.errors.append(message.text)

    def besides_http_errors(self) -> list[str]:
        """Errors other than the browser's own log line for a 4xx/5xx response."""
        return [e for e in self.errors if not e.startswith("Failed to load resource")]


def launch_browser() -> Iterator[Browser]:
    """Headless Chromium for a module-scoped fixture (`yield from launch_browser()`)."""
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


def open_page(browser: Browser, console: Console) -> Page:
    """A new page in a fresh context (its own sessionStorage), watched by `console`."""
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    return console.watch(context.new_page())


def screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("VISION_GATEWAY_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / name), full_page=True)


def ask(page: Page, question: str, answers: int) -> None:
    """Type a question, send it, wait until `answers` assistant messages have ended."""
    page.get_by_test_id("question").fill(question)
    page.get_by_test_id("send").click()
    ended = page.locator("article.assistant:not([data-state=streaming])")
    expect(ended).to_have_count(answers, timeout=WAIT_MS)


def x_cache(header: str) -> dict[str, int]:
    return {k.strip(): int(v) for k, v in (part.split("=") for part in header.split(";"))}
