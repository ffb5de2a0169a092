"""SIGTERM against a real `vision-gateway serve` subprocess on 127.0.0.1.

Pinned invariants:
- a stream running when SIGTERM arrives still completes (finish_reason, usage, [DONE]) within
  --shutdown-grace, new connections are refused meanwhile, and the process exits cleanly
  (status 0 and 'Application shutdown complete' in the log, as LocalServer.stop checks;
  tests/gateway/test_server.py pins status 0 for SIGINT and SIGTERM to the process group);
- a request that outlives the grace period does not keep the process alive: it exits soon
  after the grace period, cleanly, and the client's connection is closed;
- a stream still running when the grace period ends gets an SSE error event (503
  "unavailable", saying the answer is incomplete) and [DONE] before its connection closes, and
  the log says so in one line, without a traceback;
- --shutdown-grace 0 means "do not wait".
"""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import threading
import time

import httpx
from support import ServerProcess, wait_until

CHAT = "/v1/chat/completions"


class RawStream:
    """A streaming chat request over a raw socket, read by a background thread."""

    def __init__(self, port: int, max_tokens: int) -> None:
        body = json.dumps(
            {
                "model": "test",
                "messages": [{"role": "user", "content": "Tell me a very long story."}],
                "max_tokens": max_tokens,
                "temperature": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        ).encode()
        head = (
            f"POST {CHAT} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=60)
        self.sock.sendall(head + body)
        self.data = bytearray()
        self.done_at: float | None = None  # when "data: [DONE]" arrived
        self.ended = threading.Event()  # the server closed the connection (or it broke)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            while True:
                chunk = self.sock.recv(65536)
                if not chunk:
                    break
                self.data += chunk
                if self.done_at is None and b"data: [DONE]" in self.data:
                    self.done_at = time.monotonic()
                if self.data.endswith(b"\r\n0\r\n\r\n"):
                    break  # the chunked body is complete
        except OSError:
            pass
        finally:
            self.ended.set()

    def events(self) -> int:
        return bytes(self.data).count(b"data: ")

    def wait_events(self, count: int, timeout: float) -> None:
        """Fail unless `count` SSE events arrive within `timeout` (or before the stream ends)."""
        wait_until(
            lambda: self.events() >= count or self.ended.is_set(),
            timeout,
            interval=0.01,
            message=lambda: f"{self.events()} of {count} events arrived: {self.tail()!r}",
        )
        assert self.events() >= count, f"the stream ended at {self.events()}: {self.tail()!r}"

    def tail(self) -> bytes:
        return bytes(self.data)[-500:]

    def close(self) -> None:
        self.sock.close()
        self._thread.join(10)


def _exited_within(proc: subprocess.Popen, timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _new_request_outcome(server: ServerProcess) -> str:
    """'refused' (connection refused, or reset: a connection the kernel accepted into the
    backlog just before uvicorn closed its listening socket is reset, not answered), '503'
    (error object), or 'served' (the request slipped in before shutdown began)."""
    try:
        r = httpx.post(
            server.base_url + CHAT,
            json={
                "model": "test",
                "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 1,
            },
            timeout=10,
        )
    except (httpx.ConnectError, httpx.ReadError, httpx.RemoteProtocolError):
        return "refused"
    if r.status_code == 503:
        assert r.json()["error"]["message"], r.text
        return "503"
    assert r.status_code == 200, r.text
    return "served"


def test_sigterm_lets_a_running_stream_finish_and_refuses_new_requests() -> None:
    """Invariant: after SIGTERM a running stream still completes (finish_reason, usage, [DONE])
    within --shutdown-grace 20, a new request is refused while it runs, and the process exits
    cleanly soon after the stream ends."""
    server = ServerProcess("--shutdown-grace", "20")
    stream = None
    try:
        stream = RawStream(server.port, 500)
        stream.wait_events(3, 30)
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        outcomes: list[str] = []

        def new_request_refused() -> float | None:
            """When a new request was refused (None while they are still served)."""
            outcomes.append(_new_request_outcome(server))
            return time.monotonic() if outcomes[-1] != "served" else None

        refused_at = wait_until(
            new_request_refused,
            5,
            interval=0,  # ask again at once: the refusal must come before the stream ends
            message=lambda: f"all {len(outcomes)} new requests after SIGTERM were served",
        )
        assert outcomes[-1] in ("refused", "503")
        assert stream.ended.wait(25), "the stream did not finish within the grace period"
        data = bytes(stream.data)
        assert stream.done_at is not None, data[-800:]
        assert refused_at is not None and refused_at < stream.done_at, "refusal came too late"
        assert b'"finish_reason":"length"' in data, data[-800:]
        usage = re.findall(rb'"completion_tokens":(\d+)', data)
        assert usage == [b"500"], data[-800:]
        assert b'"error"' not in data
        assert _exited_within(server.proc, 25), server.log()
        assert server.proc.returncode == 0, server.log()
        assert time.monotonic() - sent < 20 + 5
    finally:
        if stream is not None:
            stream.close()
        clean = server.stop()
    assert clean, server.log()


def test_grace_expiry_bounds_shutdown_time() -> None:
    """Invariant: a request that would outlive --shutdown-grace 1 (20000 tokens) does not keep
    the process alive: it exits cleanly within a few seconds of the grace period and the
    client's connection is closed rather than left hanging."""
    server = ServerProcess("--shutdown-grace", "1")
    stream = None
    try:
        stream = RawStream(server.port, 20_000)
        stream.wait_events(3, 30)
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        assert _exited_within(server.proc, 15), server.log()
        assert time.monotonic() - sent < 1 + 8
        assert stream.ended.wait(5), "the client's connection was left open"
        # Cut short (20000 tokens cannot have been generated), but with an error event:
        events = [e for e in bytes(stream.data).split(b"\n\n") if b"data: " in e]
        assert events[-1].endswith(b"data: [DONE]"), events[-2:]
        error = json.loads(events[-2].split(b"data: ", 1)[1])["error"]
        assert error["code"] == "unavailable" and "incomplete" in error["message"], error
        assert b'"finish_reason":"length"' not in bytes(stream.data)
    finally:
        if stream is not None:
            stream.close()
        clean = server.stop()
    assert clean, server.log()
    log = server.log(200_000)
    assert "Traceback" not in log, log[-3000:]
    assert log.count("shutdown: ended 1 running request(s) with an error event") == 1, log[-3000:]


def test_zero_grace_does_not_wait_for_running_requests() -> None:
    """Invariant: with --shutdown-grace 0 SIGTERM does not wait for a running request: the
    process exits within a few seconds."""
    server = ServerProcess("--shutdown-grace", "0")
    stream = None
    try:
        stream = RawStream(server.port, 20_000)
        stream.wait_events(3, 30)
        server.proc.send_signal(signal.SIGTERM)
        assert _exited_within(server.proc, 5), "still running 5 s after SIGTERM"
    finally:
        if stream is not None:
            stream.close()  # under the bug, this is what finally lets the server exit
        server.stop()
