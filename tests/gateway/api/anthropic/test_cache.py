"""Anthropic requests through the engine, on every Qwen-VL architecture.

Pinned: a Messages-API conversation about an image (system prompt, base64 image, follow-up
turns, a prefill) gives the same prompt tokens as the equivalent OpenAI request, and greedy
output with caches == without caches (token ids and logprobs), while later turns read their
prompt from the prefix cache.
"""

from __future__ import annotations

import base64
import dataclasses

import pytest
from support import EngineHarness, decoded, noise_image, noise_png

from gateway.api.anthropic.parse import parse_messages_request
from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
PNG = noise_png(7, 84, 56)
IMAGE = noise_image(7, 84, 56)  # the pixels of PNG
BLOCK = 8  # exact-reuse block (tokens)


@pytest.fixture(scope="module", params=ARCHS)
def pair(request: pytest.FixtureRequest):
    # Small exact-reuse blocks (both sides, the uncached path follows the same rule): hits
    # are whole blocks, and these prompts are a few dozen tokens.
    on = CacheConfig(kv_block_tokens=BLOCK)
    cached = EngineHarness(request.param, max_batch=4, prefill_chunk_tokens=16, cache=on)
    off = CacheConfig(vision_enabled=False, prefix_enabled=False, kv_block_tokens=BLOCK)
    plain = EngineHarness(request.param, max_batch=4, cache=off)
    yield cached, plain
    cached.close()
    plain.close()


def _body(messages: list[dict]) -> dict:
    return {
        "model": "t",
        "max_tokens": 6,
        "temperature": 0,
        "system": "You are terse.",
        "messages": messages,
    }


def _first_turn() -> dict:
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()}
    return {
        "role": "user",
        "content": [{"type": "image", "source": source}, {"type": "text", "text": "What is it?"}],
    }


def _conversation(h: EngineHarness) -> list:
    """Three turns, then the last one again with a prefill; logprobs asked of the engine."""
    messages = [_first_turn()]
    runs = []
    for turn in range(3):
        chat = dataclasses.replace(parse_messages_request(_body(messages)), logprobs=True)
        runs.append(h.submit_chat(chat, [IMAGE]).wait())
        messages += [
            {"role": "assistant", "content": runs[-1].text},
            {"role": "user", "content": f"And part {turn + 2}?"},
        ]
    prefill = [*messages[:-2], {"role": "assistant", "content": "It is"}]
    chat = dataclasses.replace(parse_messages_request(_body(prefill)), logprobs=True)
    runs.append(h.submit_chat(chat, [IMAGE]).wait())
    return runs


def test_anthropic_prompt_equals_the_openai_prompt(pair) -> None:  # noqa: ANN001
    """Invariant: the same conversation through either API is the same token sequence."""
    cached, _ = pair
    url = "data:image/png;base64," + base64.b64encode(PNG).decode()
    openai = {
        "model": "t",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": url}},
                    {"type": "text", "text": "What is it?"},
                ],
            },
        ],
    }
    build = cached.prompts.build
    a = build(parse_messages_request(_body([_first_turn()])), [decoded(IMAGE)], "a", 0.0)
    o = build(parse_chat_request(openai), [decoded(IMAGE)], "o", 0.0)
    assert a.prompt_ids == o.prompt_ids
    assert [i.content_hash for i in a.images] == [i.content_hash for i in o.images]


def test_cached_output_equals_uncached_for_anthropic_requests(pair) -> None:  # noqa: ANN001
    """Invariant: greedy tokens and logprobs are the same with and without caches, for every
    turn and for a prefilled turn; turns after the first read the previous turn's whole prompt
    blocks from the cache (the control that the cache was used at all)."""
    cached, plain = pair
    with_cache, without = _conversation(cached), _conversation(plain)
    for turn, (a, b) in enumerate(zip(with_cache, without, strict=True)):
        assert a.token_ids == b.token_ids, f"turn {turn + 1}"
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-4), f"turn {turn + 1}"
    usage = [r.finish.usage for r in with_cache]
    assert usage[0].cached_tokens == 0
    for before, after in zip(usage[:2], usage[1:3], strict=True):  # the three growing turns
        assert after.cached_tokens >= before.prompt_tokens // BLOCK * BLOCK > 0, usage
    assert all(r.finish.usage.cached_tokens == 0 for r in without)
