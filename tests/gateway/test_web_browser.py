"""The playground and the dashboard driven by headless Chromium (Playwright, the system's
browser) against `vision-gateway serve` on 127.0.0.1, through the pages' data-testid hooks.

Pinned: a fixture image uploaded and asked about twice streams answers equal to the same
conversation sent by the `openai` SDK, and the second answer's cache badge shows the cached
tokens the server reported; the dashboard's counters, bytes and entry table move with that
traffic, its entry cells do not wrap, and its clear button (after confirmation) empties the
caches; the stop button cancels the request on the server; a broken image shows the server's
error, naming the attachment; a file that is neither an image nor a video is refused when
attached, by name, thumbnails show whole images and a video goes as a video; a server with
--api-key gets a key prompt whose key lasts for the tab (the dashboard's "API key needed" in
the error colour); the happy paths log no console errors.

Needs a Chromium binary (`apt-get install chromium` on Debian; `.ci/run` installs it) or
VISION_GATEWAY_CHROMIUM=/path/to/chrome; without one these tests are skipped, saying so.
Set VISION_GATEWAY_SCREENSHOTS=DIR to save the pages' screenshots there (docs/img).
"""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from playwright.sync_api import Browser, ConsoleMessage, Page, expect, sync_playwright
from support import ServerProcess
from video_clips import lossy_clip, noise_frames

from caches.entries import HASH_PREFIX_CHARS
from caches.hashing import pixel_hash

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
WAIT_MS = 120_000  # a loaded 2-core CI machine runs the vision tower in seconds
BAD_COLOUR = "rgb(198, 40, 40)"  # style.css --bad (light scheme, headless Chromium's)

# Per table cell of the dashboard's entry tables: how many lines its text takes.
_CELL_LINES = """() => Array.from(document.querySelectorAll(".entries tbody td")).map((td) => {
    const range = document.createRange();
    range.selectNodeContents(td);
    return new Set(Array.from(range.getClientRects()).map((r) => Math.round(r.top))).size;
})"""


def _chromium() -> str | None:
    named = os.environ.get("VISION_GATEWAY_CHROMIUM")
    if named:
        return named
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if path := shutil.which(name):
            return path
    return None


CHROMIUM = _chromium()
pytestmark = pytest.mark.skipif(
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


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM)
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess()
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture
def console() -> Console:
    return Console()


def _page(browser: Browser, console: Console) -> Page:
    context = browser.new_context(viewport={"width": 1280, "height": 860})
    return console.watch(context.new_page())


def _screenshot(page: Page, name: str) -> None:
    folder = os.environ.get("VISION_GATEWAY_SCREENSHOTS")
    if folder:
        page.screenshot(path=str(Path(folder) / name), full_page=True)


def _hash_prefix(path: Path) -> str:
    image = Image.open(path).convert("RGB")
    return pixel_hash("RGB", image.width, image.height, image.tobytes())[:HASH_PREFIX_CHARS]


def _ask(page: Page, question: str, answers: int) -> None:
    """Type a question, send it, wait until `answers` assistant messages have ended."""
    page.get_by_test_id("question").fill(question)
    page.get_by_test_id("send").click()
    ended = page.locator("article.assistant:not([data-state=streaming])")
    expect(ended).to_have_count(answers, timeout=WAIT_MS)


def _x_cache(header: str) -> dict[str, int]:
    return {k.strip(): int(v) for k, v in (part.split("=") for part in header.split(";"))}


def test_two_questions_stream_and_the_second_hits_the_cache(
    server: ServerProcess, browser: Browser, console: Console
) -> None:
    """Invariant: the streamed answers equal the same conversation through the openai SDK;
    the first badge shows 0 cached tokens and a vision miss, the second the cached tokens
    the server's x-cache header reported (> 0); no console errors."""
    httpx.post(server.base_url + "/v1/cache/clear", timeout=10)  # whatever ran before
    page = _page(browser, console)
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
    _ask(page, questions[0], 1)
    expect(page.get_by_test_id("thumbnail")).to_have_count(1)  # now in the sent message
    _ask(page, questions[1], 2)
    answers = [a.text_content() for a in page.get_by_test_id("answer").all()]
    badges = page.get_by_test_id("cache-badge").all()

    first, second = (_x_cache(h) for h in headers)
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
    _screenshot(page, "playground.png")
    assert console.errors == []


def test_dashboard_moves_with_traffic_and_clears_after_confirmation(
    server: ServerProcess, browser: Browser, console: Console
) -> None:
    """Invariant: while a question about a new image and a repeat in a new chat are asked,
    the dashboard's lookups, bytes and entry table change to match the server (the image's
    pixel-hash prefix appears); Clear does nothing when dismissed and empties both caches when
    confirmed; no console errors."""
    dashboard = _page(browser, console)
    dashboard.goto(server.base_url + "/dashboard")
    expect(dashboard.get_by_test_id("status")).to_contain_text("live", timeout=WAIT_MS)
    lookups = dashboard.locator("#hits-prefix")
    before = [int(n) for n in re.findall(r"\d+", lookups.text_content())]

    page = _page(browser, console)
    page.goto(server.base_url + "/")
    # 448 px: the shared prefix (system prompt and image) spans whole exact-reuse blocks.
    image = FIXTURES / "shapes.png"
    for i, question in enumerate(["What shapes are there?", "Which shape is blue?"]):
        if i:
            page.get_by_test_id("new-chat").click()
        page.get_by_test_id("image-input").set_input_files(str(image))
        _ask(page, question, 1)

    expect(lookups).to_have_text(re.compile(rf"\d+ / {before[1] + 2}$"), timeout=WAIT_MS)
    stats = httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()
    prefix = stats["prefix"]
    assert prefix["queries"] == before[1] + 2 and prefix["hits"] >= before[0] + 1
    expect(lookups).to_have_text(f"{prefix['hits']} / {prefix['queries']}")
    expect(dashboard.get_by_test_id("hit-rate-prefix")).to_have_text(
        f"{100 * stats['prefix']['hit_rate']:.1f}%"
    )
    expect(dashboard.get_by_test_id("cache-bytes-vision")).to_have_attribute(
        "data-bytes", str(stats["vision"]["bytes"])
    )
    expect(dashboard.get_by_test_id("cache-bytes-prefix")).to_contain_text(" of 2.00 GiB")
    expect(dashboard.get_by_test_id("entries-largest")).to_contain_text(_hash_prefix(image))
    expect(dashboard.get_by_test_id("ttft")).to_contain_text("p50")
    lines = dashboard.evaluate(_CELL_LINES)
    assert len(lines) >= 6 and set(lines) == {1}, lines  # size "1.23 MiB", age "3 s": one line
    _screenshot(dashboard, "dashboard.png")

    dashboard.once("dialog", lambda d: d.dismiss())
    dashboard.get_by_test_id("clear-caches").click()
    time.sleep(1.5)
    assert httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()["vision"]["entries"]
    dashboard.once("dialog", lambda d: d.accept())
    dashboard.get_by_test_id("clear-caches").click()
    expect(dashboard.get_by_test_id("clear-result")).to_have_text("cleared")
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
    page = _page(browser, console)
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
    deadline = time.monotonic() + 30
    while _metric(server, cancelled) < before + 1 and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _metric(server, cancelled) == before + 1
    assert httpx.get(server.base_url + "/health", timeout=10).json()["running"] == 0
    assert stopped.get_by_test_id("answer").text_content() == text
    assert 0 < len(text) < 20000 * 40
    expect(page.get_by_test_id("send")).to_be_enabled()
    page.get_by_test_id("max-tokens").fill("4")
    _ask(page, "Thanks, that is enough.", 2)
    assert page.locator("article.assistant[data-state=done]").count() == 1
    assert console.errors == []


def test_a_broken_image_shows_the_servers_error(
    server: ServerProcess, browser: Browser, console: Console, tmp_path: Path
) -> None:
    """Invariant: an upload that is not an image gets the server's 400 message in the chat
    (nothing thrown in the page), and the turn is not resent with the next question."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"this is not a PNG at all")
    page = _page(browser, console)
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("model-name")).to_have_text("test")
    page.get_by_test_id("image-input").set_input_files(str(broken))
    _ask(page, "What is this?", 1)
    expect(page.get_by_test_id("error")).to_contain_text("broken.png: could not decode image")
    expect(page.locator("article.user.failed")).to_have_count(1)
    page.get_by_test_id("max-tokens").fill("4")
    _ask(page, "Hello?", 2)
    expect(page.locator("article.assistant[data-state=done]")).to_have_count(1)
    assert console.besides_http_errors() == []


def test_api_key_prompt_keeps_the_key_for_the_tab(browser: Browser, console: Console) -> None:
    """Invariant: with --api-key the pages ask for the key, refuse a wrong one, work with the
    right one (chat and dashboard, same tab), and a new tab asks again."""
    server = ServerProcess("--api-key", "sesame", "--no-warmup")
    try:
        page = _page(browser, console)
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
        _ask(page, "Hi", 1)
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


def _png_b64(colour: tuple[int, int, int]) -> str:
    buf = io.BytesIO()
    Image.new("RGB", (40, 40), colour).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


# Builds a File in the page and hands it over the way the browser does for a paste or a drop.
_DELIVER = """([kind, b64]) => {
    const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
    const data = new DataTransfer();
    data.items.add(new File([bytes], kind + ".png", { type: "image/png" }));
    const event = kind === "paste"
        ? new ClipboardEvent("paste", { clipboardData: data, bubbles: true })
        : new DragEvent("drop", { dataTransfer: data, bubbles: true, cancelable: true });
    document.querySelector("[data-testid=question]").dispatchEvent(event);
}"""


def test_pasted_dropped_and_url_images_join_one_turn(
    server: ServerProcess, browser: Browser, console: Console
) -> None:
    """Invariant: an image pasted from the clipboard, one dropped on the page and one given
    as a URL are all sent in one turn, in that order (the server looks up three images);
    no console errors."""
    page = _page(browser, console)
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("model-name")).to_have_text("test")
    headers: list[str] = []
    page.on(
        "response",
        lambda r: r.url.endswith("/v1/chat/completions") and headers.append(r.headers["x-cache"]),
    )
    page.evaluate(_DELIVER, ["paste", _png_b64((200, 30, 90))])
    expect(page.get_by_test_id("thumbnail")).to_have_count(1)
    page.evaluate(_DELIVER, ["drop", _png_b64((20, 160, 90))])
    expect(page.get_by_test_id("thumbnail")).to_have_count(2)
    shapes = base64.b64encode((FIXTURES / "shapes-56.png").read_bytes()).decode()
    page.get_by_test_id("image-url").fill(f"data:image/png;base64,{shapes}")
    page.get_by_test_id("max-tokens").fill("4")
    _ask(page, "Compare the images.", 1)
    sent = page.locator("article.user [data-testid=thumbnail] img")
    expect(sent).to_have_count(3)
    assert [i.get_attribute("alt") for i in sent.all()][:2] == ["paste.png", "drop.png"]
    cache = _x_cache(headers[0])
    assert cache["vision-hits"] + cache["vision-misses"] == 3  # a new image comes first
    assert console.errors == []


def test_only_images_and_videos_attach_and_thumbnails_show_them_whole(
    server: ServerProcess, browser: Browser, console: Console, tmp_path: Path
) -> None:
    """Invariant: among files chosen together, a text file is refused at once with a message
    naming it (nothing sent), the image and the video are attached; the wide image's
    thumbnail is letterboxed, not cropped; the turn sends the image as `image_url` and the
    video as `video_url` and gets an answer; no console errors."""
    notes, wide, clip = tmp_path / "notes.txt", tmp_path / "wide.png", tmp_path / "clip.mp4"
    notes.write_text("not a picture")
    Image.new("RGB", (168, 56), (30, 90, 200)).save(wide)
    clip.write_bytes(lossy_clip(noise_frames(4, 64, 64)))
    page = _page(browser, console)
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("model-name")).to_have_text("test")
    bodies: list[dict] = []
    page.on(
        "request",
        lambda r: r.url.endswith("/v1/chat/completions") and bodies.append(r.post_data_json),
    )
    page.get_by_test_id("image-input").set_input_files([str(notes), str(wide), str(clip)])
    expect(page.get_by_test_id("attach-error")).to_have_text(
        'Not attached: "notes.txt" is not an image or a video.'
    )
    expect(page.get_by_test_id("thumbnail")).to_have_count(2)
    thumb = page.get_by_test_id("thumbnail").locator("img")
    expect(thumb).to_have_css("object-fit", "contain")
    _screenshot(page, "playground-attachments.png")
    page.get_by_test_id("max-tokens").fill("2")
    _ask(page, "Describe both.", 1)
    expect(page.locator("article.assistant[data-state=done]")).to_have_count(1)
    parts = bodies[0]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "video_url", "text"]
    assert parts[1]["video_url"]["url"].startswith("data:video/mp4;base64,")
    assert console.besides_http_errors() == []
