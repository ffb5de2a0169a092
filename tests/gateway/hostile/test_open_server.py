"""The open server (private URLs allowed, no media dir): image URLs that never answer and
clients that go away, against its own `vision-gateway serve` subprocess (started once for this
module).

Pinned invariants: without --allowed-media-dir every local path is refused; an image URL that
never answers fails with a 400 after the read timeout without blocking other requests;
clients that go away (mid-stream, while queued, or by a client-side timeout) free their engine
rows: /health and /metrics return to zero running and zero waiting.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from support import ServerProcess, wait_until

from tests.gateway.hostile.server import (
    CHAT,
    IMAGE_PARAM,
    assert_error_object,
    chat,
    health,
    image,
    raw_request,
    wait_idle,
)


@pytest.fixture(scope="module")
def open_server() -> Iterator[ServerProcess]:
    """Private URLs allowed (so a local never-answering URL can be fetched), no media dir."""
    proc = ServerProcess("--allow-private-urls", "--max-batch", "16")
    yield proc
    assert proc.stop(), proc.log()


def _load(server: ServerProcess) -> dict[str, int]:
    now = health(server)
    return {"running": now["running"], "waiting": now["waiting"]}


def _cancelled(server: ServerProcess) -> float:
    return server.metrics().get('vision_gateway_requests_total{status="cancelled"}', 0.0)


@dataclass
class StalledFetch:
    url: str
    thread: threading.Thread
    result: dict[str, Any]
    listener: socket.socket  # accept() returns once the server has connected to the URL


@pytest.fixture(scope="module")
def stalled_fetch(open_server: ServerProcess) -> Iterator[StalledFetch]:
    """A chat request whose image URL points at a socket that accepts (in the kernel backlog)
    and never answers, running in a background thread from the first test that uses it."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/never.png"
    result: dict[str, Any] = {}

    def run() -> None:
        started = time.monotonic()
        try:
            result["response"] = httpx.post(
                open_server.base_url + CHAT, json=image(url), timeout=60
            )
        except httpx.HTTPError as exc:
            result["error"] = exc
        result["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield StalledFetch(url, thread, result, listener)
    thread.join(60)
    listener.close()


def test_path_refused_when_no_media_dir_is_allowed(
    open_server: ServerProcess, media: dict[str, str]
) -> None:
    """Invariant: without --allowed-media-dir every local path is a 400 naming the flag, even
    for a real image file, as a path or a file:// URL."""
    for ref in (f"{media['media']}/a.png", Path(media["media"], "a.png").as_uri()):
        r = httpx.post(open_server.base_url + CHAT, json=image(ref), timeout=30)
        assert r.status_code == 400, r.text
        error = assert_error_object(r)
        assert error["code"] == "image_path_forbidden" and error["param"] == IMAGE_PARAM
        assert "--allowed-media-dir" in error["message"]


def test_hanging_image_url_does_not_block_other_requests(
    open_server: ServerProcess, stalled_fetch: StalledFetch
) -> None:
    """Invariant: while one request waits on an image URL that never answers, /health and
    other completions are served."""
    stalled_fetch.listener.settimeout(30)
    connection, _ = stalled_fetch.listener.accept()  # the fetch is under way (and never answered)
    assert stalled_fetch.thread.is_alive(), stalled_fetch.result
    started = time.monotonic()
    assert health(open_server)["status"] == "ok"
    r = httpx.post(open_server.base_url + CHAT, json=chat(), timeout=30)
    assert r.status_code == 200, r.text
    assert time.monotonic() - started < 10
    assert stalled_fetch.thread.is_alive(), "the hanging fetch ended too early"
    stalled_fetch.result["connection"] = connection  # kept open (unanswered) until the fixture ends


def _stream_socket(port: int, max_tokens: int) -> socket.socket:
    body = json.dumps(
        chat(max_tokens=max_tokens, temperature=0, stream=True)
        | {"messages": [{"role": "user", "content": "Tell me a very long story."}]}
    ).encode()
    head = (
        f"POST {CHAT} HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\n"
        f"Content-Length: {len(body)}\n"
    )
    return raw_request(port, head, body)


def _read_data_events(sock: socket.socket, count: int, timeout: float) -> bool:
    """Read until `count` SSE `data:` events arrived (bounded)."""
    deadline = time.monotonic() + timeout
    seen = b""
    while seen.count(b"data: ") < count:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            return False
        if not chunk:
            return False
        seen += chunk
    return True


def test_twenty_clients_leaving_mid_stream_free_every_row(open_server: ServerProcess) -> None:
    """Invariant: 16 clients that hang up mid-stream and 4 that hang up while queued for a
    row (--max-batch 16) are all cancelled: /health and /metrics return to 0 running and 0
    waiting, and the cancelled-request counter grows by exactly 20."""
    wait_idle(open_server, 30)
    before = _cancelled(open_server)
    socks: list[socket.socket] = []
    try:
        for _ in range(16):
            sock = _stream_socket(open_server.port, 1000)
            socks.append(sock)
            assert _read_data_events(sock, 2, 30), "a stream did not start"
        for _ in range(4):
            socks.append(_stream_socket(open_server.port, 1000))
        busy = {"running": 16, "waiting": 4}
        wait_until(lambda: _load(open_server) == busy, 10, message=lambda: health(open_server))
    finally:
        for sock in socks:
            sock.close()
    wait_idle(open_server, 30)
    metrics = open_server.metrics()
    assert metrics["vision_gateway_running_requests"] == 0
    assert metrics["vision_gateway_waiting_requests"] == 0
    assert _cancelled(open_server) - before == 20


def test_non_streaming_clients_that_time_out_free_their_rows(open_server: ServerProcess) -> None:
    """Invariant: non-streaming clients whose read timeout fires before the answer are
    cancelled server-side: running returns to 0 (counter +5), long before the 1000 tokens
    they asked for could have been generated."""
    wait_idle(open_server, 30)
    before = _cancelled(open_server)
    outcomes: list[str] = []
    body = chat(max_tokens=1000, temperature=0) | {
        "messages": [{"role": "user", "content": "Tell me a very long story."}]
    }

    def impatient() -> None:
        try:
            httpx.post(open_server.base_url + CHAT, json=body, timeout=httpx.Timeout(10, read=0.5))
            outcomes.append("answered")
        except httpx.ReadTimeout:
            outcomes.append("timeout")

    threads = [threading.Thread(target=impatient) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert outcomes == ["timeout"] * 5
    wait_idle(open_server, 30)
    assert open_server.metrics()["vision_gateway_running_requests"] == 0
    assert _cancelled(open_server) - before == 5


def test_hanging_image_url_times_out_with_a_400(stalled_fetch: StalledFetch) -> None:
    """Invariant: an image URL that accepts the connection and never answers ends in a 400
    image_fetch_timeout after the read timeout (15 s), not a hang or a 5xx."""
    stalled_fetch.thread.join(45)
    assert not stalled_fetch.thread.is_alive()
    response = stalled_fetch.result.get("response")
    assert response is not None, stalled_fetch.result
    assert response.status_code == 400, response.text
    error = assert_error_object(response)
    assert error["code"] == "image_fetch_timeout" and error["param"] == IMAGE_PARAM
    assert stalled_fetch.result["seconds"] < 30
