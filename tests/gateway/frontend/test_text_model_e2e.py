"""End to end: `vision-gateway serve --model <an mlx-lm text checkpoint>` (two processes,
the engine's own), through the `openai` and `anthropic` SDKs.

Pinned: /v1/models and /v1/cache/stats name the text family; a text question is answered,
streamed and plain alike; a repeated prompt reads whole blocks from the prefix cache; an image
sent to the text model is a 400 naming the message part, in OpenAI's and Anthropic's error
shapes, and the server keeps serving.
"""

from __future__ import annotations

import base64

import anthropic
import httpx
import openai
import pytest
from support import noise_png, tiny_model

from bench.server import LocalServer

SYSTEM = "You are a careful assistant. " * 6


@pytest.fixture(scope="module")
def server():
    path = str(tiny_model("qwen3"))
    proc = LocalServer(["--model", path, "--served-model-name", "test", "--kv-block-tokens", "8"])
    yield proc
    assert proc.stop(), proc.log()


def _image_uri() -> str:
    return "data:image/png;base64," + base64.b64encode(noise_png(3)).decode()


def test_models_and_stats_name_the_family(server: LocalServer) -> None:
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert (card["family"], card["model_type"], card["media"]) == ("text", "qwen3", [])
    stats = httpx.get(server.base_url + "/v1/cache/stats").json()
    assert stats["family"]["prefix_cache"] == "on"


def test_openai_plain_stream_and_cache(server: LocalServer) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi!"}]
    kw = {"model": "test", "messages": messages, "max_tokens": 8, "temperature": 0}
    plain = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    chunks = client.chat.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert plain.choices[0].message.content == streamed
    again = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert again.choices[0].message.content == plain.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_openai_image_is_a_400_naming_the_part(server: LocalServer) -> None:
    content = [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": _image_uri()}},
    ]
    body = {"model": "test", "messages": [{"role": "user", "content": content}]}
    r = httpx.post(server.base_url + "/v1/chat/completions", json=body, timeout=60)
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["param"] == "messages[0].content[1].image_url.url"
    assert "does not take image input" in error["message"]


def test_anthropic_image_is_a_400_naming_the_part(server: LocalServer) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": _image_uri().split(",")[1]}
    content = [{"type": "text", "text": "What?"}, {"type": "image", "source": source}]
    with pytest.raises(anthropic.BadRequestError) as err:
        client.messages.create(
            model="test", max_tokens=4, messages=[{"role": "user", "content": content}]
        )
    body = err.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    assert "messages[0].content[1]" in body["error"]["message"]
    answer = client.messages.create(
        model="test", max_tokens=4, messages=[{"role": "user", "content": "Still there?"}]
    )
    assert answer.usage.output_tokens == 4
