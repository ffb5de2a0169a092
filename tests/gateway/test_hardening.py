"""Hostile clients against a real `vision-gateway serve` subprocess on 127.0.0.1.

Pinned invariants:
- every hostile request (bad body, bad fields, bad image references, SSRF attempts, bad keys)
  gets an exact 4xx status and an OpenAI error object, and the server keeps serving;
- arbitrary JSON bodies (hypothesis) never produce a 5xx;
- a body over --max-body-bytes is a 413 whether it is announced by Content-Length, lied about
  or streamed chunked; a body that never ends does not block other requests;
- an image URL that never answers fails with a 400 after the read timeout without blocking
  other requests;
- clients that go away (mid-stream, while queued, or by a client-side timeout) free their
  engine rows: /health and /metrics return to zero running and zero waiting.

Not covered here: a redirect from an allowed first hop to a loopback address cannot be staged
end to end (every address a test can serve from is loopback, so the first hop is either refused
or --allow-private-urls allows the whole chain); tests/gateway/test_url_fetch.py pins it with an
address policy that treats 127.0.0.2 as internal. SIGTERM behaviour is in test_lifecycle.py.

Only servers these tests start on 127.0.0.1 are contacted.
"""

from __future__ import annotations

import copy
import json
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ImageServer, ServerProcess, data_uri, noise_png, png_claiming

KEY = "sk-hardening-key"
METRICS_KEY = "sk-hardening-metrics-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"
BODY_CAP = 2 * 1024 * 1024
MIB = 1024 * 1024
IMAGE_PARAM = "messages[0].content[0].image_url.url"


# ----- images and bodies --------------------------------------------------------------------


PNG = noise_png(0, 28, 28)
TINY_PNG = noise_png(1, 1, 1)
DROP = object()  # a field value meaning "leave the field out"


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


# ----- the hostile table --------------------------------------------------------------------


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


DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = b'{"model": "test", "pad": "' + b"x" * (3 * MIB) + b'"}'
SIXTEEN_STOPS = [f"s{i}" for i in range(17)]

CASES: list[Any] = [
    # --- the body itself
    pytest.param(Case(b'{"model": "test", "messages": ['), id="malformed-json"),
    pytest.param(Case([chat()]), id="json-array-body"),
    pytest.param(Case(b""), id="empty-body"),
    pytest.param(Case(b"null"), id="json-null-body"),
    pytest.param(Case("just a string"), id="json-string-body"),
    pytest.param(Case(b"\xff\xfe\xfa garbage"), id="body-not-utf8"),
    pytest.param(
        Case(b"\x1f\x8b\x08\x00" + b"\x00" * 20, headers={**AUTH, "Content-Encoding": "gzip"}),
        id="gzip-encoded-body-is-not-decompressed",
    ),
    pytest.param(Case(HUGE, 413, "too_large"), id="body-over-max-body-bytes"),
    pytest.param(Case(HUGE, 413, "too_large", chunked=True), id="chunked-body-over-max-body-bytes"),
    pytest.param(Case(DEEP), id="deeply-nested-json"),
    pytest.param(
        Case(b'{"model": "test", "x": ' + DEEP + b"}"),
        id="deeply-nested-json-inside-a-field",
    ),
    pytest.param(
        Case(
            b'{"model":"test","messages":[{"role":"user","content":"hi"}],"seed":'
            + b"9" * 5000
            + b"}"
        ),
        id="integer-over-python-digit-limit",
    ),
    # --- model
    pytest.param(Case(chat(model=DROP), param="model"), id="missing-model"),
    pytest.param(Case(chat(model=""), param="model"), id="empty-model"),
    pytest.param(Case(chat(model=["test"]), param="model"), id="model-not-a-string"),
    pytest.param(Case(chat(model="gpt-4o"), 404, "model_not_found", "model"), id="unknown-model"),
    pytest.param(Case(chat(model="\ud800"), (400, 404)), id="model-with-lone-surrogate"),
    # --- messages and content
    pytest.param(Case(chat(messages=DROP), param="messages"), id="missing-messages"),
    pytest.param(Case(chat(messages=[]), param="messages"), id="empty-messages"),
    pytest.param(Case(chat(messages={"role": "user"}), param="messages"), id="messages-object"),
    pytest.param(Case(msgs("hi"), param="messages[0]"), id="message-not-an-object"),
    pytest.param(Case(msgs({"content": "hi"}), param="messages[0].role"), id="missing-role"),
    pytest.param(
        Case(msgs({"role": "tool", "content": "hi"}), param="messages[0].role"), id="role-tool"
    ),
    pytest.param(
        Case(msgs({"role": 1, "content": "hi"}), param="messages[0].role"), id="role-not-a-string"
    ),
    pytest.param(
        Case(msgs({"role": "User", "content": "hi"}), param="messages[0].role"),
        id="role-wrong-case",
    ),
    pytest.param(Case(msgs({"role": "user"}), param="messages[0].content"), id="missing-content"),
    pytest.param(Case(user(42), param="messages[0].content"), id="content-a-number"),
    pytest.param(Case(user({"text": "hi"}), param="messages[0].content"), id="content-an-object"),
    pytest.param(
        Case(user(["hi"]), param="messages[0].content[0].type"), id="content-part-a-string"
    ),
    pytest.param(
        Case(
            user([{"type": "input_audio", "input_audio": {}}]), param="messages[0].content[0].type"
        ),
        id="content-part-audio",
    ),
    pytest.param(
        Case(user([{"text": "hi"}]), param="messages[0].content[0].type"),
        id="content-part-without-type",
    ),
    pytest.param(
        Case(user([{"type": "text", "text": 5}]), param="messages[0].content[0].text"),
        id="text-part-not-a-string",
    ),
    pytest.param(
        Case(user([{"type": "image_url"}]), param=IMAGE_PARAM), id="image-part-without-url"
    ),
    pytest.param(
        Case(user([{"type": "image_url", "image_url": {"url": 7}}]), param=IMAGE_PARAM),
        id="image-url-not-a-string",
    ),
    pytest.param(
        Case(
            msgs(
                {"role": "system", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
                {"role": "user", "content": "hi"},
            ),
            param="messages[0].content[0]",
        ),
        id="image-in-system-message",
    ),
    pytest.param(
        Case(
            msgs(
                {"role": "user", "content": "hi"},
                {
                    "role": "assistant",
                    "content": [{"type": "image_url", "image_url": {"url": data_uri(PNG)}}],
                },
            ),
            param="messages[1].content[0]",
        ),
        id="image-in-assistant-message",
    ),
    pytest.param(
        Case(user("look: <|image_pad|>"), param="messages"), id="image-placeholder-typed-in-text"
    ),
    pytest.param(
        Case(user("hello " * 40_000), 400, "context_length_exceeded", "messages"),
        id="prompt-over-max-context",
    ),
    pytest.param(Case(user("\ud800 hi")), id="text-with-lone-surrogate"),
    pytest.param(
        Case(image(data_uri(noise_png(3, 1, 3000))), 400, "unsupported_image", IMAGE_PARAM),
        id="image-over-the-models-aspect-ratio",
    ),
    # --- numeric and typed fields
    pytest.param(Case(chat(max_tokens=0), param="max_tokens"), id="max_tokens-zero"),
    pytest.param(Case(chat(max_tokens=-5), param="max_tokens"), id="max_tokens-negative"),
    pytest.param(Case(chat(max_tokens="8"), param="max_tokens"), id="max_tokens-string"),
    pytest.param(Case(chat(max_tokens=2.5), param="max_tokens"), id="max_tokens-fraction"),
    pytest.param(Case(chat(max_tokens=True), param="max_tokens"), id="max_tokens-bool"),
    pytest.param(Case(chat(max_tokens=float("inf")), param="max_tokens"), id="max_tokens-infinity"),
    pytest.param(
        Case(chat(max_tokens=1_000_001), param="max_tokens"), id="max_tokens-over-hard-limit"
    ),
    pytest.param(
        Case(chat(max_tokens=32_768), 400, "context_length_exceeded", "max_tokens"),
        id="max_tokens-over-context",
    ),
    pytest.param(
        Case(chat(max_completion_tokens=0), param="max_completion_tokens"),
        id="max_completion_tokens-zero",
    ),
    pytest.param(
        Case(chat(max_completion_tokens=[4]), param="max_completion_tokens"),
        id="max_completion_tokens-list",
    ),
    pytest.param(Case(chat(temperature=-0.1), param="temperature"), id="temperature-negative"),
    pytest.param(Case(chat(temperature=2.01), param="temperature"), id="temperature-over-2"),
    pytest.param(Case(chat(temperature="hot"), param="temperature"), id="temperature-string"),
    pytest.param(Case(chat(temperature=float("nan")), param="temperature"), id="temperature-nan"),
    pytest.param(Case(chat(top_p=0), param="top_p"), id="top_p-zero"),
    pytest.param(Case(chat(top_p=1.5), param="top_p"), id="top_p-over-1"),
    pytest.param(Case(chat(top_p=-1), param="top_p"), id="top_p-negative"),
    pytest.param(Case(chat(top_k=-2), param="top_k"), id="top_k-under-minus-1"),
    pytest.param(Case(chat(top_k=1.5), param="top_k"), id="top_k-fraction"),
    pytest.param(Case(chat(top_k="5"), param="top_k"), id="top_k-string"),
    pytest.param(Case(chat(n=0), param="n"), id="n-zero"),
    pytest.param(Case(chat(n="1"), param="n"), id="n-string"),
    pytest.param(Case(chat(n=129), param="n"), id="n-over-limit"),
    pytest.param(Case(chat(seed="abc"), param="seed"), id="seed-string"),
    pytest.param(Case(chat(seed=2**64), param="seed"), id="seed-over-uint64"),
    pytest.param(Case(chat(seed=-(2**63) - 1), param="seed"), id="seed-under-int64"),
    pytest.param(Case(chat(seed=0.5), param="seed"), id="seed-fraction"),
    pytest.param(Case(chat(logprobs="yes"), param="logprobs"), id="logprobs-string"),
    pytest.param(Case(chat(logprobs=1), param="logprobs"), id="logprobs-integer"),
    pytest.param(
        Case(chat(logprobs=True, top_logprobs=21), param="top_logprobs"), id="top_logprobs-21"
    ),
    pytest.param(
        Case(chat(logprobs=True, top_logprobs=-1), param="top_logprobs"),
        id="top_logprobs-negative",
    ),
    pytest.param(
        Case(chat(top_logprobs=3), param="top_logprobs"), id="top_logprobs-without-logprobs"
    ),
    pytest.param(Case(chat(stop=123), param="stop"), id="stop-number"),
    pytest.param(Case(chat(stop=""), param="stop"), id="stop-empty-string"),
    pytest.param(Case(chat(stop=["ok", ""]), param="stop"), id="stop-list-with-empty"),
    pytest.param(Case(chat(stop=[1]), param="stop"), id="stop-list-of-numbers"),
    pytest.param(Case(chat(stop=SIXTEEN_STOPS), param="stop"), id="stop-17-strings"),
    pytest.param(Case(chat(stream="true"), param="stream"), id="stream-string"),
    pytest.param(
        Case(chat(stream=True, stream_options="x"), param="stream_options"),
        id="stream_options-string",
    ),
    pytest.param(Case(chat(presence_penalty=0.5), param="presence_penalty"), id="presence_penalty"),
    pytest.param(Case(chat(tools=[{"type": "function"}]), param="tools"), id="tools"),
    pytest.param(
        Case(chat(response_format={"type": "xml"}), param="response_format.type"),
        id="response_format-unknown-type",
    ),
    # --- image payloads
    pytest.param(
        Case(image("data:image/png;base64,!!!not base64!!!"), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-bad-base64",
    ),
    pytest.param(
        Case(image("data:image/png;base64,QUJD" + "Q"), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-truncated-base64",
    ),
    pytest.param(
        Case(image(data_uri(PNG, "text/html")), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-non-image-mime",
    ),
    pytest.param(
        Case(image("data:image/png," + "x" * 10), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-not-base64",
    ),
    pytest.param(
        Case(image("data:image/png;base64"), 400, "invalid_data_uri", IMAGE_PARAM),
        id="data-uri-without-comma",
    ),
    pytest.param(
        Case(image(data_uri(b"%PDF-1.4 not an image")), 400, "image_decode_failed", IMAGE_PARAM),
        id="data-uri-non-image-bytes",
    ),
    pytest.param(
        Case(image(data_uri(PNG[: len(PNG) // 2])), 400, "image_decode_failed", IMAGE_PARAM),
        id="truncated-png",
    ),
    pytest.param(
        Case(image(data_uri(png_claiming(100_000, 100_000))), 413, "too_large", IMAGE_PARAM),
        id="png-header-claims-100000x100000",
    ),
    pytest.param(
        Case(image(data_uri(png_claiming(0, 5))), 400, "image_decode_failed", IMAGE_PARAM),
        id="png-header-claims-zero-width",
    ),
    pytest.param(Case(image(data_uri(noise_png(3, 1, 500)))), id="image-aspect-ratio-500-to-1"),
    pytest.param(
        Case(image(data_uri(PNG), count=3), 400, "too_many_images"),
        id="three-images-over-max-images-per-request-2",
    ),
    # --- image references: schemes and paths
    pytest.param(
        Case(image("ftp://127.0.0.1/a.png"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="scheme-ftp",
    ),
    pytest.param(
        Case(image("gopher://127.0.0.1:70/_x"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="scheme-gopher",
    ),
    pytest.param(
        Case(image("javascript:alert(1)"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="scheme-javascript",
    ),
    pytest.param(
        Case(image("file://otherhost/x.png"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="file-url-with-remote-host",
    ),
    pytest.param(
        Case(image("images/a.png"), 400, "unsupported_image_source", IMAGE_PARAM),
        id="relative-path",
    ),
    pytest.param(
        Case(
            image("{media}/../../../../../../../../etc/passwd"),
            400,
            "image_path_forbidden",
            IMAGE_PARAM,
        ),
        id="path-traversal-to-etc-passwd",
    ),
    pytest.param(
        Case(image("file://{media}/../outside/b.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="file-url-traversal-to-sibling-dir",
    ),
    pytest.param(
        Case(image("{media}/passwd.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="symlink-to-etc-passwd",
    ),
    pytest.param(
        Case(image("{media}/escape.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="symlink-to-image-outside-allowed-dir",
    ),
    pytest.param(
        Case(image("{outside}/b.png"), 400, "image_path_forbidden", IMAGE_PARAM),
        id="real-image-outside-allowed-dir",
    ),
    pytest.param(
        Case(image("{media}/folder.png"), 400, "image_path_invalid", IMAGE_PARAM),
        id="path-is-a-directory",
    ),
    pytest.param(
        Case(image("{media}/pipe.png"), 400, "image_path_invalid", IMAGE_PARAM),
        id="path-is-a-fifo",
    ),
    pytest.param(
        Case(image("{media}/missing.png"), 400, "image_path_invalid", IMAGE_PARAM),
        id="path-does-not-exist",
    ),
    pytest.param(
        Case(image("{media}/a.png\x00.txt"), 400, "invalid_image_url", IMAGE_PARAM),
        id="path-with-nul-byte",
    ),
    # --- image references: SSRF (nothing may connect; the image server counts hits)
    pytest.param(
        Case(image("{images}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="loopback-url-without-allow-private-urls",
    ),
    pytest.param(
        Case(image("http://127.1:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="ip-short-form-127.1",
    ),
    pytest.param(
        Case(
            image("http://2130706433:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM
        ),
        id="ip-decimal-2130706433",
    ),
    pytest.param(
        Case(
            image("http://0x7f.0.0.1:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM
        ),
        id="ip-hex-0x7f.0.0.1",
    ),
    pytest.param(
        Case(
            image("http://0177.0.0.1:{images_port}/a.png"), 400, "invalid_image_url", IMAGE_PARAM
        ),  # httpx itself rejects a leading-zero (octal) octet as an invalid address
        id="ip-octal-0177.0.0.1",
    ),
    pytest.param(
        Case(image("http://[::1]:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="ipv6-loopback",
    ),
    pytest.param(
        Case(
            image("http://[::ffff:127.0.0.1]:{images_port}/a.png"),
            400,
            "image_url_forbidden",
            IMAGE_PARAM,
        ),
        id="ipv4-mapped-ipv6-loopback",
    ),
    pytest.param(
        Case(image("http://0.0.0.0:{images_port}/a.png"), 400, "image_url_forbidden", IMAGE_PARAM),
        id="unspecified-0.0.0.0",
    ),
    pytest.param(Case(image("http:///a.png"), 400, None, IMAGE_PARAM), id="http-url-without-host"),
    pytest.param(
        Case(image("http://\ud800/a.png"), 400, None, IMAGE_PARAM),
        id="url-host-with-lone-surrogate",
    ),
    pytest.param(
        Case(image("http://127.0.0.1:{images_port}/\ud800"), 400, None, IMAGE_PARAM),
        id="url-path-with-lone-surrogate",
    ),
    # --- authentication and routing
    pytest.param(Case(chat(), 401, "invalid_api_key", headers={}), id="missing-api-key"),
    pytest.param(
        Case(chat(), 401, "invalid_api_key", headers={"Authorization": "Bearer nope"}),
        id="wrong-api-key",
    ),
    pytest.param(
        Case(chat(), 401, "invalid_api_key", headers={"Authorization": f"Basic {KEY}"}),
        id="api-key-with-basic-scheme",
    ),
    pytest.param(
        Case(chat(), 401, "invalid_api_key", headers={"Authorization": f"Bearer {METRICS_KEY}"}),
        id="metrics-key-on-chat",
    ),
    pytest.param(
        Case(chat(), 401, "invalid_api_key", headers={"Authorization": b"Bearer \xff\xfe"}),
        id="non-ascii-api-key",
    ),
    pytest.param(
        Case(None, 401, "invalid_api_key", headers={}, method="GET", path="/v1/models"),
        id="models-without-key",
    ),
    pytest.param(
        Case(None, 401, "invalid_api_key", headers={}, path="/v1/cache/clear"),
        id="cache-clear-without-key",
    ),
    pytest.param(
        Case(None, 401, "invalid_api_key", headers={}, method="GET", path="/v1/cache/stats"),
        id="cache-stats-without-key",
    ),
    pytest.param(
        Case(None, 401, "invalid_api_key", headers={}, method="GET", path="/metrics"),
        id="metrics-without-key",
    ),
    pytest.param(
        Case(None, 401, "invalid_api_key", method="GET", path="/metrics"),
        id="metrics-with-api-key-instead-of-metrics-key",
    ),
    pytest.param(Case(None, 405, method="GET"), id="get-on-chat-completions"),
    pytest.param(Case(chat(), 404, path="/v1/completions"), id="unknown-route"),
]


# ----- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An allowed media dir full of traps, and a sibling dir that is not allowed."""
    root = tmp_path_factory.mktemp("hardening")
    allowed = root / "allowed"
    outside = root / "outside"
    allowed.mkdir()
    outside.mkdir()
    (allowed / "a.png").write_bytes(PNG)
    (outside / "b.png").write_bytes(noise_png(2, 28, 28))
    (allowed / "folder.png").mkdir()
    os.mkfifo(allowed / "pipe.png")
    (allowed / "passwd.png").symlink_to("/etc/passwd")
    (allowed / "escape.png").symlink_to(outside / "b.png")
    return {"media": str(allowed), "outside": str(outside)}


@pytest.fixture(scope="module")
def images(media: dict[str, str]) -> Iterator[ImageServer]:
    server = ImageServer(Path(media["media"]))
    yield server
    server.close()


@pytest.fixture(scope="module")
def hostile(media: dict[str, str]) -> Iterator[ServerProcess]:
    """Auth on, a 2 MiB body cap, 2 images per request, one allowed media dir, no private
    URLs; --default-max-tokens 4 keeps valid random bodies fast."""
    proc = ServerProcess(
        "--api-key", KEY,
        "--metrics-api-key", METRICS_KEY,
        "--max-body-bytes", str(BODY_CAP),
        "--max-images-per-request", "2",
        "--allowed-media-dir", media["media"],
        "--default-max-tokens", "4",
    )  # fmt: skip
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(hostile: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=hostile.base_url, timeout=60) as c:
        yield c


def _fill(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        for key, sub in env.items():
            value = value.replace("{" + key + "}", sub)
        return value
    if isinstance(value, list):
        return [_fill(v, env) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, env) for k, v in value.items()}
    return value


def _encode(body: Any) -> bytes:
    if isinstance(body, bytes):
        return body
    return json.dumps(body).encode()  # ensure_ascii: a lone surrogate is sent as \ud800


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


def _send(client: httpx.Client, case: Case, env: dict[str, str]) -> httpx.Response:
    headers = dict(AUTH if case.headers is None else case.headers)
    content: bytes | Iterator[bytes] | None = None
    if case.body is not None:
        data = _encode(_fill(case.body, env))
        headers.setdefault("Content-Type", "application/json")
        content = data
        if case.chunked:
            content = iter([data[i : i + MIB] for i in range(0, len(data), MIB)])
    return client.request(case.method, case.path, content=content, headers=headers)


def _env(media: dict[str, str], images: ImageServer) -> dict[str, str]:
    return {**media, "images": images.url, "images_port": images.url.rsplit(":", 1)[1]}


@pytest.mark.parametrize("case", CASES)
def test_hostile_request_gets_exact_4xx_error_object(
    client: httpx.Client, media: dict[str, str], images: ImageServer, case: Case
) -> None:
    """Invariant: each hostile request gets its exact 4xx status and an OpenAI error object
    whose `code`/`param` name the problem; no SSRF attempt connects anywhere."""
    r = _send(client, case, _env(media, images))
    expected = case.status if isinstance(case.status, tuple) else (case.status,)
    assert r.status_code in expected, r.text[:500]
    error = assert_error_object(r)
    if case.code is not None:
        assert error["code"] == case.code, error
    if case.param is not None:
        assert error["param"] == case.param, error
    # SSRF cases name the loopback image server (also via odd IP spellings of 127.0.0.1 and
    # its port): refusal must come before any connection, so it never sees a request.
    assert images.hits == {}


LENIENT = [
    pytest.param(chat(), {"Content-Type": "text/plain"}, id="json-body-labelled-text-plain"),
    pytest.param(
        chat(), {"Content-Type": "application/x-www-form-urlencoded"}, id="json-body-labelled-form"
    ),
    pytest.param(chat(), {}, id="no-content-type"),
    pytest.param(image(data_uri(PNG, "image/jpeg")), None, id="png-bytes-labelled-image-jpeg"),
    pytest.param(image(data_uri(TINY_PNG)), None, id="one-by-one-pixel-image"),
    pytest.param(
        image(data_uri(PNG, "IMAGE/PNG").replace("data:", "DATA:")), None, id="upper-case-data-uri"
    ),
    pytest.param(image("{media}/a.png"), None, id="allowed-path"),
    pytest.param(image(data_uri(PNG, "image/png"), count=2), None, id="two-images-at-the-cap"),
    pytest.param(chat(max_tokens=2.0), None, id="integral-float-max_tokens"),
]


@pytest.mark.parametrize(("body", "headers"), LENIENT)
def test_lenient_inputs_succeed(
    client: httpx.Client,
    media: dict[str, str],
    images: ImageServer,
    body: dict[str, Any],
    headers: dict[str, str] | None,
) -> None:
    """Invariant: harmless oddities are served (200): JSON is parsed whatever the content
    type says, images are decoded by content (not by the declared mime), 1x1 images work."""
    sent = {**AUTH, **(headers if headers is not None else {"Content-Type": "application/json"})}
    r = client.post(CHAT, content=_encode(_fill(body, _env(media, images))), headers=sent)
    assert r.status_code == 200, r.text[:500]
    assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")


# ----- raw-socket requests ------------------------------------------------------------------


def _raw(port: int, head: str, body: bytes = b"") -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=30)
    sock.sendall(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
    return sock


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
    sock = _raw(hostile.port, _head(3 * MIB), b"{}")
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
    sock = _raw(hostile.port, _head(length), b"{}")
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
    stalled = _raw(hostile.port, _head(1_000_000), b'{"model"')
    try:
        assert _wait_for(lambda: _body_bytes(hostile) == 1_000_000, 30)  # it is being read
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
    sock = _raw(hostile.port, _head(1_000_000), b'{"model"')
    assert _wait_for(lambda: _body_bytes(hostile) == 1_000_000, 30)  # the upload is being read
    sock.close()
    # The server gives the body budget back only once it has handled the disconnect, so the
    # log below is read after the handling (not merely before it happened).
    assert _wait_for(lambda: _body_bytes(hostile) == 0, 30), "the disconnect was not handled"
    with open(hostile.log_path, "rb") as f:
        f.seek(offset)
        new = f.read().decode(errors="replace")
    assert "ClientDisconnect" not in new and "unhandled error" not in new, new[-2000:]
    assert "Traceback" not in new, new[-2000:]


def _body_bytes(server: ServerProcess) -> float:
    """Bytes of request bodies the server is reading now (its body-budget gauge)."""
    metrics = server.metrics({"Authorization": f"Bearer {METRICS_KEY}"})
    return metrics["vision_gateway_request_body_bytes_reading"]


# ----- auth on the side endpoints -----------------------------------------------------------


def test_health_needs_no_key_and_metrics_take_only_the_metrics_key(hostile: ServerProcess) -> None:
    """Invariant: /health is open; /metrics answers its own key (--metrics-api-key)."""
    health = httpx.get(hostile.base_url + "/health", timeout=10)
    assert health.status_code == 200 and health.json()["status"] == "ok"
    metrics = httpx.get(
        hostile.base_url + "/metrics",
        headers={"Authorization": f"Bearer {METRICS_KEY}"},
        timeout=10,
    )
    assert metrics.status_code == 200
    assert "vision_gateway_running_requests" in metrics.text


# ----- property test ------------------------------------------------------------------------

FIELDS = [
    "model", "messages", "max_tokens", "max_completion_tokens", "temperature", "top_p",
    "top_k", "n", "seed", "logprobs", "top_logprobs", "stop", "stream", "stream_options",
    "presence_penalty", "frequency_penalty", "tools", "response_format", "user",
]  # fmt: skip

LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.integers(min_value=-3, max_value=40)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=12)
    | st.sampled_from(["test", "user", "system", "assistant", "text", "image_url", "", "hi"])
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda kids: (
        st.lists(kids, max_size=4)
        | st.dictionaries(st.text(max_size=8) | st.sampled_from(FIELDS), kids, max_size=4)
    ),
    max_leaves=12,
)

VALID_BODIES: list[dict[str, Any]] = [
    chat(max_tokens=3),
    chat(stream=True, stream_options={"include_usage": True}, max_tokens=3),
    chat(logprobs=True, top_logprobs=2, stop=["x"], seed=1, temperature=0.5, top_p=0.9),
    image(data_uri(TINY_PNG)),
    msgs(
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}]},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "c"},
        max_completion_tokens=2,
    ),
]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


@st.composite
def mutated_bodies(draw: st.DrawFn) -> Any:
    """A valid body with one value (at any depth) dropped or replaced, or a field added."""
    body = copy.deepcopy(draw(st.sampled_from(VALID_BODIES)))
    path = draw(st.sampled_from(_paths(body)[1:]))
    parent = body
    for step in path[:-1]:
        parent = parent[step]
    action = draw(st.sampled_from(["drop", "replace", "add"]))
    if action == "drop":
        del parent[path[-1]]
    elif action == "replace":
        parent[path[-1]] = draw(JSON_VALUES)
    else:
        body[draw(st.sampled_from(FIELDS))] = draw(JSON_VALUES)
    return body


def _clamp_tokens(body: Any) -> Any:
    """Keep otherwise-valid bodies fast: a numeric max_tokens over 4 becomes 4."""
    if isinstance(body, dict):
        for name in ("max_tokens", "max_completion_tokens"):
            value = body.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 4:
                body[name] = 4
    return body


BODIES = st.one_of(
    JSON_VALUES,
    st.dictionaries(st.sampled_from(FIELDS), JSON_VALUES, max_size=6),
    mutated_bodies(),
    mutated_bodies(),
).map(_clamp_tokens)


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(body=BODIES)
def test_arbitrary_json_bodies_never_get_a_5xx(client: httpx.Client, body: Any) -> None:
    """Invariant: any JSON body is answered 200 or 4xx, never 5xx; a 4xx is an error object,
    a 200 is a completion (or an SSE stream ending in [DONE])."""
    r = client.post(CHAT, content=json.dumps(body).encode(), headers=AUTH, timeout=60)
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        assert_error_object(r)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    else:
        assert r.json()["object"] == "chat.completion"


def test_server_still_serves_after_the_hostile_traffic(
    hostile: ServerProcess, client: httpx.Client
) -> None:
    """Invariant: after all of the above the server is healthy, idle and answers normally."""
    health = httpx.get(hostile.base_url + "/health", timeout=10).json()
    assert health["status"] == "ok"
    r = client.post(CHAT, json=image(data_uri(PNG)) | {"max_tokens": 3}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    assert _wait_idle(hostile, 30), httpx.get(hostile.base_url + "/health").json()


# ----- the open server: hanging URLs and disconnecting clients -------------------------------


@pytest.fixture(scope="module")
def open_server() -> Iterator[ServerProcess]:
    """Private URLs allowed (so a local never-answering URL can be fetched), no media dir."""
    proc = ServerProcess("--allow-private-urls", "--max-batch", "16")
    yield proc
    assert proc.stop(), proc.log()


def _wait_idle(server: ServerProcess, timeout: float) -> bool:
    """Poll /health until running == waiting == 0 (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        health = httpx.get(server.base_url + "/health", timeout=10).json()
        if health["running"] == 0 and health["waiting"] == 0:
            return True
        time.sleep(0.1)
    return False


def _health(server: ServerProcess) -> dict[str, Any]:
    return httpx.get(server.base_url + "/health", timeout=10).json()


def _load(server: ServerProcess) -> dict[str, int]:
    health = _health(server)
    return {"running": health["running"], "waiting": health["waiting"]}


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
    assert _health(open_server)["status"] == "ok"
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
    return _raw(port, head, body)


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


def _wait_for(check: Callable[[], bool], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.05)
    return False


def test_twenty_clients_leaving_mid_stream_free_every_row(open_server: ServerProcess) -> None:
    """Invariant: 16 clients that hang up mid-stream and 4 that hang up while queued for a
    row (--max-batch 16) are all cancelled: /health and /metrics return to 0 running and 0
    waiting, and the cancelled-request counter grows by exactly 20."""
    assert _wait_idle(open_server, 30)
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
        assert _wait_for(lambda: _load(open_server) == busy, 10), _health(open_server)
    finally:
        for sock in socks:
            sock.close()
    assert _wait_idle(open_server, 30), _health(open_server)
    metrics = open_server.metrics()
    assert metrics["vision_gateway_running_requests"] == 0
    assert metrics["vision_gateway_waiting_requests"] == 0
    assert _cancelled(open_server) - before == 20


def test_non_streaming_clients_that_time_out_free_their_rows(open_server: ServerProcess) -> None:
    """Invariant: non-streaming clients whose read timeout fires before the answer are
    cancelled server-side: running returns to 0 (counter +5), long before the 1000 tokens
    they asked for could have been generated."""
    assert _wait_idle(open_server, 30)
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
    assert _wait_idle(open_server, 30), _health(open_server)
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
