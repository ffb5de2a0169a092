"""The newest surfaces under hostile traffic: one real server on 127.0.0.1 offering a chat
model without an audio tower (`chat`, alias `chat-alias`), Gemma 4 with one (`audio`), a
multimodal and a text-only embedder (`vl`, alias `vl-alias`; `text`) and a text and a
multimodal reranker (`rerank`, `vlrerank`), with tenant and admin keys.

Pinned invariants: every request of surface_cases.py (embeddings, rerank, audio parts, the
`model` field, the admin model endpoints, `?model=` on the cache endpoints) gets its exact
4xx status and the error object of its API (OpenAI's; Anthropic's on /v1/messages) naming
the field and saying what to fix; arbitrary embeddings, rerank and audio chat bodies
(hypothesis) get 200 or a 4xx error object, never a 5xx; a model unloaded while a request
runs finishes that request first, concurrent loads and requests while loading all succeed,
an unloaded model's caches are a 409 naming it; a served model (or alias) is retrievable by
id; a Responses continuation whose stored turns hold audio, sent to a model without audio,
names `previous_response_id`; after all of it the server is healthy, idle and every model
answers.
"""

from __future__ import annotations

import base64
import concurrent.futures
import copy
import json
import os
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import data_uri, tiny_model

from bench.server import LocalServer
from tests.gateway.hostile.server import AUTH, BODY_CAP, KEY, METRICS_KEY, assert_error_object
from tests.gateway.hostile.surface_cases import (
    ADMIN,
    CHAT,
    EMBED,
    MESSAGES,
    PNG,
    RERANK,
    RESPONSES,
    SURFACE_CASES,
    WAV,
    SurfaceCase,
    audio,
    audio_url,
    b64,
    chat,
    float_wav,
    responses,
    wav,
)

MODELS = """\
[models.chat]
path = "{qwen2_vl}"
aliases = ["chat-alias"]
[models.audio]
path = "{gemma4}"
[models.vl]
path = "{qwen3_vl_embedding}"
aliases = ["vl-alias"]
[models.text]
path = "{qwen3_embedding}"
[models.rerank]
path = "{qwen3_reranker}"
task = "rerank"
[models.vlrerank]
path = "{qwen3_vl_reranker}"
task = "rerank"
"""
ARCHES = ["qwen2_vl", "gemma4", "qwen3_vl_embedding", "qwen3_embedding", "qwen3_reranker"]


@pytest.fixture(scope="module")
def media(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("surfaces")
    (folder / "clip.wav").write_bytes(WAV)
    (folder / "notes.txt").write_text("not audio\n" * 50)
    os.mkfifo(folder / "pipe.wav")  # a reader that opened it would wait forever
    (folder / "passwd.wav").symlink_to("/etc/passwd")
    return folder


@pytest.fixture(scope="module")
def server(media: Path) -> Iterator[LocalServer]:
    paths = {arch: tiny_model(arch) for arch in [*ARCHES, "qwen3_vl_reranker"]}
    models = media.parent / "models.toml"
    models.write_text(MODELS.format(**paths))
    proc = LocalServer(
        [
            "--models", str(models), "--no-warmup",
            "--api-key", KEY, "--admin-api-key", METRICS_KEY,
            "--max-body-bytes", str(2 * BODY_CAP),
            "--max-images-per-request", "2",
            "--allowed-media-dir", str(media),
            "--max-audio-seconds", "5", "--max-audio-bytes", "2000000",
            "--default-max-tokens", "4",
        ]
    )  # fmt: skip
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(server: LocalServer) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def _fill(value: Any, media: Path) -> Any:
    if isinstance(value, str):
        return value.replace("{media}", str(media))
    if isinstance(value, list):
        return [_fill(v, media) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, media) for k, v in value.items()}
    return value


def _send(client: httpx.Client, case: SurfaceCase, media: Path) -> httpx.Response:
    headers = dict(AUTH if case.headers is None else case.headers)
    content = None
    if case.body is not None:
        body = _fill(case.body, media)
        content = body if isinstance(body, bytes) else json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    return client.request(case.method, case.path, content=content, headers=headers)


def assert_anthropic_error(r: httpx.Response) -> dict[str, Any]:
    """Anthropic's shape: {"type": "error", "error": {"type": str, "message": non-empty}}."""
    assert r.headers.get("content-type", "").startswith("application/json"), r.headers
    body = r.json()
    assert isinstance(body, dict) and body.get("type") == "error", body
    error = body["error"]
    assert set(error) == {"type", "message"}, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    return error


@pytest.mark.parametrize("case", SURFACE_CASES)
def test_hostile_request_gets_exact_4xx_in_its_api_shape(
    client: httpx.Client, media: Path, case: SurfaceCase
) -> None:
    """Invariant: the exact 4xx, its API's error object, the field named (`param`, or the
    field's path in the Anthropic message) and the message saying what to fix."""
    r = _send(client, case, media)
    expected = case.status if isinstance(case.status, tuple) else (case.status,)
    assert r.status_code in expected, r.text[:600]
    if case.path.startswith(MESSAGES):
        error = assert_anthropic_error(r)
    else:
        error = assert_error_object(r)
        if case.code is not None:
            assert error["code"] == case.code, error
        if case.param is not None:
            assert error["param"] == case.param, error
    assert not re.search(r"unexpected \w+Error", error["message"]), error  # a bug, not a fix
    if case.says is not None:
        assert case.says in error["message"], error


LENIENT = [
    pytest.param(audio(b64(WAV), "mp3"), id="wav-bytes-labelled-mp3"),
    pytest.param(audio(b64(WAV)[:40] + "\n" + b64(WAV)[40:]), id="base64-with-a-newline"),
    pytest.param(audio(b64(WAV[:-1]).rstrip("=")), id="base64-without-padding"),
    pytest.param(audio(b64(wav(16000, 960))), id="wav-of-60-ms"),
    pytest.param(audio(b64(wav(16000, 800, channels=8))), id="wav-of-8-channels"),
    pytest.param(audio(b64(float_wav(np.full(8000, 1e30)))), id="float-wav-far-over-full-scale"),
    pytest.param(audio_url("{media}/clip.wav"), id="audio-url-allowed-path"),
]


@pytest.mark.parametrize("part", LENIENT)
def test_odd_but_valid_audio_is_answered(client: httpx.Client, media: Path, part: Any) -> None:
    """Invariant: audio that is odd but readable (a wrong `format` label, base64 with a line
    break or without padding, a 60 ms clip, 8 channels, samples far over full scale) is
    answered, with finite logprobs."""
    body = _fill(chat("audio", part), media) | {"logprobs": True}
    r = client.post("/v1/chat/completions", json=body, headers=AUTH)
    assert r.status_code == 200, r.text[:500]
    logprobs = [t["logprob"] for t in r.json()["choices"][0]["logprobs"]["content"]]
    assert logprobs and all(np.isfinite(logprobs)), logprobs


def test_continuing_an_audio_response_on_a_model_without_audio_names_the_stored_turn(
    client: httpx.Client,
) -> None:
    """Invariant: a Responses continuation (`previous_response_id`) of a conversation with
    audio, sent to a model without an audio tower, is a 400 naming `previous_response_id`
    (the audio is in the stored turns, not in this request's `input`); on the audio model
    it is answered."""
    first = client.post(RESPONSES, json=responses("audio", audio(b64(WAV))), headers=AUTH)
    assert first.status_code == 200, first.text
    more = {"max_output_tokens": 2, "previous_response_id": first.json()["id"], "input": "And?"}
    r = client.post(RESPONSES, json={"model": "chat", **more}, headers=AUTH)
    assert r.status_code == 400, r.text
    error = assert_error_object(r)
    assert error["param"] == "previous_response_id" and error["code"] == "unsupported_audio"
    assert "audio" in error["message"]
    again = client.post(RESPONSES, json={"model": "audio", **more}, headers=AUTH)
    assert again.status_code == 200, again.text


# ----- arbitrary embeddings, rerank and audio chat bodies -------------------------------------

LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**40), max_value=2**40)
    | st.integers(min_value=-2, max_value=300)
    | st.floats(allow_nan=False)
    | st.text(max_size=10)
    | st.sampled_from(["text", "vl", "rerank", "float", "base64", "image_url", "", "a b"])
)
VALUES = st.recursive(
    LEAVES,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=6), kids, max_size=3)
    ),
    max_leaves=10,
)
IMAGE = {"type": "image_url", "image_url": {"url": data_uri(PNG)}}
VALID: list[tuple[str, dict[str, Any]]] = [
    (EMBED, {"model": "text", "input": ["one", "two"], "dimensions": 16}),
    (EMBED, {"model": "text", "input": [[1, 2, 3], [4]], "encoding_format": "base64"}),
    (EMBED, {"model": "vl", "input": [[{"type": "text", "text": "cap"}, IMAGE]]}),
    (RERANK, {"model": "rerank", "query": "q", "documents": ["a", {"text": "b"}], "top_n": 1}),
    (CHAT, chat("audio", audio(b64(WAV)))),
    (RESPONSES, responses("audio", audio(b64(WAV)))),
    (
        RERANK,
        {"model": "vlrerank", "query": {"text": "q"}, "documents": [{"image": data_uri(PNG)}]},
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
def bodies(draw: st.DrawFn) -> tuple[str, Any]:
    """A valid embeddings, rerank or audio chat body with one value (at any depth) dropped
    or replaced by an arbitrary JSON value, or the whole body arbitrary."""
    path, body = copy.deepcopy(draw(st.sampled_from(VALID)))
    if draw(st.integers(0, 9)) == 0:
        return path, draw(VALUES)
    where = draw(st.sampled_from(_paths(body)[1:]))
    parent = body
    for step in where[:-1]:
        parent = parent[step]
    if draw(st.booleans()):
        del parent[where[-1]]
    else:
        parent[where[-1]] = draw(VALUES)
    return path, body


@settings(
    max_examples=200,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(sent=bodies())
def test_arbitrary_embedding_rerank_and_audio_bodies_never_get_a_5xx(
    client: httpx.Client, sent: tuple[str, Any]
) -> None:
    """Invariant: 200 (vectors, results, an answer) or a 4xx OpenAI error object, never a
    5xx."""
    path, body = sent
    if isinstance(body, dict):  # a valid chat body stays fast
        for name in ("max_tokens", "max_output_tokens"):
            value = body.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 4:
                body[name] = 4
    r = client.post(path, content=json.dumps(body).encode(), headers=AUTH)
    assert r.status_code == 200 or 400 <= r.status_code < 500, (r.status_code, r.text[:500])
    if r.status_code != 200:
        assert_error_object(r)
    elif r.headers["content-type"].startswith("text/event-stream"):
        assert path == CHAT and r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    else:
        kinds = {EMBED: "list", RERANK: "rerank", CHAT: "chat.completion", RESPONSES: "response"}
        assert r.json()["object"] == kinds[path]


# ----- several models: load, unload, retrieve ---------------------------------------------------


def _states(client: httpx.Client) -> dict[str, str]:
    cards = client.get("/v1/models", headers=AUTH).json()["data"]
    return {card["id"]: card["state"] for card in cards}


def test_a_model_and_an_alias_are_retrievable_by_id(client: httpx.Client) -> None:
    """Invariant: GET /v1/models/{id} answers the card /v1/models lists (an alias: its
    model's card), as OpenAI's `models.retrieve` expects."""
    listed = {card["id"]: card for card in client.get("/v1/models", headers=AUTH).json()["data"]}
    for name, model in [("chat", "chat"), ("chat-alias", "chat"), ("vl-alias", "vl")]:
        r = client.get(f"/v1/models/{name}", headers=AUTH)
        assert r.status_code == 200, r.text
        assert r.json()["id"] == model and r.json()["object"] == "model"
        assert r.json()["aliases"] == listed[model]["aliases"]


def test_unload_while_a_request_runs_finishes_it_first(client: httpx.Client) -> None:
    """Invariant: an admin unload waits for the model's running request, which ends normally
    ([DONE]); the model is then unloaded, its caches a 409 naming it, and the next request
    loads it again."""
    body = chat("chat") | {"stream": True, "max_tokens": 120, "ignore_eos": True}
    seen: dict[str, Any] = {}
    started = threading.Event()

    def stream() -> None:
        with client.stream("POST", "/v1/chat/completions", json=body, headers=AUTH) as r:
            seen["status"] = r.status_code
            chunks = []
            for chunk in r.iter_text():
                started.set()
                chunks.append(chunk)
            seen["text"] = "".join(chunks)

    worker = threading.Thread(target=stream)
    worker.start()
    assert started.wait(60)
    unloaded = client.post("/v1/models/chat/unload", headers=ADMIN)
    worker.join(60)
    assert seen["status"] == 200 and seen["text"].rstrip().endswith("data: [DONE]"), seen
    assert unloaded.status_code == 200 and unloaded.json()["unloaded"] is True, unloaded.text
    assert _states(client)["chat"] == "unloaded"
    for path in ("/v1/cache/stats", "/v1/cache/entries"):
        r = client.get(f"{path}?model=chat-alias", headers=AUTH)
        assert r.status_code == 409, r.text
        assert assert_error_object(r)["code"] == "model_not_loaded"
    again = client.post("/v1/models/chat/unload", headers=ADMIN)
    assert again.status_code == 200 and again.json()["unloaded"] is False
    answer = client.post("/v1/chat/completions", json=chat("chat"), headers=AUTH)
    assert answer.status_code == 200, answer.text
    assert _states(client)["chat"] == "loaded"


def test_loads_and_requests_while_loading_all_succeed(
    client: httpx.Client, server: LocalServer
) -> None:
    """Invariant: three admin loads and three requests racing for an unloaded model all get
    200, and the model is loaded once for them."""
    assert client.post("/v1/models/text/unload", headers=ADMIN).status_code == 200
    loads = 'vision_gateway_model_loads_total{model="text"}'
    before = server.metrics(ADMIN).get(loads, 0.0)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        calls = [pool.submit(client.post, "/v1/models/text/load", headers=ADMIN) for _ in range(3)]
        calls += [
            pool.submit(client.post, EMBED, json={"model": "text", "input": f"x{i}"}, headers=AUTH)
            for i in range(3)
        ]
        answers = [c.result() for c in calls]
    assert [a.status_code for a in answers] == [200] * 6, [a.text[:200] for a in answers]
    assert server.metrics(ADMIN)[loads] == before + 1


def test_embedding_requests_during_an_unload_are_answered(client: httpx.Client) -> None:
    """Invariant: requests in flight when an unload is asked for are answered (200), then the
    model is unloaded."""
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        body = {"model": "vl", "input": [f"text {i}" for i in range(40)]}
        calls = [pool.submit(client.post, EMBED, json=body, headers=AUTH) for _ in range(5)]
        unload = pool.submit(client.post, "/v1/models/vl/unload", headers=ADMIN)
        assert [c.result().status_code for c in calls] == [200] * 5
        assert unload.result().status_code == 200
    assert _states(client)["vl"] == "unloaded"


def test_server_still_serves_after_the_new_surface_traffic(
    server: LocalServer, client: httpx.Client
) -> None:
    """Invariant: after all of this module's traffic the server is healthy and idle, and a
    chat, an audio, an embeddings and a rerank request are answered (named last in the
    module: it runs after the others)."""
    r = client.post("/v1/chat/completions", json=chat("audio", audio(b64(WAV))), headers=AUTH)
    assert r.status_code == 200, r.text
    vectors = client.post(EMBED, json={"model": "vl-alias", "input": [IMAGE]}, headers=AUTH)
    assert vectors.status_code == 200, vectors.text
    packed = client.post(
        EMBED, json={"model": "text", "input": "x", "encoding_format": "base64"}, headers=AUTH
    )
    vector = np.frombuffer(base64.b64decode(packed.json()["data"][0]["embedding"]), "<f4")
    assert vector.shape == (64,) and abs(float(np.linalg.norm(vector)) - 1) < 1e-4
    ranked = client.post(RERANK, json={"model": "rerank", "query": "q", "documents": ["a", "b"]},
                         headers=AUTH)  # fmt: skip
    assert ranked.status_code == 200 and len(ranked.json()["results"]) == 2, ranked.text
    health = httpx.get(server.base_url + "/health", timeout=10).json()
    assert health["status"] == "ok" and health["running"] == 0 and health["waiting"] == 0, health
    assert not re.search(r"-> 5\d\d ", server.log(1_000_000)), server.log()  # no 5xx at all
