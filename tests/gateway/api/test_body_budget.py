"""Request size, aligned with the OpenAI API: a body over --max-body-bytes (default 50 MB) is a
413 before it is read; bodies being read at once share --max-inflight-body-mb, and a request
that would pass it gets a 429 with Retry-After (an error object of its own API) instead of
memory; the budget is given back when a body is done or its client leaves."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from support import ServerProcess, wait_until

from gateway.api.body_budget import BodyBudget
from gateway.config import MIB, ConfigError, ServerConfig
from gateway.errors import APIError

CAP = 600_000


def test_budget_accounting_and_refusal() -> None:
    """Invariant: reservations add up, a reservation that does not fit is a 429 that leaves
    the reserved total unchanged, and releases give the bytes back."""
    budget = BodyBudget(1000)
    budget.reserve(600)
    with pytest.raises(APIError) as info:
        budget.reserve(401)
    assert (info.value.status, info.value.headers) == (429, {"Retry-After": "1"})
    assert "--max-inflight-body-mb" in info.value.message and budget.reserved == 600
    budget.reserve(400)
    budget.release(600)
    budget.release(400)
    assert budget.reserved == 0


def test_defaults_follow_the_openai_limit() -> None:
    config = ServerConfig()
    assert config.max_body_bytes == 50_000_000 and config.max_inflight_body_mb == 256
    with pytest.raises(ConfigError):
        ServerConfig(max_body_bytes=10 * MIB, max_inflight_body_mb=1)


def _raw(port: int, path: str, length: int, body: bytes = b"", key: str = "") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    head = (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        f"Content-Length: {length}\r\n\r\n"
    )
    sock.sendall(head.encode() + body)
    return sock


def _status(sock: socket.socket, timeout: float = 10.0) -> tuple[int, bytes]:
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), rest


def test_a_50_mib_body_is_refused_before_it_is_read() -> None:
    """Invariant: with default limits, a body announcing 50 MiB is a 413 at once although
    none of it was sent."""
    proc = ServerProcess("--no-warmup")
    try:
        sock = _raw(proc.port, "/v1/chat/completions", 50 * MIB, b"{")
        started = time.monotonic()
        status, _ = _status(sock)
        sock.close()
        assert status == 413 and time.monotonic() - started < 5
    finally:
        assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def tight() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--no-warmup", "--max-body-bytes", str(CAP), "--max-inflight-body-mb", "1"
    )  # fmt: skip
    yield proc
    assert proc.stop(), proc.log()


def _reading(proc: ServerProcess) -> float:
    return proc.metrics().get("vision_gateway_request_body_bytes_reading", -1.0)


@pytest.mark.parametrize(
    ("path", "error"),
    [
        ("/v1/chat/completions", lambda b: b["error"]["code"] == "body_budget_exhausted"),
        ("/v1/messages", lambda b: b["error"]["type"] == "rate_limit_error"),
    ],
)
def test_bodies_read_at_once_share_the_budget(
    tight: ServerProcess, path: str, error: Callable[[dict], bool]
) -> None:
    """Invariant: while one slow upload holds 600 kB of the 1 MiB budget, another 600 kB
    body is a 429 with Retry-After, a small one still goes through, and once the slow client
    leaves the budget is whole again."""
    slow = _raw(tight.port, path, CAP, b'{"model": "test", "pad": "')
    try:
        wait_until(  # the server is reading the slow body
            lambda: _reading(tight) == CAP,
            30,
            interval=0.02,
            message=lambda: f"body bytes being read: {_reading(tight)}, not {CAP}",
        )
        big = b'{"model": "test", "pad": "' + b"x" * (CAP - 40) + b'"}'
        r = httpx.post(tight.base_url + path, content=big, timeout=30)
        assert r.status_code == 429 and r.headers["retry-after"] == "1", r.text
        assert error(r.json())
        small = httpx.post(tight.base_url + path, json={"model": "test"}, timeout=30)
        assert small.status_code == 400  # read and parsed: refused for its content, not size
    finally:
        slow.close()
    wait_until(  # the slow client left: its share of the budget was given back
        lambda: _reading(tight) == 0,
        30,
        interval=0.02,
        message=lambda: f"body bytes still being read: {_reading(tight)}",
    )
    r = httpx.post(tight.base_url + path, content=big, timeout=30)
    assert r.status_code == 400, r.text  # now read whole (and refused for missing messages)
    assert json.loads(r.text)
    assert tight.metrics()["vision_gateway_request_body_budget_refusals_total"] >= 1
