"""The web routes over HTTP, against `vision-gateway serve` on 127.0.0.1 (the engine in its own
process, and with `--in-process-engine`).

Pinned: the pages and their static files are served from the package with a same-origin CSP
and need no key; `GET /v1/cache/entries` reports the entries the caches really hold (pixel
hash prefixes, hits, bytes agreeing with `/v1/cache/stats`) in both engine modes and refuses
bad parameters with a 400 that names them; `GET /v1/dashboard` moves with traffic and, like
the caches, counts no warm-up request in its TTFT; with `--api-key` every JSON endpoint the
pages call wants the key.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image
from support import ServerProcess, data_uri, noise_png, wait_until

from caches.entries import HASH_PREFIX_CHARS
from caches.hashing import pixel_hash

STATIC = Path(__file__).resolve().parents[2] / "gateway" / "static"


def _hash(png: bytes) -> str:
    image = Image.open(io.BytesIO(png)).convert("RGB")
    return pixel_hash("RGB", image.width, image.height, image.tobytes())


@pytest.fixture(scope="module", params=["engine-process", "in-process-engine"])
def server(request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    args = ["--in-process-engine"] if request.param == "in-process-engine" else []
    # 8-token blocks: the prefix cache stores whole blocks, and these prompts are ~30 tokens.
    proc = ServerProcess(*args, "--kv-block-tokens", "8")
    yield proc
    assert proc.stop(), proc.log()


def _ask(server: ServerProcess, png: bytes, system: str) -> None:
    server.client().chat.completions.create(
        model="test",
        messages=[
            {"role": "system", "content": system},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": data_uri(png)}},
                    {"type": "text", "text": "What is it?"},
                ],
            },
        ],
        max_tokens=3,
        temperature=0,
    )


def test_the_warm_up_is_not_in_the_ttft_figures(server: ServerProcess) -> None:
    """Invariant: on a server that has served nobody yet, the start-up warm-up's requests
    (counted by `requests_total`) are in neither the dashboard's TTFT nor /metrics' TTFT and
    latency histograms: those start over with the caches when the warm-up ends. (First in
    the module: it needs the server untouched.)"""
    metrics = server.metrics()
    assert metrics['vision_gateway_requests_total{status="ok"}'] > 0  # the warm-up ran
    assert metrics["vision_gateway_time_to_first_token_seconds_count"] == 0
    assert metrics["vision_gateway_request_latency_seconds_count"] == 0
    live = httpx.get(server.base_url + "/v1/dashboard", timeout=10).json()
    assert live["ttft"]["count"] == 0 and live["ttft"]["p50_ms"] is None
    assert live["caches"]["vision"]["queries"] == 0


def test_pages_and_static_files_are_served_with_a_same_origin_policy(
    server: ServerProcess,
) -> None:
    """Invariant: / and /dashboard are HTML with a CSP that allows only same-origin scripts
    (no CDN), every script and stylesheet they reference is served from /static, and
    nothing they reference lives elsewhere."""
    for path, title in (("/", "playground"), ("/dashboard", "cache dashboard")):
        page = httpx.get(server.base_url + path, timeout=10)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert title in page.text
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "unsafe" not in csp
        assets = re.findall(r'(?:src|href)="([^"]+\.(?:js|css))"', page.text)
        assert assets and all(a.startswith("/static/") for a in assets)
        for asset in assets:
            served = httpx.get(server.base_url + asset, timeout=10)
            assert served.status_code == 200
            assert served.content == (STATIC / asset.removeprefix("/static/")).read_bytes()
        assert not re.search(r"https?://[a-z]", page.text)  # nothing from elsewhere


def test_entries_report_what_the_caches_hold_in_both_engine_modes(server: ServerProcess) -> None:
    """Invariant: after image A asked under two system prompts (prefix miss, vision hit) and
    image B once, the vision entries are A (1 hit) and B (0 hits), the prefix entries carry
    their image's hash prefix, and counts and bytes equal /v1/cache/stats."""
    httpx.post(server.base_url + "/v1/cache/clear", timeout=10)
    a, b = noise_png(31), noise_png(32, 84, 56)
    _ask(server, a, "You are terse.")
    _ask(server, a, "You are verbose and kind.")
    _ask(server, b, "You are terse.")
    report = httpx.get(server.base_url + "/v1/cache/entries?limit=100", timeout=10).json()
    stats = httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()
    assert report["counts"] == {k: stats[k]["entries"] for k in ("vision", "prefix")}
    assert report["bytes"] == {k: stats[k]["bytes"] for k in ("vision", "prefix")}
    ha, hb = _hash(a)[:HASH_PREFIX_CHARS], _hash(b)[:HASH_PREFIX_CHARS]
    vision = {e["hash"]: e for e in report["largest"] if e["kind"] == "vision"}
    assert set(vision) == {ha, hb}
    assert (vision[ha]["hits"], vision[hb]["hits"]) == (1, 0)
    assert vision[ha]["bytes"] < vision[hb]["bytes"]  # B is 84x56, A 56x56
    prefix = [e for e in report["largest"] if e["kind"] == "prefix"]
    assert sorted(e["hash"] for e in prefix) == sorted([ha, ha, hb])
    assert all(e["age_s"] >= 0 and e["tokens"] > 0 for e in report["largest"])
    assert report["largest"][0]["bytes"] == max(e["bytes"] for e in report["largest"])
    top = httpx.get(server.base_url + "/v1/cache/entries?limit=1&kind=vision", timeout=10)
    assert [e["hash"] for e in top.json()["most_hit"]] == [ha]


@pytest.mark.parametrize(
    "query, param",
    [("limit=0", "limit"), ("limit=abc", "limit"), ("limit=101", "limit"), ("kind=kv", "kind")],
)
def test_entries_refuse_bad_parameters(server: ServerProcess, query: str, param: str) -> None:
    """Invariant: a bad `limit` or `kind` is a 400 OpenAI error naming the parameter."""
    r = httpx.get(f"{server.base_url}/v1/cache/entries?{query}", timeout=10)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == param


def test_dashboard_numbers_move_with_traffic(server: ServerProcess) -> None:
    """Invariant: /v1/dashboard's cache counters, TTFT count and history grow after a request
    (sampled at most about once a second: a second poll within that reuses the sample)."""
    # A fresh sample first: an earlier test may have taken one within the second, before its
    # own traffic.
    stale = _dashboard(server)["samples"]
    before = _next_sample(server, stale)
    _ask(server, noise_png(33), "Describe it.")
    after = _next_sample(server, before["samples"])
    assert after["model"] == "test"
    assert after["caches"]["vision"]["queries"] == before["caches"]["vision"]["queries"] + 1
    assert after["ttft"]["count"] >= 1
    assert after["samples"] == before["samples"] + 1
    assert len(after["series"]["t"]) == len(after["series"]["vision_hit_rate"])
    assert after["tokens_per_s"] is None or after["tokens_per_s"] >= 0
    again = _dashboard(server)
    assert again["samples"] == after["samples"]


def _dashboard(server: ServerProcess) -> dict:
    return httpx.get(server.base_url + "/v1/dashboard", timeout=10).json()


def _next_sample(server: ServerProcess, samples: int) -> dict:
    """The dashboard once it has taken a sample after the one that made `samples` (asking
    meanwhile reuses the latest sample)."""
    return wait_until(
        lambda: (d := _dashboard(server))["samples"] > samples and d,
        10,
        message=f"the dashboard took no sample after its #{samples}",
    )


def test_api_key_guards_the_json_endpoints_not_the_pages() -> None:
    """Invariant: with --api-key, /v1/cache/entries and /v1/dashboard answer 401 without the
    key and 200 with it; the pages (which carry no data) load without it."""
    server = ServerProcess("--api-key", "sesame", "--no-warmup")
    try:
        for path in ("/v1/cache/entries", "/v1/dashboard"):
            assert httpx.get(server.base_url + path, timeout=10).status_code == 401
            ok = httpx.get(
                server.base_url + path, headers={"Authorization": "Bearer sesame"}, timeout=10
            )
            assert ok.status_code == 200
        for path in ("/", "/dashboard", "/static/playground.js"):
            assert httpx.get(server.base_url + path, timeout=10).status_code == 200
    finally:
        assert server.stop(), server.log()


def test_static_files_ship_as_package_data() -> None:
    """Invariant: the pages' files are under gateway/static, all matched by the package-data
    pattern, so a non-editable install (a wheel) serves the same pages."""
    pyproject = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    section = pyproject.split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    assert re.search(r'^gateway = \["static/\*"\]', section, re.M)
    present = {p.name for p in STATIC.iterdir()}
    assert {"playground.html", "dashboard.html", "common.js", "style.css"} <= present
    assert all(p.is_file() for p in STATIC.iterdir())  # "static/*" takes no subfolders
