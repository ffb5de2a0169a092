"""The playground's attachments driven by headless Chromium (Playwright, the system's browser)
against `vision-gateway serve` on 127.0.0.1 (shared steps: tests/web_pages.py).

Pinned: a broken image shows the server's error, naming the attachment, and its turn is not
resent; images pasted, dropped and given as a URL join one turn; a file that is neither an
image nor a video is refused when attached, by name, thumbnails show whole images, and a
video goes as a `video_url` part; no console errors.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

from PIL import Image
from playwright.sync_api import Browser, expect
from support import ServerProcess
from video_clips import lossy_clip, noise_frames
from web_pages import (
    FIXTURES,
    NEEDS_CHROMIUM,
    Console,
    ask,
    open_page,
    screenshot,
    x_cache,
)

pytestmark = NEEDS_CHROMIUM


def test_a_broken_image_shows_the_servers_error(
    server: ServerProcess, browser: Browser, console: Console, tmp_path: Path
) -> None:
    """Invariant: an upload that is not an image gets the server's 400 message in the chat
    (nothing thrown in the page), and the turn is not resent with the next question."""
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"this is not a PNG at all")
    page = open_page(browser, console)
    page.goto(server.base_url + "/")
    expect(page.get_by_test_id("model-name")).to_have_text("test")
    page.get_by_test_id("image-input").set_input_files(str(broken))
    ask(page, "What is this?", 1)
    expect(page.get_by_test_id("error")).to_contain_text("broken.png: could not decode image")
    expect(page.locator("article.user.failed")).to_have_count(1)
    page.get_by_test_id("max-tokens").fill("4")
    ask(page, "Hello?", 2)
    expect(page.locator("article.assistant[data-state=done]")).to_have_count(1)
    assert console.besides_http_errors() == []


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
    page = open_page(browser, console)
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
    ask(page, "Compare the images.", 1)
    sent = page.locator("article.user [data-testid=thumbnail] img")
    expect(sent).to_have_count(3)
    assert [i.get_attribute("alt") for i in sent.all()][:2] == ["paste.png", "drop.png"]
    cache = x_cache(headers[0])
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
    page = open_page(browser, console)
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
    screenshot(page, "playground-attachments.png")
    page.get_by_test_id("max-tokens").fill("2")
    ask(page, "Describe both.", 1)
    expect(page.locator("article.assistant[data-state=done]")).to_have_count(1)
    parts = bodies[0]["messages"][0]["content"]
    assert [p["type"] for p in parts] == ["image_url", "video_url", "text"]
    assert parts[1]["video_url"]["url"].startswith("data:video/mp4;base64,")
    assert console.besides_http_errors() == []
