"""Hostile clients against `/v1/messages` and `/v1/messages/count_tokens` on a real server.

Pinned: every hostile request (bad bodies, bad blocks, wrong media types, bad base64, pixel
bombs, SSRF URLs, bad keys, oversized bodies) gets its exact 4xx status and an Anthropic error
object (`{"type": "error", "error": {"type", "message"}}`), arbitrary JSON bodies never get a
5xx, and the server keeps serving.
"""

from __future__ import annotations

import base64
import copy
import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ServerProcess, noise_png, png_claiming

KEY = "sk-anthropic-hostile"
AUTH = {"x-api-key": KEY}
MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
BODY_CAP = 1024 * 1024


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _image(data: str, media_type: str = "image/png") -> dict:
    return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}


def _url(url: str) -> dict:
    return {"type": "image", "source": {"type": "url", "url": url}}


def body(*blocks: Any, **fields: Any) -> dict[str, Any]:
    content = list(blocks) if blocks else "hi"
    return {"model": "test", "max_tokens": 3, "messages": [{"role": "user", "content": content}],
            **fields}  # fmt: skip


PNG = _b64(noise_png(0, 28, 28))
VALID = [
    body(),
    body(_image(PNG), {"type": "text", "text": "what?"}, system="terse", stop_sequences=["x"]),
    body(_image(PNG), stream=True, temperature=0.5, top_k=3, top_p=0.9),
]

CASES = [
    # (path, body or raw bytes, headers, status, error type)
    (MESSAGES, body(), {}, 401, "authentication_error"),
    (MESSAGES, body(), {"x-api-key": "wrong"}, 401, "authentication_error"),
    (MESSAGES, b"{not json", AUTH, 400, "invalid_request_error"),
    (MESSAGES, b"[]", AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(model="claude-3"), AUTH, 404, "not_found_error"),
    (MESSAGES, {**body(), "max_tokens": None}, AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(max_tokens=10**9), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_image(PNG, "image/tiff")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_image("!!!not base64!!!")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_image(_b64(b"not an image"))), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_image("")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_image(_b64(png_claiming(50_000, 50_000)))), AUTH, 413, "request_too_large"),
    (MESSAGES, body(_url("http://127.0.0.1:1/a.png")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_url("http://169.254.169.254/latest")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_url("http://[::1]/a.png")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_url("http://2130706433/a.png")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_url("file:///etc/passwd")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_url("/etc/passwd")), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(*[_image(PNG)] * 5), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(_image(_b64(noise_png(3, 1, 3000)))), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body({"type": "document", "source": {}}), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(tools=[{"name": "f"}]), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body(thinking={"type": "enabled"}), AUTH, 400, "invalid_request_error"),
    (MESSAGES, body({"type": "text", "text": "<|image_pad|>"}), AUTH, 400,
     "invalid_request_error"),
    (MESSAGES, body({"type": "text", "text": "x" * (BODY_CAP + 1)}), AUTH, 413,
     "request_too_large"),
    (COUNT, {"model": "test", "messages": []}, AUTH, 400, "invalid_request_error"),
    (COUNT, {"model": "test", "messages": "hi"}, {}, 401, "authentication_error"),
    (COUNT, {"model": "test", "messages": [{"role": "user", "content": [_image("AAAA")]}]},
     AUTH, 400, "invalid_request_error"),
]  # fmt: skip


@pytest.fixture(scope="module")
def hostile() -> Iterator[ServerProcess]:
    proc = ServerProcess(
        "--api-key", KEY, "--max-body-bytes", str(BODY_CAP), "--max-images-per-request", "4",
        "--max-image-pixels", "4000000", "--no-warmup",
    )  # fmt: skip
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(hostile: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=hostile.base_url, timeout=60) as c:
        yield c


def assert_anthropic_error(r: httpx.Response) -> dict[str, Any]:
    """`{"type": "error", "error": {"type": str, "message": non-empty str}}`, JSON."""
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    data = r.json()
    assert isinstance(data, dict) and data.get("type") == "error", data
    error = data["error"]
    assert set(error) == {"type", "message"}, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    return error


def _post(client: httpx.Client, path: str, payload: Any, headers: dict) -> httpx.Response:
    content = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    return client.post(path, content=content, headers={"content-type": "application/json",
                                                         **headers})  # fmt: skip


@pytest.mark.parametrize(("path", "payload", "headers", "status", "kind"), CASES)
def test_hostile_request_gets_exact_4xx_anthropic_error(
    client: httpx.Client, path: str, payload: Any, headers: dict, status: int, kind: str
) -> None:
    r = _post(client, path, payload, headers)
    assert r.status_code == status, r.text[:500]
    assert assert_anthropic_error(r)["type"] == kind


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


FIELDS = ["model", "messages", "max_tokens", "system", "stop_sequences", "stream",
          "temperature", "top_p", "top_k", "metadata", "tools", "thinking", "type", "source",
          "media_type", "data", "url", "role", "content", "text"]  # fmt: skip
LEAVES = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=12)
    | st.sampled_from(["image", "text", "base64", "url", "user", "assistant", "image/png", PNG])
)  # fmt: skip
JSON_VALUES = st.recursive(
    LEAVES,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(st.sampled_from(FIELDS) | st.text(max_size=6), kids, max_size=4)
    ),
    max_leaves=12,
)


@st.composite
def mutated(draw: st.DrawFn) -> Any:
    """A valid body with one value (at any depth) dropped or replaced, or a field added."""
    value = copy.deepcopy(draw(st.sampled_from(VALID)))
    path = draw(st.sampled_from(_paths(value)[1:]))
    parent = value
    for step in path[:-1]:
        parent = parent[step]
    action = draw(st.sampled_from(["drop", "replace", "add"]))
    if action == "drop":
        del parent[path[-1]]
    elif action == "replace":
        parent[path[-1]] = draw(JSON_VALUES)
    else:
        value[draw(st.sampled_from(FIELDS))] = draw(JSON_VALUES)
    if isinstance(value.get("max_tokens"), int) and value["max_tokens"] > 3:
        value["max_tokens"] = 3  # keep valid bodies fast
    return value


@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])  # fmt: skip
@given(payload=st.one_of(JSON_VALUES, mutated(), mutated(), mutated()), count=st.booleans())
def test_arbitrary_json_bodies_never_get_a_5xx(
    client: httpx.Client, payload: Any, count: bool
) -> None:
    """Invariant: any JSON body is answered 200 or 4xx, never 5xx; a 4xx is an Anthropic error
    object; a 200 is a message, a token count, or an SSE stream ending in message_stop."""
    r = _post(client, COUNT if count else MESSAGES, payload, AUTH)
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        assert_anthropic_error(r)
    elif count:
        assert isinstance(r.json()["input_tokens"], int)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith('data: {"type":"message_stop"}'), r.text[-300:]
    else:
        assert r.json()["type"] == "message"


def test_server_still_serves_after_the_hostile_traffic(client: httpx.Client) -> None:
    r = _post(client, MESSAGES, VALID[1], AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["output_tokens"] <= 3
