"""End to end: `vision-gateway serve --model <the tiny mistral3 checkpoint>` (two processes,
warm-up included), through the `openai` and `anthropic` SDKs.

Pinned: /v1/models and /v1/cache/stats name the family with both caches on; an image question
over Chat Completions answers with mlx-vlm's own generate's tokens and logprobs, streamed as
plain, and a repeat reads the prefix cache; Anthropic's Messages (plain and streamed) and the
Responses API (a follow-up through `previous_response_id` reads the first turn's KV and
answers as the full conversation does with the caches cleared) serve it, a system prompt
included; a JSON-schema
`response_format` constrains its answer.
"""

from __future__ import annotations

import base64
import io
import json

import anthropic
import httpx
import openai
import pytest
from PIL import Image
from reference import reference_generate
from support import ServerProcess, noise_image, tiny_model

IMAGE = noise_image(7, 96, 64)  # 4 x 3 cells: 12 [IMG] + 2 [IMG_BREAK] + [IMG_END]
QUESTION = "What is in this picture?"


def _png(image: Image.Image) -> str:
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


URI = "data:image/png;base64," + _png(IMAGE)


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess("--kv-block-tokens", "16", arch="mistral3")
    yield proc
    assert proc.stop(), proc.log()


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0)


def _chat(question: str = QUESTION) -> list[dict]:
    content = [
        {"type": "image_url", "image_url": {"url": URI}},
        {"type": "text", "text": question},
    ]
    return [{"role": "user", "content": content}]


def test_models_and_stats_name_the_family(server: ServerProcess) -> None:
    card = httpx.get(server.base_url + "/v1/models").json()["data"][0]
    assert (card["family"], card["model_type"], card["media"]) == (
        "mistral3",
        "mistral3",
        ["image"],
    )
    family = httpx.get(server.base_url + "/v1/cache/stats").json()["family"]
    assert (family["prefix_cache"], family["vision_cache"]) == ("on", "on")


def test_openai_answer_is_the_references_streamed_and_cached(client: openai.OpenAI) -> None:
    """Invariant: the served greedy answer is mlx-vlm's (tokens and logprobs), the stream
    says the same, and a repeat of the prompt is a prefix-cache hit with the same answer."""
    kw = {"model": "test", "messages": _chat(), "max_tokens": 8, "temperature": 0}
    plain = client.chat.completions.create(**kw, logprobs=True)  # type: ignore[call-overload]
    ref = reference_generate(
        tiny_model("mistral3"),
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": QUESTION}]}],
        [IMAGE],
        max_tokens=8,
    )
    assert [t.logprob for t in plain.choices[0].logprobs.content] == list(ref.logprobs)
    chunks = client.chat.completions.create(**kw, stream=True)  # type: ignore[call-overload]
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == plain.choices[0].message.content
    again = client.chat.completions.create(**kw)  # type: ignore[call-overload]
    assert again.choices[0].message.content == plain.choices[0].message.content
    assert again.usage.prompt_tokens_details.cached_tokens > 0


def test_anthropic_messages_plain_and_streamed(server: ServerProcess) -> None:
    client = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    source = {"type": "base64", "media_type": "image/png", "data": _png(IMAGE)}
    content = [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]
    # Anthropic's `system` becomes a leading system message: a plain string, which Mistral
    # Small 3.1's template reads as a list of parts (the family renders it as one).
    messages = [{"role": "user", "content": content}]
    kw = {"model": "test", "max_tokens": 6, "system": "Be brief.", "messages": messages}
    plain = client.messages.create(**kw, extra_body={"temperature": 0})  # type: ignore[arg-type]
    assert plain.usage.output_tokens == 6 and plain.stop_reason == "max_tokens"
    with client.messages.stream(**kw, extra_body={"temperature": 0}) as stream:  # type: ignore[arg-type]
        text = "".join(stream.text_stream)
    assert text == plain.content[0].text


def test_responses_follow_up_reads_the_first_turns_kv(
    server: ServerProcess, client: openai.OpenAI
) -> None:
    """Invariant: turn 2 through `previous_response_id` hits the cache and answers as the
    same conversation sent in full after the caches were cleared."""
    first_input = [
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": URI},
                {"type": "input_text", "text": QUESTION},
            ],
        }
    ]
    kw = {"model": "test", "temperature": 0, "max_output_tokens": 6}
    first = client.responses.create(input=first_input, **kw)  # type: ignore[arg-type]
    follow = "Tell me more."
    second = client.responses.create(
        input=follow,
        previous_response_id=first.id,
        **kw,  # type: ignore[arg-type]
    )
    assert second.usage.input_tokens_details.cached_tokens > 0
    assert httpx.post(server.base_url + "/v1/cache/clear").status_code == 200
    history = [
        *_chat(),
        {"role": "assistant", "content": first.output_text},
        {"role": "user", "content": follow},
    ]
    full = client.chat.completions.create(
        model="test", messages=history, max_tokens=6, temperature=0
    )
    assert full.usage.prompt_tokens_details.cached_tokens == 0
    assert full.choices[0].message.content == second.output_text


def test_structured_output(client: openai.OpenAI) -> None:
    schema = {
        "type": "object",
        "properties": {"cat": {"type": "boolean"}},  # finite: random weights ramble
        "required": ["cat"],
        "additionalProperties": False,
    }
    answer = client.chat.completions.create(
        model="test",
        messages=_chat("Is there a cat? Answer in JSON."),
        max_tokens=40,
        temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    assert answer.choices[0].finish_reason == "stop"
    parsed = json.loads(answer.choices[0].message.content or "")
    assert set(parsed) == {"cat"} and isinstance(parsed["cat"], bool)
