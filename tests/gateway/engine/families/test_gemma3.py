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

from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from reference import reference_generate
from support import EngineHarness, chat_body, decoded, tiny_model

from caches.prefix import ImageSpan
from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig
from gateway.engine.families.gemma3 import Gemma3

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"
LONG = "Tell me more about the colours and the shapes you can see here."


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    first = Image.open(FIXTURES / "shapes.png").convert("RGB")
    return [first, first.rotate(90)]


def _messages(question: str, n: int) -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": question}]}
    ]


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_greedy_answer_equals_mlx_vlm_generate(weights: str, images: list[Image.Image]) -> None:
    """Invariant: engine == mlx-vlm's generate (prompt ids, answer ids, logprobs) with
    0, 1 and 2 images, the window wrapped by the image and by the answer."""
    path = tiny_model("gemma3", weights)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, Gemma3)
        for question, n in [(QUESTION, 1), ("Hi", 0), (LONG, 2)]:
            run = h.run(chat_body(question, images=n, max_tokens=12), images[:n])
            ref = reference_generate(path, _messages(question, n), images[:n], max_tokens=12)
            assert list(_request(h, question, images[:n]).prompt_ids) == list(ref.prompt_ids)
            assert run.token_ids == list(ref.token_ids)
            assert run.logprobs == list(ref.logprobs)  # tolerance zero
    finally:
        h.close()


def _request(h: EngineHarness, question: str, media: list[Image.Image]) -> Any:
    """The EngineRequest the prompt builder makes for a chat body (prompt ids, spans)."""
    chat = parse_chat_request(chat_body(question, images=len(media)))
    return h.prompts.build(chat, [decoded(i) for i in media], "probe", 0.0)


def _conversation(h: EngineHarness, image: Image.Image, turns: int = 3) -> list:
    """An image conversation resending its history each turn, then the first question again."""
    messages: list[dict] = [
        {
            "role": "user",
            "content": [
                {"type": "image_url", "image_url": {"url": "x"}},
                {"type": "text", "text": LONG},
            ],
        }
    ]
    runs = []
    for turn in range(turns):
        body = {**chat_body("", max_tokens=10), "messages": messages}
        run = h.run(body, [image])
        runs.append(run)
        messages = [
            *messages,
            {"role": "assistant", "content": run.text},
            {"role": "user", "content": f"And what about part {turn + 2}?"},
        ]
    runs.append(h.run(chat_body(QUESTION, images=1, max_tokens=10), [image]))
    runs.append(h.run(chat_body(LONG, images=1, max_tokens=10), [image]))
    return runs


def test_cached_equals_uncached(images: list[Image.Image]) -> None:
    """Invariant: prefix-block hits (follow-up turns, hits ending inside the image) and vision
    hits change no token id and no logprob."""
    path = tiny_model("gemma3")
    off = CacheConfig(prefix_enabled=False, vision_enabled=False)
    cached = EngineHarness(path=path, max_batch=4)
    plain = EngineHarness(path=path, max_batch=4, cache=off)
    try:
        with_cache, without = _conversation(cached, images[0]), _conversation(plain, images[0])
        for a, b in zip(with_cache, without, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs
        assert all(r.finish.usage.cached_tokens > 0 for r in with_cache[1:3])
        # the repeat of a new question about the same image: a hit inside the image span
        # (whole 32-token blocks) plus the vision cache for the rest of it
        assert with_cache[3].finish.usage.cached_tokens % 32 == 0
        assert with_cache[3].finish.usage.vision_hits == 1
        assert all(r.finish.usage.cached_tokens == 0 for r in without)
    finally:
        cached.close()
        plain.close()


def test_the_prompts_last_token_is_never_stored(images: list[Image.Image]) -> None:
    """Invariant: the prefix cache holds only KV computed in block forwards: whole blocks of
    the prompt before its last token (that token is a one-row step, `last_token_apart`)."""
    h = EngineHarness(path=tiny_model("gemma3"), max_batch=2)
    try:
        # a prompt of whole blocks: its last block holds the last token
        candidates = (w * n for w in ("x ", "a, ", "cat ") for n in range(1, 60))
        question = next(
            q for q in candidates if len(_request(h, q, images[:1]).prompt_ids) % 32 == 0
        )
        run = h.run(chat_body(question, images=1, max_tokens=2), images[:1])
        prompt_len = run.finish.usage.prompt_tokens
        assert prompt_len % 32 == 0
        request = _request(h, question, images[:1])
        spans = [ImageSpan(i.layout.start, i.layout.end, i.content_hash) for i in request.images]
        stored = h.engine.prefix_cache.stored_blocks(request.prompt_ids, spans)
        assert stored * 32 == prompt_len - 32
    finally:
        h.close()


def test_batched_equals_alone(images: list[Image.Image]) -> None:
    """Invariant: rows decoded together (different prompt lengths, so different ring phases
    and left padding) answer as each does alone."""
    h = EngineHarness(path=tiny_model("gemma3"), max_batch=8)
    try:
        cases = [(QUESTION, 1), ("Hi", 0), (LONG, 2), ("Short?", 1)]
        bodies = [chat_body(q, images=n, max_tokens=12) for q, n in cases]
        media = [images[:n] for _, n in cases]
        alone = [h.run(b, m) for b, m in zip(bodies, media)]
        with h.arriving_together():
            runs = [h.submit(b, m) for b, m in zip(bodies, media)]
        together = [r.wait() for r in runs]
        for a, b in zip(alone, together, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs
    finally:
        h.close()


def test_one_pixel_change_misses_both_caches(images: list[Image.Image]) -> None:
    """Invariant: a different image never shares a vision entry or an image block."""
    h = EngineHarness(path=tiny_model("gemma3"), max_batch=2)
    try:
        changed = images[0].copy()
        changed.putpixel((5, 5), (1, 2, 3))
        first = h.run(chat_body(QUESTION, images=1, max_tokens=4), [images[0]])
        second = h.run(chat_body(QUESTION, images=1, max_tokens=4), [changed])
        assert second.finish.usage.vision_hits == 0
        assert first.finish.usage.vision_misses == 1
        image_start = _request(h, QUESTION, [changed]).images[0].layout.start
        assert second.finish.usage.cached_tokens <= image_start  # nothing from the image on
    finally:
        h.close()
