"""End to end: `vision-gateway serve` on the tiny SmolVLM checkpoint (two processes, the
engine's own), through the `openai` and `anthropic` SDKs.

Pinned: /v1/models and /v1/cache/stats name the family with both caches on; an image question
through Chat Completions gives mlx-vlm's own greedy tokens and logprobs (tests/reference.py),
streamed and plain alike; the Anthropic Messages API answers the same image; a Responses
follow-up (`previous_response_id`) reads the first turn from the prefix cache; a JSON-schema
`response_format` constrains the answer.
"""

from __future__ import annotations

import base64
import io
import json

import anthropic
import httpx
import pytest
from PIL import Image
from reference import reference_generate
from support import ServerProcess, noise_image, tiny_model

QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--no-warmup", "--kv-block-tokens", "8", arch="smolvlm")
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def image() -> Image.Image:
    return noise_image(7, 150, 100)  # 3 x 2 tiles + the global image


def _png(image: Image.Image) -> str:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return base64.b64encode(out.getvalue()).decode()


def _content(image: Image.Image, question: str = QUESTION) -> list[dict]:
    url = "data:image/png;base64," + _png(image)
    return [{"type": "image_url", "image_url": {"url": url}}, {"type": "text", "text": question}]


def test_models_and_stats_name_the_family(server: ServerProcess) -> None:
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert (card["family"], card["model_type"], card["media"]) == ("smolvlm", "smolvlm", ["image"])
    family = httpx.get(server.base_url + "/v1/cache/stats").json()["family"]
    assert (family["prefix_cache"], family["vision_cache"]) == ("on", "on")


def test_chat_equals_mlx_vlm_generate_plain_and_streamed(
    server: ServerProcess, image: Image.Image
) -> None:
    """Invariant: the OpenAI API's greedy answer (token logprobs included) is mlx-vlm's."""
    client = server.client()
    messages = [{"role": "user", "content": _content(image)}]
    kw = {"model": "test", "messages": messages, "max_tokens": 6, "temperature": 0}
    plain = client.chat.completions.create(**kw, logprobs=True)  # type: ignore[call-overload]
    ref = reference_generate(
        tiny_model("smolvlm"),
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
        [image],
        max_tokens=6,
    )
    assert [t.logprob for t in plain.choices[0].logprobs.content] == list(ref.logprobs)
    assert plain.usage.prompt_tokens == len(ref.prompt_ids)
    chunks = client.chat.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content


def test_anthropic_messages_answer_an_image(server: ServerProcess, image: Image.Image) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": _png(image)}
    content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
    kw = {"model": "test", "max_tokens": 6, "extra_body": {"temperature": 0}}
    answer = client.messages.create(messages=[{"role": "user", "content": content}], **kw)
    assert answer.usage.output_tokens == 6 and answer.stop_reason == "max_tokens"
    with client.messages.stream(messages=[{"role": "user", "content": content}], **kw) as s:
        streamed = "".join(s.text_stream)
    assert streamed == answer.content[0].text


def test_responses_follow_up_reads_the_cache(server: ServerProcess, image: Image.Image) -> None:
    client = server.client()
    url = "data:image/png;base64," + _png(image)
    first = client.responses.create(
        model="test",
        temperature=0,
        max_output_tokens=6,
        input=[
            {
                "role": "user",
                "content": [
                    {"type": "input_image", "image_url": url},
                    {"type": "input_text", "text": QUESTION},
                ],
            }
        ],
    )
    second = client.responses.create(
        model="test",
        temperature=0,
        max_output_tokens=6,
        previous_response_id=first.id,
        input="Tell me more.",
    )
    assert second.usage.input_tokens > first.usage.input_tokens
    assert second.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens // 8 * 8


def test_structured_output(server: ServerProcess, image: Image.Image) -> None:
    schema = {
        "type": "object",
        "properties": {"cat": {"type": "boolean"}},  # finite: random weights ramble
        "required": ["cat"],
        "additionalProperties": False,
    }
    reply = server.client().chat.completions.create(
        model="test",
        messages=[{"role": "user", "content": _content(image, "Is there a cat? JSON.")}],
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    )
    assert reply.choices[0].finish_reason == "stop"
    answer = json.loads(reply.choices[0].message.content or "")
    assert set(answer) == {"cat"} and isinstance(answer["cat"], bool)
