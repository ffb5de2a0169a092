"""The table of hostile requests (body_cases.py, image_cases.py) and harmless oddities, sent
to the shared `hostile` server.

Pinned invariants: every hostile request (bad body, bad fields, bad image references, SSRF
attempts, bad keys) gets an exact 4xx status and an OpenAI error object, and no SSRF attempt
connects anywhere; harmless oddities (a content type that is not JSON, a mislabelled image, a
1x1 image) are served. (That the server keeps serving is test_property.py's survival check.)
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from support import ImageServer, data_uri

from tests.gateway.hostile.body_cases import ACCESS_CASES, BODY_CASES
from tests.gateway.hostile.image_cases import IMAGE_CASES
from tests.gateway.hostile.server import (
    AUTH,
    CHAT,
    MIB,
    PNG,
    TINY_PNG,
    Case,
    assert_error_object,
    chat,
    image,
)

CASES: list[Any] = [*BODY_CASES, *IMAGE_CASES, *ACCESS_CASES]


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
