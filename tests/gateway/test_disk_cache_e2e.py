"""The disk tier end to end: real `vision-gateway serve` processes on 127.0.0.1, the `openai`
SDK, SIGTERM between them.

Pinned: a question about an image asked of a fresh server, then (after SIGTERM and a new
start on the same --cache-dir) asked again, gets the same answer (every token's bytes, its
logprob and its top-5 alternatives) from disk, as the x-cache header, /v1/cache/stats and
/metrics all say; two servers running at once on one folder (one after its warm-up) both
serve from it and write to it, and leave only intact files.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from support import ServerProcess, data_uri, noise_png, wait_until

from caches.disk import FORMAT_DIR
from caches.disk_format import decode

QUESTION = "Describe the picture."


def _x_cache(headers: object) -> dict[str, int]:
    fields = dict(item.strip().split("=") for item in headers["x-cache"].split(";"))  # type: ignore[index]
    return {k: int(v) for k, v in fields.items()}


def _ask(server: ServerProcess, seed: int = 5):  # noqa: ANN202
    """(x-cache fields, [(token bytes, logprob, top-5 [(bytes, logprob)])])"""
    image = {"type": "image_url", "image_url": {"url": data_uri(noise_png(seed, 84, 56))}}
    raw = server.client().chat.completions.with_raw_response.create(
        model="test",
        messages=[{"role": "user", "content": [image, {"type": "text", "text": QUESTION}]}],
        max_tokens=8,
        temperature=0,
        logprobs=True,
        top_logprobs=5,
    )
    answer = raw.parse()
    tokens = [
        (t.bytes, t.logprob, [(a.bytes, a.logprob) for a in t.top_logprobs])
        for t in answer.choices[0].logprobs.content
    ]
    return _x_cache(raw.headers), tokens


def _disk_stats(server: ServerProcess) -> dict:
    return httpx.get(server.base_url + "/v1/cache/stats", timeout=10).json()["disk"]


def _written(server: ServerProcess, before: int, timeout: float = 30.0) -> int:
    """Wait until the server has written more KV files than `before` and has nothing queued
    (writes are in the background: a response can arrive before its entry is on disk)."""

    def writes() -> int | None:
        disk = _disk_stats(server)
        done = disk["prefix"]["writes"] > before and disk["pending_bytes"] == 0
        return disk["prefix"]["writes"] if done else None

    return wait_until(writes, timeout, message=lambda: f"nothing written: {_disk_stats(server)}")


def _server(folder: Path, *extra: str) -> ServerProcess:
    return ServerProcess("--cache-dir", str(folder), "--kv-block-tokens", "8", *extra)


def test_an_answer_survives_a_restart_exactly_and_is_served_from_disk(tmp_path: Path) -> None:
    """Invariant: after SIGTERM and a restart on the same --cache-dir, the repeat is served
    from disk (x-cache, stats and metrics agree) and equals the uncached first answer."""
    first = _server(tmp_path, "--no-warmup")
    try:
        cold_cache, cold = _ask(first)
    finally:
        assert first.stop(), first.log()
    assert cold_cache["disk-cached-tokens"] == 0 and cold_cache["vision-misses"] == 1

    second = _server(tmp_path, "--no-warmup")
    try:
        warm_cache, warm = _ask(second)
        stats = httpx.get(second.base_url + "/v1/cache/stats", timeout=10).json()
        metrics = second.metrics()
    finally:
        assert second.stop(), second.log()
    assert warm == cold  # same tokens, logprobs and alternatives, bit for bit
    assert warm_cache["disk-cached-tokens"] > 0
    assert warm_cache["cached-tokens"] == warm_cache["disk-cached-tokens"]
    disk = stats["disk"]
    assert disk["enabled"] and disk["prefix"]["tokens_hit"] == warm_cache["disk-cached-tokens"]
    assert disk["prefix"]["corrupt"] == 0 and disk["entries"] > 0
    assert metrics["vision_gateway_disk_cache_prefix_hits_total"] == disk["prefix"]["tokens_hit"]
    assert metrics['vision_gateway_disk_cache_file_reads_total{cache="prefix"}'] > 0
    # The file reads ran on the reader thread; the engine thread only copied into MLX.
    read_s = metrics['vision_gateway_disk_cache_read_seconds_total{cache="prefix"}']
    assert read_s == disk["prefix"]["read_seconds"] > 0 and disk["prefix"]["load_seconds"] > 0
    assert metrics["vision_gateway_disk_cache_read_held_bytes"] == disk["read_held_bytes"] == 0
    assert stats["prefix"]["hits"] == 0  # the memory tier did not have it: reported apart


def test_two_servers_share_one_folder(tmp_path: Path) -> None:
    """Invariant: two servers on one folder at once (one warmed up first: the warm-up writes
    nothing) both serve an image the other wrote from disk, write their own, and every file
    in the folder is intact afterwards."""
    first = _server(tmp_path, "--no-warmup")
    try:
        _ask(first, seed=1)
    finally:
        assert first.stop(), first.log()
    servers = [_server(tmp_path, "--no-warmup"), _server(tmp_path, "--warmup-image-size", "56")]
    try:
        with ThreadPoolExecutor(2) as pool:
            shared = list(pool.map(lambda s: _ask(s, seed=1), servers))
            before = [_disk_stats(s)["prefix"]["writes"] for s in servers]
            own = list(pool.map(lambda a: _ask(a[1], seed=10 + a[0]), enumerate(servers)))
            for server, count in zip(servers, before, strict=True):
                _written(server, count)
            crossed = list(pool.map(lambda a: _ask(a[1], seed=11 - a[0]), enumerate(servers)))
    finally:
        for s in servers:
            assert s.stop(), s.log()
    assert shared[0][1] == shared[1][1]
    assert all(cache["disk-cached-tokens"] > 0 for cache, _ in shared)
    assert all(cache["disk-cached-tokens"] == 0 for cache, _ in own)
    # Each asks the other's image: written by the other process, read from disk here.
    assert all(cache["disk-cached-tokens"] > 0 for cache, _ in crossed)
    assert crossed[0][1] == own[1][1] and crossed[1][1] == own[0][1]
    files = list((tmp_path / FORMAT_DIR).rglob("*"))
    entries = [p for p in files if p.suffix == ".safetensors"]
    assert len(entries) >= 6 and not [p for p in files if p.name.startswith(".tmp-")]
    for path in entries:
        assert decode(path.read_bytes())[1]["key"] + ".safetensors" == path.name
