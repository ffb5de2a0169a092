"""Caches seen from outside: through the `openai` SDK against a live server.

Pinned: the same pixels through five deliveries (PNG, lossless WebP and BMP data URIs, a path,
an http URL) make one vision entry and four hits; the `x-cache` header, `usage`, the stats
endpoint and `/metrics` agree; byte budgets hold while 50 distinct images stream through, with
evictions counted; `/v1/cache/clear` empties both caches.
"""

from __future__ import annotations

import base64
import io
from pathlib import Path

import httpx
import pytest
from support import ImageServer, ServerProcess, noise_image


def _encoded(fmt: str, seed: int = 5, size: tuple[int, int] = (84, 56), **save: object) -> bytes:
    buf = io.BytesIO()
    noise_image(seed, *size).save(buf, format=fmt, **save)
    return buf.getvalue()


def _uri(data: bytes, mime: str) -> str:
    return f"data:{mime};base64,{base64.b64encode(data).decode()}"


def _ask(server: ServerProcess, url: str, question: str = "What is it?"):  # noqa: ANN202
    raw = server.client().chat.completions.with_raw_response.create(
        model="test",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": question},
                ],
            }
        ],
        max_tokens=4,
        temperature=0,
    )
    return raw.headers, raw.parse()


def _x_cache(headers: object) -> dict[str, int]:
    fields = dict(item.strip().split("=") for item in headers["x-cache"].split(";"))  # type: ignore[index]
    return {k: int(v) for k, v in fields.items()}


def _stats(server: ServerProcess) -> dict:
    return httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("cache-media")
    (root / "same.png").write_bytes(_encoded("PNG"))
    return root


def test_five_deliveries_of_the_same_pixels_share_one_vision_entry(folder: Path) -> None:
    server = ServerProcess(
        "--no-prefix-cache", "--allowed-media-dir", str(folder), "--allow-private-urls"
    )
    files = ImageServer(folder)
    try:
        deliveries = [
            _uri(_encoded("PNG"), "image/png"),
            _uri(_encoded("WEBP", lossless=True), "image/webp"),
            _uri(_encoded("BMP"), "image/bmp"),
            str(folder / "same.png"),
            f"{files.url}/same.png",
        ]
        answers, headers = [], []
        for url in deliveries:
            h, r = _ask(server, url)
            headers.append(_x_cache(h))
            answers.append(r.choices[0].message.content)
        stats = _stats(server)["vision"]
        assert (stats["entries"], stats["hits"], stats["misses"]) == (1, 4, 1)
        assert [h["vision-hits"] for h in headers] == [0, 1, 1, 1, 1]
        assert len(set(answers)) == 1
    finally:
        files.close()
        assert server.stop(), server.log()


def test_budgets_hold_and_every_view_agrees() -> None:
    """50 distinct images through small budgets: bytes never exceed capacity, evictions are
    counted, and usage / x-cache / stats / metrics report the same numbers."""
    server = ServerProcess("--vision-cache-mb", "0.25", "--kv-cache-mb", "0.5")
    try:
        cached_tokens = vision_hits = 0
        for i in range(50):
            url = _uri(_encoded("PNG", seed=100 + i, size=(224, 224)), "image/png")
            for question in ("What is it?", "And the colours?") if i % 10 == 0 else ("Hi?",):
                h, r = _ask(server, url, question)
                cached_tokens += r.usage.prompt_tokens_details.cached_tokens
                assert _x_cache(h)["cached-tokens"] == r.usage.prompt_tokens_details.cached_tokens
                vision_hits += _x_cache(h)["vision-hits"]
            stats = _stats(server)
            for cache in ("vision", "prefix"):
                assert stats[cache]["bytes"] <= stats[cache]["capacity_bytes"]
        assert stats["vision"]["evictions"] > 0 and stats["prefix"]["evictions"] > 0
        assert stats["prefix"]["tokens_hit"] == cached_tokens > 0
        assert stats["vision"]["hits"] == vision_hits
        metrics = server.metrics()
        assert metrics["vision_gateway_prefix_cache_hits_total"] == cached_tokens
        assert metrics["vision_gateway_vision_cache_hits_total"] == vision_hits
        assert (
            metrics['vision_gateway_cache_evictions_total{cache="vision"}']
            == (stats["vision"]["evictions"])
        )
        assert metrics['vision_gateway_cache_bytes{cache="prefix"}'] == stats["prefix"]["bytes"]
        cleared = httpx.post(server.base_url + "/v1/cache/clear", timeout=10).json()
        assert cleared["vision"]["entries"] == cleared["prefix"]["entries"] == 0
    finally:
        assert server.stop(), server.log()
