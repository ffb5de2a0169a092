"""Gemma 3 through the engine (families/gemma3.py) on the tiny offline checkpoint (mlx-vlm's
own model classes; a 48-token sliding window, shorter than one image's 66-token span, so
every image prompt wraps it).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer equals mlx-vlm's
own `stream_generate` (tests/reference.py) with one image, two images and none, in float32
and bf16; cached == uncached (vision cache, prefix blocks, follow-up turns, a hit that ends
inside an image); batched == alone; a one-pixel change misses both caches; the prompt's last
token is never stored.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from PIL import Image
from support import EngineHarness, Run, chat_body, tiny_model

from caches.prefix import ImageSpan
from gateway.engine.families.gemma3 import Gemma3
from tests.gateway.engine.families.common import (
    Request,
    assert_batched_equals_alone,
    assert_cached_equals_uncached,
    assert_one_pixel_misses,
    assert_reference_answer,
    conversation,
    engine_request,
    reference_messages,
)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"
LONG = "Tell me more about the colours and the shapes you can see here."


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    first = Image.open(FIXTURES / "shapes.png").convert("RGB")
    return [first, first.rotate(90)]


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_greedy_answer_equals_mlx_vlm_generate(weights: str, images: list[Image.Image]) -> None:
    """Invariant: engine == mlx-vlm's generate (prompt ids, answer ids, logprobs) with
    0, 1 and 2 images, the window wrapped by the image and by the answer."""
    path = tiny_model("gemma3", weights)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, Gemma3)
        for question, n in [(QUESTION, 1), ("Hi", 0), (LONG, 2)]:
            body = chat_body(question, images=n, max_tokens=12)
            messages = reference_messages(question, n)
            assert_reference_answer(h, path, body, images[:n], messages)
    finally:
        h.close()


def _conversation(h: EngineHarness, image: Image.Image) -> list[Run]:
    """Three turns about the image resending the history, then two new questions about it."""
    first = chat_body(LONG, images=1, max_tokens=10)
    then: list[Request] = [
        (chat_body(QUESTION, images=1, max_tokens=10), [image]),
        (chat_body(LONG, images=1, max_tokens=10), [image]),
    ]
    return conversation(h, (first, [image]), 3, lambda t: f"And what about part {t}?", then)


def test_cached_equals_uncached(images: list[Image.Image]) -> None:
    """Invariant: prefix-block hits (follow-up turns, hits ending inside the image) and vision
    hits change no token id and no logprob."""

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        assert all(r.finish.usage.cached_tokens > 0 for r in runs[1:3])
        # the repeat of a new question about the same image: a hit inside the image span
        # (whole 32-token blocks) plus the vision cache for the rest of it
        assert runs[3].finish.usage.cached_tokens % 32 == 0
        assert runs[3].finish.usage.vision_hits == 1

    talk = functools.partial(_conversation, image=images[0])
    assert_cached_equals_uncached(tiny_model("gemma3"), talk, check, max_batch=4)


def test_the_prompts_last_token_is_never_stored(images: list[Image.Image]) -> None:
    """Invariant: the prefix cache holds only KV computed in block forwards: whole blocks of
    the prompt before its last token (that token is a one-row step, `last_token_apart`)."""
    h = EngineHarness(path=tiny_model("gemma3"), max_batch=2)
    try:

        def prompt_len(q: str) -> int:
            return len(engine_request(h, chat_body(q, images=1), images[:1]).prompt_ids)

        # a prompt of whole blocks: its last block holds the last token
        candidates = (w * n for w in ("x ", "a, ", "cat ") for n in range(1, 60))
        question = next(q for q in candidates if prompt_len(q) % 32 == 0)
        body = chat_body(question, images=1, max_tokens=2)
        run = h.run(body, images[:1])
        length = run.finish.usage.prompt_tokens
        assert length % 32 == 0
        request = engine_request(h, body, images[:1])
        spans = [ImageSpan(i.layout.start, i.layout.end, i.content_hash) for i in request.images]
        stored = h.engine.prefix_cache.stored_blocks(request.prompt_ids, spans)
        assert stored * 32 == length - 32
    finally:
        h.close()


def test_batched_equals_alone(images: list[Image.Image]) -> None:
    """Invariant: rows decoded together (different prompt lengths, so different ring phases
    and left padding) answer as each does alone."""
    h = EngineHarness(path=tiny_model("gemma3"), max_batch=8)
    try:
        cases = [(QUESTION, 1), ("Hi", 0), (LONG, 2), ("Short?", 1)]
        requests = [(chat_body(q, images=n, max_tokens=12), images[:n]) for q, n in cases]
        assert_batched_equals_alone(h, requests)
    finally:
        h.close()


def test_one_pixel_change_misses_both_caches(images: list[Image.Image]) -> None:
    """Invariant: a different image never shares a vision entry or an image block."""
    h = EngineHarness(path=tiny_model("gemma3"), max_batch=2)
    try:
        body = chat_body(QUESTION, images=1, max_tokens=4)
        first, _ = assert_one_pixel_misses(h, body, images[0], (5, 5))
        assert first.finish.usage.vision_misses == 1
    finally:
        h.close()
