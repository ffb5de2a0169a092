"""Requests written byte by byte on a socket to the shared `hostile` server: what an HTTP
client library would not send.

Pinned invariants: a body over --max-body-bytes is a 413 as soon as its Content-Length says
so (the server does not wait for bytes that never come); a malformed Content-Length is a 400;
a body that never ends holds only its own request; a client hanging up mid-upload is not
logged as a server error.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest
from support import ServerProcess, wait_until

from tests.gateway.hostile.server import AUTH, CHAT, KEY, METRICS_KEY, MIB, chat, raw_request


def _read_response(sock: socket.socket, timeout: float = 30.0) -> tuple[int, bytes]:
    """Status and body of one HTTP/1.1 response with a Content-Length (or closed)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    length = None
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    while length is not None and len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, body


def _head(length: int | str, extra: str = "") -> str:
    return (
        f"POST {CHAT} HTTP/1.1\nHost: 127.0.0.1\nAuthorization: Bearer {KEY}\n"
        f"Content-Type: application/json\nContent-Length: {length}\n{extra}"
    )


def test_lying_content_length_over_the_cap_is_refused_before_the_body(
    hostile: ServerProcess,
) -> None:
    """Invariant: a Content-Length over --max-body-bytes is a 413 error object at once, even
    though the client never sends that many bytes (the server does not wait for them)."""
    sock = raw_request(hostile.port, _head(3 * MIB), b"{}")
    try:
        started = time.monotonic()
        status, body = _read_response(sock, timeout=10)
        assert time.monotonic() - started < 5
    finally:
        sock.close()
    assert status == 413
    error = json.loads(body)["error"]
    assert error["code"] == "too_large" and "--max-body-bytes" in error["message"]


@pytest.mark.parametrize("length", ["abc", "-1", "1, 2"])
def test_unparseable_content_length_is_a_400(hostile: ServerProcess, length: str) -> None:
    """Invariant: a malformed Content-Length is refused with a 400 and the connection closed.
    (uvicorn answers these before the app runs, so the body is not an OpenAI object.)"""
    sock = raw_request(hostile.port, _head(length), b"{}")
    try:
        status, _ = _read_response(sock, timeout=10)
    finally:
        sock.close()
    assert status == 400


def test_body_that_never_ends_does_not_block_other_requests(
    hostile: ServerProcess, client: httpx.Client
) -> None:
    """Invariant: a client that announces 1 MB and sends 8 bytes holds only its own request;
    /health and a completion are answered meanwhile."""
    stalled = raw_request(hostile.port, _head(1_000_000), b'{"model"')
    try:
        _wait_body_bytes(hostile, 1_000_000)  # it is being read
        started = time.monotonic()
        assert httpx.get(hostile.base_url + "/health", timeout=10).status_code == 200
        r = client.post(CHAT, json=chat(), headers=AUTH, timeout=30)
        assert r.status_code == 200, r.text
        assert time.monotonic() - started < 10
    finally:
        stalled.close()


def test_client_leaving_mid_body_is_not_logged_as_a_server_error(
    hostile: ServerProcess,
) -> None:
    """Invariant: a client hanging up during its upload is not an internal server error."""
    offset = hostile.log_path.stat().st_size
    sock = raw_request(hostile.port, _head(1_000_000), b'{"model"')
    _wait_body_bytes(hostile, 1_000_000)  # the upload is being read
    sock.close()
    # The server gives the body budget back only once it has handled the disconnect, so the
    # log below is read after the handling (not merely before it happened).
    _wait_body_bytes(hostile, 0)  # the disconnect was handled
    with open(hostile.log_path, "rb") as f:
        f.seek(offset)
        new = f.read().decode(errors="replace")
    assert "ClientDisconnect" not in new and "unhandled error" not in new, new[-2000:]
    assert "Traceback" not in new, new[-2000:]


def _body_bytes(server: ServerProcess) -> float:
    """Bytes of request bodies the server is reading now (its body-budget gauge)."""
    metrics = server.metrics({"Authorization": f"Bearer {METRICS_KEY}"})
    return metrics["vision_gateway_request_body_bytes_reading"]


def _wait_body_bytes(server: ServerProcess, expected: int, timeout: float = 30.0) -> None:
    """Wait until the server's body-budget gauge reads `expected` bytes."""
    wait_until(
        lambda: _body_bytes(server) == expected,
        timeout,
        message=lambda: f"body bytes being read: {_body_bytes(server)}, not {expected}",
    )
