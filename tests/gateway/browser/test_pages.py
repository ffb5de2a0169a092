"""The playground and the dashboard driven by headless Chromium (Playwright, the system's
browser) against `vision-gateway serve` on 127.0.0.1, through the pages' data-testid hooks
(attachments: test_attach.py; fixtures: conftest.py; shared steps: tests/web_pages.py).

Pinned: a fixture image uploaded and asked about twice streams answers equal to the same
conversation sent by the `openai` SDK, and the second answer's cache badge shows the cached
tokens the server reported; the dashboard's counters, bytes and entry table move with that
traffic, its entry cells do not wrap, and its clear button (after confirmation) empties the
caches; the stop button cancels the request on the server; a server with --api-key gets a
key prompt whose key lasts for the tab (the dashboard's "API key needed" in the error
colour); the happy paths log no console errors.

Skipped without Chromium (see web_pages). Set VISION_GATEWAY_SCREENSHOTS=DIR to save the
pages' screenshots there (docs/img).
"""

from __future__ import annotations

import base64
import re
from pathlib import Path

import httpx
from PIL import Image
from playwright.sync_api import Browser, Dialog, Request, expect
from support import ServerProcess, wait_until
from web_pages import (
    FIXTURES,
    NEEDS_CHROMIUM,
    WAIT_MS,
    Console,
    ask,
    open_page,
    screenshot,
    x_cache,
)

from caches.entries import HASH_PREFIX_CHARS
from caches.hashing import pixel_hash

pytestmark = NEEDS_CHROMIUM
BAD_COLOUR = "rgb(198, 40, 40)"  # style.css --bad (light scheme, headless Chromium's)

# Per table cell of the dashboard's entry tables: how many lines its text takes.
_CELL_LINES = """() => Array.from(document.querySelectorAll(".entries tbody td")).map((td) => {
    const range = document.createRange();
    range.selectNodeContents(td);
    return new Set(Array.from(range.getClientRects()).map((r) => Math.round(r.top))).size;
})"""


def _hash_prefix(path: Path) -> str:
    image = Image.open(path).convert("RGB")
    return pixel_hash("RGB", image.width, image.height, image.tobytes())[:HASH_PREFIX_CHARS]


def test_two_questions_stream_and_the_second_hits_the_cache(
    server: ServerProcess, browser: Browser, console: Console
) -> None:
    """Invariant: the streamed answers equal the same conversation through the openai SDK;
    the first badge shows 0 cached tokens and a vision miss, the second the cached tokens
    the server's x-cache header reported (> 0); no console errors."""
    httpx.post(server.base_url + "/v1/cache/clear", timeout=10)  # whatever ran before
    page = open_page(browser, console)
    headers: list[str] = []
    page.on(
        "response",
        lambda r: r.url.endswith("/v1/chat/completions") and headers.append(r.headers["x-cache"]),
    )
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("model-name")).to_have_text("test")
    page.get_by_test_id("image-input").set_input_files(str(FIXTURES / "shapes.png"))
    expect(page.get_by_test_id("thumbnail")).to_have_count(1)
    page.get_by_test_id("max-tokens").fill("24")
    questions = ["What is in this picture?", "What colour is the circle?"]
    ask(page, questions[0], 1)
    expect(page.get_by_test_id("thumbnail")).to_have_count(1)  # now in the sent message
    ask(page, questions[1], 2)
    answers = [a.text_content() for a in page.get_by_test_id("answer").all()]
    badges = page.get_by_test_id("cache-badge").all()

    first, second = (x_cache(h) for h in headers)
    assert badges[0].get_attribute("data-cached-tokens") == "0"
    assert "cached 0 of" in badges[0].text_content() and "1 miss" in badges[0].text_content()
    assert first["vision-misses"] == 1
    cached = second["cached-tokens"]
    assert cached > 0
    assert badges[1].get_attribute("data-cached-tokens") == str(cached)
    assert f"cached {cached} of {second['prompt-tokens']} prompt tokens" in badges[1].text_content()

    image = (
        "data:image/png;base64," + base64.b64encode((FIXTURES / "shapes.png").read_bytes()).decode()
    )
    messages: list[dict] = []
    client = server.client()
    for question, answer in zip(questions, answers, strict=True):
        content = [{"type": "image_url", "image_url": {"url": image}}] if not messages else []
        messages.append({"role": "user", "content": [*content, {"type": "text", "text": question}]})
        reply = client.chat.completions.create(
            model="test", messages=messages, max_tokens=24, temperature=0
        )
        assert reply.choices[0].message.content == answer
        messages.append({"role": "assistant", "content": answer})
    screenshot(page, "playground.png")
    assert console.errors == []


def test_dashboard_moves_with_traffic_and_clears_after_confirmation(
    server: ServerProcess, browser: Browser, console: Console
) -> None:
    """Invariant: while a question about a new image and a repeat in a new chat are asked,
    the dashboard's lookups, bytes and entry table change to match the server (the image's
    pixel-hash prefix appears); Clear does nothing when dismissed and empties both caches when
    confirmed; no console errors."""
    dashboard = open_page(browser, console)
    dashboard.goto(server.base_url + "/dashboard")
    expect(dashboard.get_by_test_id("status")).to_contain_text("live", timeout=WAIT_MS)
    lookups = dashboard.locator("#hits-prefix")
    before = [int(n) for n in re.findall(r"\d+", lookups.text_content())]

    page = open_page(browser, console)
    page.goto(server.base_url + "/")
    # 448 px: the shared prefix (system prompt and image) spans whole exact-reuse blocks.
    image = FIXTURES / "shapes.png"
    for i, question in enumerate(["What shapes are there?", "Which shape is blue?"]):
        if i:
            page.get_by_test_id("new-chat").click()
        page.get_by_test_id("image-input").set_input_files(str(image))
        ask(page, question, 1)

    expect(lookups).to_have_text(re.compile(rf"\d+ / {before[1] + 2}$"), timeout=WAIT_MS)
    stats = httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()
    prefix = stats["prefix"]
    assert prefix["queries"] == before[1] + 2 and prefix["hits"] >= before[0] + 1
    expect(lookups).to_have_text(f"{prefix['hits']} / {prefix['queries']}")
    expect(dashboard.get_by_test_id("hit-rate-prefix")).to_have_text(
        f"{100 * stats['prefix']['hit_rate']:.1f}%"
    )
    # how the KV is held (issue 40): the tiny model's float32, and what a cached token costs
    expect(dashboard.get_by_test_id("kv-format")).to_contain_text(f"{prefix['kv_dtype']} · ")
    expect(dashboard.get_by_test_id("kv-format")).to_contain_text("per token")
    expect(dashboard.get_by_test_id("cache-bytes-vision")).to_have_attribute(
        "data-bytes", str(stats["vision"]["bytes"])
    )
    expect(dashboard.get_by_test_id("cache-bytes-prefix")).to_contain_text(" of 2.00 GiB")
    expect(dashboard.get_by_test_id("entries-largest")).to_contain_text(_hash_prefix(image))
    expect(dashboard.get_by_test_id("ttft")).to_contain_text("p50")
    lines = dashboard.evaluate(_CELL_LINES)
    assert len(lines) >= 6 and set(lines) == {1}, lines  # size "1.23 MiB", age "3 s": one line
    screenshot(dashboard, "dashboard.png")

    clears: list[str] = []  # the page's requests to clear the caches
    dialogs: list[str] = []

    def on_request(request: Request) -> None:
        if request.url.endswith("/v1/cache/clear"):
            clears.append(request.method)

    def dismiss(dialog: Dialog) -> None:
        dialogs.append(dialog.type)
        dialog.dismiss()

    dashboard.on("request", on_request)
    dashboard.once("dialog", dismiss)
    dashboard.get_by_test_id("clear-caches").click()
    # confirm() holds the page's script until the dialog is dismissed; then the click
    # handler runs on to its first await, which would be the clear's fetch, before any other
    # script. So once a script evaluated now has had its own request answered, the handler
    # has had its chance to send the clear.
    stats = dashboard.evaluate("() => fetch('/v1/cache/stats').then((r) => r.json())")
    assert dialogs == ["confirm"] and clears == []
    assert stats["vision"]["entries"]
    assert httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()["vision"]["entries"]
    dashboard.once("dialog", lambda d: d.accept())
    dashboard.get_by_test_id("clear-caches").click()
    expect(dashboard.get_by_test_id("clear-result")).to_have_text("cleared")
    assert clears == ["POST"]  # a clear is seen when the page sends one
    expect(dashboard.get_by_test_id("cache-bytes-vision")).to_have_attribute("data-bytes", "0")
    expect(dashboard.get_by_test_id("entries-prefix")).to_have_text("0")
    expect(dashboard.get_by_test_id("entries-largest")).to_contain_text("no entries")
    assert console.errors == []


def _metric(server: ServerProcess, name: str) -> float:
    return server.metrics().get(name, 0.0)


def test_stop_cancels_the_request_on_the_server(
    server: ServerProcess, browser: Browser, console: Console
) -> None:
    """Invariant: Stop ends a long stream in the page (its text stops growing, the badge says
    stopped), the server counts a cancelled request and frees its row, and the chat goes on;
    no console errors."""
    cancelled = 'vision_gateway_requests_total{status="cancelled"}'
    before = _metric(server, cancelled)
    page = open_page(browser, console)
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("model-name")).to_have_text("test")
    page.get_by_test_id("max-tokens").fill("20000")
    page.get_by_test_id("question").fill("Count to a million, please.")
    page.get_by_test_id("send").click()
    answer = page.locator("article.assistant[data-state=streaming] [data-testid=answer]")
    expect(answer).to_have_text(re.compile(r"\S.{40,}", re.S), timeout=WAIT_MS)  # streaming
    page.get_by_test_id("stop").click()
    stopped = page.locator("article.assistant[data-state=stopped]")
    expect(stopped).to_have_count(1)
    expect(stopped.get_by_test_id("cache-badge")).to_contain_text("stopped")
    text = stopped.get_by_test_id("answer").text_content()
    wait_until(
        lambda: _metric(server, cancelled) >= before + 1,
        30,
        interval=0.2,
        message=lambda: f"{cancelled} stayed at {_metric(server, cancelled)} (was {before})",
    )
    assert _metric(server, cancelled) == before + 1
    assert httpx.get(server.base_url + "/health", timeout=10).json()["running"] == 0
    assert stopped.get_by_test_id("answer").text_content() == text
    assert 0 < len(text) < 20000 * 40
    expect(page.get_by_test_id("send")).to_be_enabled()
    page.get_by_test_id("max-tokens").fill("4")
    ask(page, "Thanks, that is enough.", 2)
    assert page.locator("article.assistant[data-state=done]").count() == 1
    assert console.errors == []


def test_api_key_prompt_keeps_the_key_for_the_tab(browser: Browser, console: Console) -> None:
    """Invariant: with --api-key the pages ask for the key, refuse a wrong one, work with the
    right one (chat and dashboard, same tab), and a new tab asks again."""
    server = ServerProcess("--api-key", "sesame", "--no-warmup")
    try:
        page = open_page(browser, console)
        page.goto(server.base_url + "/")
        prompt = page.get_by_test_id("api-key-prompt")
        expect(prompt).to_be_visible()
        page.get_by_test_id("api-key").fill("wrong")
        page.get_by_test_id("api-key-save").click()
        expect(prompt).to_be_visible()
        expect(page.locator("#key-error")).to_contain_text("refused")
        page.get_by_test_id("api-key").fill("sesame")
        page.get_by_test_id("api-key-save").click()
        expect(page.get_by_test_id("model-name")).to_have_text("test")
        expect(prompt).to_be_hidden()
        page.get_by_test_id("max-tokens").fill("4")
        ask(page, "Hi", 1)
        expect(page.locator("article.assistant[data-state=done]")).to_have_count(1)
        page.goto(server.base_url + "/dashboard")
        expect(page.get_by_test_id("status")).to_contain_text("live", timeout=WAIT_MS)
        expect(page.get_by_test_id("api-key-prompt")).to_be_hidden()
        other = console.watch(page.context.new_page())
        other.goto(server.base_url + "/dashboard")
        expect(other.get_by_test_id("api-key-prompt")).to_be_visible()
        expect(other.get_by_test_id("status")).to_have_text("API key needed")
        expect(other.get_by_test_id("status")).to_have_css("color", BAD_COLOUR)
        assert console.besides_http_errors() == []
    finally:
        assert server.stop(), server.log()
