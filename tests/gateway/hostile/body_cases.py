"""Hostile requests about the request itself, each with the exact answer it must get (the
table test is test_table.py): the body (malformed, empty, not UTF-8, too deep, too large),
the model, messages and content parts, every numeric and typed field, and the API key and
route. Invariant pinned there: each gets its exact 4xx status and an OpenAI error object
whose `code`/`param` name the problem.
"""

from __future__ import annotations

from typing import Any

import pytest
from support import data_uri, noise_png

from tests.gateway.hostile.server import (
    AUTH,
    DROP,
    IMAGE_PARAM,
    KEY,
    METRICS_KEY,
    MIB,
    PNG,
    Case,
    chat,
    image,
    msgs,
    user,
)

DEEP = b"[" * 100_000 + b"]" * 100_000
HUGE = b'{"model": "test", "pad": "' + b"x" * (3 * MIB) + b'"}'
SIXTEEN_STOPS = [f"s{i}" for i in range(17)]

BODY_CASES: list[Any] = [
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
        Case(msgs({"role": "tool", "content": "hi"}), param="messages[0].tool_call_id"),
        id="role-tool-without-call-id",
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
        Case(  # an input_audio part without its base64 `data`
            user([{"type": "input_audio", "input_audio": {}}]),
            param="messages[0].content[0].input_audio.data",
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
    # A max_tokens above the room the prompt leaves is capped (agents send it as a ceiling);
    # a min_tokens no capped answer can reach is still the client's mistake.
    pytest.param(
        Case(chat(max_tokens=1_000_000, min_tokens=999_999), param="min_tokens"),
        id="min_tokens-over-context",
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
    pytest.param(
        Case(chat(presence_penalty=2.5), param="presence_penalty"), id="presence_penalty-range"
    ),
    pytest.param(
        Case(chat(tools=[{"type": "function"}]), param="tools[0].function"), id="tool-no-function"
    ),
    pytest.param(
        Case(chat(response_format={"type": "xml"}), param="response_format.type"),
        id="response_format-unknown-type",
    ),
]

ACCESS_CASES: list[Any] = [
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
    pytest.param(  # --metrics-api-key is the admin key: a tenant's key is known, not allowed
        Case(None, 403, "admin_key_required", method="GET", path="/metrics"),
        id="metrics-with-api-key-instead-of-metrics-key",
    ),
    pytest.param(
        Case(None, 403, "admin_key_required", path="/v1/cache/clear"),
        id="cache-clear-with-api-key-instead-of-admin-key",
    ),
    pytest.param(Case(None, 405, method="GET"), id="get-on-chat-completions"),
    pytest.param(Case(chat(), 404, path="/v1/complete"), id="unknown-route"),
]
