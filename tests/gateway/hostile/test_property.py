"""Arbitrary JSON bodies (hypothesis) against the shared `hostile` server, then its survival
check.

Pinned invariants: any JSON body is answered 200 or 4xx, never 5xx (a 4xx is an OpenAI error
object, a 200 a completion or an SSE stream ending in [DONE]); after all the hostile traffic
of this folder (conftest.py runs the survival check last) the server is healthy, idle and
answers normally.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import ServerProcess, data_uri

from tests.gateway.hostile.server import (
    AUTH,
    CHAT,
    PNG,
    TINY_PNG,
    assert_error_object,
    chat,
    health,
    image,
    json_paths,
    msgs,
    wait_idle,
)

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


@st.composite
def mutated_bodies(draw: st.DrawFn) -> Any:
    """A valid body with one value (at any depth) dropped or replaced, or a field added."""
    body = copy.deepcopy(draw(st.sampled_from(VALID_BODIES)))
    path = draw(st.sampled_from(json_paths(body)[1:]))
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
    """Invariant: after all of the hostile traffic (this folder's other tests: conftest.py
    runs this one last) the server is healthy, idle and answers normally."""
    assert health(hostile)["status"] == "ok"
    r = client.post(CHAT, json=image(data_uri(PNG)) | {"max_tokens": 3}, headers=AUTH)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 3
    wait_idle(hostile, 30)
