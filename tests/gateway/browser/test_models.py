"""The playground and the dashboard in front of several models (gateway.pool), driven by
headless Chromium against one `vision-gateway serve --model vision=... --model text=...`.

Pinned: the playground lists both models with their state and sends the question to the
one picked (the text model, not loaded until then, loads for it and answers; the server
then lists it loaded); the dashboard's picker switches its numbers to the picked model's
caches; an embedding model's dashboard says it keeps no prefix cache. No console errors.
"""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from playwright.sync_api import Browser, expect
from support import tiny_model
from web_pages import NEEDS_CHROMIUM, Console, ask, open_page

from bench.server import LocalServer

pytestmark = NEEDS_CHROMIUM


@pytest.fixture(scope="module")
def pool_server() -> Iterator[LocalServer]:
    models = [f"--model=vision={tiny_model('qwen2_vl')}", f"--model=text={tiny_model('qwen3')}"]
    models.append(f"--model=embed={tiny_model('qwen3_vl_embedding')}")
    server = LocalServer([*models, "--no-warmup"])
    yield server
    assert server.stop(), server.log()


def test_the_playground_asks_the_model_picked(
    pool_server: LocalServer, browser: Browser, console: Console
) -> None:
    page = open_page(browser, console)
    sent: list[str] = []
    page.on(
        "request",
        lambda r: r.url.endswith("/v1/chat/completions") and sent.append(r.post_data_json["model"]),
    )
    page.goto(pool_server.base_url + "/")
    pick = page.get_by_test_id("model-pick")
    expect(pick.locator("option")).to_have_text(
        ["vision (loaded)", "text (unloaded)", "embed (unloaded)"]
    )
    pick.select_option("text")
    # not loaded yet: its card comes from its config (gateway.pool.build.preview)
    expect(page.get_by_test_id("model-family")).to_have_text("family: text · qwen3")
    page.get_by_test_id("max-tokens").fill("4")
    ask(page, "Say hello.", 1)
    assert sent == ["text"]
    assert page.get_by_test_id("answer").first.text_content()
    cards = httpx.get(pool_server.base_url + "/v1/models", timeout=10).json()["data"]
    states = {c["id"]: c["state"] for c in cards}
    assert states == {"vision": "loaded", "text": "loaded", "embed": "unloaded"}
    assert console.errors == []


def test_the_dashboard_shows_the_model_picked(
    pool_server: LocalServer, browser: Browser, console: Console
) -> None:
    httpx.post(pool_server.base_url + "/v1/models/text/load", timeout=120).raise_for_status()
    page = open_page(browser, console)
    asked: list[str] = []
    page.on("request", lambda r: "/v1/dashboard" in r.url and asked.append(r.url))
    page.goto(pool_server.base_url + "/dashboard")
    pick = page.get_by_test_id("model-pick")
    expect(pick).to_be_visible()
    expect(page.get_by_test_id("model-family")).to_contain_text("qwen_vl")
    pick.select_option("text")
    expect(page.get_by_test_id("model-family")).to_contain_text("text · qwen3")
    assert any(url.endswith("model=text") for url in asked)
    assert console.errors == []


def test_the_dashboard_of_an_embedding_model_says_it_has_no_prefix_cache(
    pool_server: LocalServer, browser: Browser, console: Console
) -> None:
    """An embedding model keeps no KV prefix cache: its dashboard says so and keeps going."""
    httpx.post(pool_server.base_url + "/v1/models/embed/load", timeout=120).raise_for_status()
    page = open_page(browser, console)
    page.goto(pool_server.base_url + "/dashboard")
    page.get_by_test_id("model-pick").select_option("embed")
    expect(page.get_by_test_id("cache-bytes-prefix")).to_contain_text("none for this model")
    expect(page.get_by_test_id("status")).to_contain_text("live")
    assert console.errors == []
