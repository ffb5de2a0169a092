"""End to end: `vision-gateway serve --model <the tiny gemma4 checkpoint>` (two processes),
through the `openai` and `anthropic` SDKs.

Pinned: /v1/models and /v1/cache/stats name the family with both caches on; an image question
through Chat Completions answers with exactly mlx-vlm's logprobs (over HTTP), plain ==
streamed, and a repeat reads the prefix cache; the Anthropic Messages API (plain and
streamed) and the Responses API (a follow-up through `previous_response_id` reads the cache)
answer about an image; structured output constrains a gemma4 answer.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import anthropic
import httpx
import openai
import pytest
from reference import reference_generate
from support import tiny_model

from bench.server import LocalServer

IMAGE_PATH = Path(__file__).resolve().parents[4] / "fixtures" / "shapes.png"
IMAGE = "data:image/png;base64," + base64.b64encode(IMAGE_PATH.read_bytes()).decode()
QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def server():
    path = str(tiny_model("gemma4"))
    proc = LocalServer(["--model", path, "--served-model-name", "test", "--no-warmup"])
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(server: LocalServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def _image_turn(question: str = QUESTION) -> list[dict]:
    content = [
        {"type": "image_url", "image_url": {"url": IMAGE}},
        {"type": "text", "text": question},
    ]
    return [{"role": "user", "content": content}]


def test_models_and_stats_name_the_family(server: LocalServer) -> None:
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert (card["family"], card["model_type"], card["media"]) == ("gemma4", "gemma4", ["image"])
    stats = httpx.get(server.base_url + "/v1/cache/stats").json()
    assert stats["family"]["prefix_cache"] == "on" and stats["family"]["vision_cache"] == "on"


def test_openai_answer_is_mlx_vlms_streamed_and_cached(client: openai.OpenAI) -> None:
    """Invariant: over HTTP the answer's logprobs are mlx-vlm's (tolerance zero); streamed ==
    plain; the repeat is a prefix-cache hit with the same answer."""
    kw = {"model": "test", "messages": _image_turn(), "max_tokens": 8, "temperature": 0}
    plain = client.chat.completions.create(**kw, logprobs=True)  # type: ignore[call-overload]
    ref = reference_generate(
        tiny_model("gemma4"),
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
        [str(IMAGE_PATH)],
        max_tokens=8,
    )
    assert [e.logprob for e in plain.choices[0].logprobs.content] == list(ref.logprobs)
    chunks = client.chat.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    again = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert again.choices[0].message.content == plain.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_anthropic_messages_plain_and_streamed(server: LocalServer) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": IMAGE.split(",")[1]}
    content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
    messages = [{"role": "user", "content": content}]
    greedy = {"temperature": 0}  # (Anthropic samples at 1.0 by default)
    kw = {"model": "test", "max_tokens": 6, "messages": messages, "extra_body": greedy}
    plain = client.messages.create(**kw)  # type: ignore[arg-type]
    assert plain.usage.output_tokens == 6
    with client.messages.stream(**kw) as stream:  # type: ignore[arg-type]
        streamed = "".join(stream.text_stream)
    assert streamed == "".join(b.text for b in plain.content if b.type == "text")


def test_responses_follow_up_reads_the_cache(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="test",
        temperature=0,
        max_output_tokens=6,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": IMAGE},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
    )
    second = client.responses.create(
        model="test",
        temperature=0,
        max_output_tokens=6,
        input="Tell me more about the colours.",
        previous_response_id=first.id,
    )
    assert second.usage.output_tokens == 6
    assert second.usage.input_tokens_details.cached_tokens > 0


def test_structured_output(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"round": {"type": "boolean"}},  # finite for a random-weight model
        "required": ["round"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(  # type: ignore[call-overload]
        model="test",
        messages=_image_turn("Is there a circle? Answer as JSON."),
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    parsed = json.loads(answer.choices[0].message.content)
    assert set(parsed) == {"round"} and isinstance(parsed["round"], bool)
