"""What the hostile tests share: the `hostile` server's keys and limits, request bodies, the
table's `Case`, the OpenAI error shape, and probes of a server's load over HTTP.

Nothing here starts a server (conftest.py does); every helper talks to 127.0.0.1 only.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import Any

import httpx
from support import ServerProcess, noise_png, wait_until

KEY = "sk-hardening-key"
METRICS_KEY = "sk-hardening-metrics-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
BODY_CAP = 2 * 1024 * 1024
MIB = 1024 * 1024
IMAGE_PARAM = "messages[0].content[0].image_url.url"

PNG = noise_png(0, 28, 28)
TINY_PNG = noise_png(1, 1, 1)
DROP = object()  # a field value meaning "leave the field out"


# ----- request bodies -----------------------------------------------------------------------


def json_paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into a JSON value (keys and list indexes), the value's own `()` first: the
    places a property test may drop or replace something."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += json_paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += json_paths(v, (*prefix, i))
    return out


def chat(**fields: Any) -> dict[str, Any]:
    """A valid text body with `fields` set; a field set to DROP is removed."""
    body: dict[str, Any] = {
        "model": "test",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    }
    body.update(fields)
    return {k: v for k, v in body.items() if v is not DROP}


def msgs(*messages: Any, **fields: Any) -> dict[str, Any]:
    return chat(messages=list(messages), **fields)


def user(content: Any, **fields: Any) -> dict[str, Any]:
    return msgs({"role": "user", "content": content}, **fields)


def image(url: Any, count: int = 1) -> dict[str, Any]:
    parts: list[Any] = [{"type": "image_url", "image_url": {"url": url}}] * count
    return user([*parts, {"type": "text", "text": "What is this?"}])


@dataclass(frozen=True)
class Case:
    """One hostile request and the answer it must get.

    `body`: a JSON-able value (serialised with json.dumps, NaN allowed) or raw bytes. Strings
    in it may hold {media}, {outside}, {images} and {images_port} placeholders. `headers`
    replace the default (the API key). `status` may be a tuple where the bug's fix may
    reasonably land on either status.
    """

    body: Any = None
    status: int | tuple[int, ...] = 400
    code: str | None = None
    param: str | None = None
    headers: dict[str, Any] | None = None
    method: str = "POST"
    path: str = CHAT
    chunked: bool = False


# ----- answers and server state -------------------------------------------------------------


def assert_error_object(r: httpx.Response) -> dict[str, Any]:
    """The OpenAI error shape: {"error": {"message": non-empty str, "type": str, "param",
    "code"}} with a JSON content type."""
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert {"message", "type", "param", "code"} <= set(error), error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert isinstance(error["type"], str) and error["type"], error
    assert error["param"] is None or isinstance(error["param"], str), error
    assert error["code"] is None or isinstance(error["code"], str), error
    return error


def raw_request(port: int, head: str, body: bytes = b"") -> socket.socket:
    """Send `head` (lines joined by a bare \\n, turned into CRLF here; the blank line is
    added) and `body` on a new connection; the caller owns (and closes) the socket."""
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    return sock


def health(server: ServerProcess) -> dict[str, Any]:
    """The server's /health answer (open: no key needed)."""
    return httpx.get(server.base_url + "/health", timeout=10).json()


def wait_idle(server: ServerProcess, timeout: float) -> None:
    """Wait until /health says running == waiting == 0; fail with its last answer after
    `timeout` seconds."""

    def idle() -> bool:
        now = health(server)
        return now["running"] == 0 and now["waiting"] == 0

    wait_until(idle, timeout, 0.1, lambda: f"the server did not go idle: {health(server)}")
