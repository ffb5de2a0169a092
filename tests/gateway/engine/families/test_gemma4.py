"""Gemma 4 through the engine (families/gemma4.py) on the tiny offline checkpoint (mlx-vlm's
own model classes; 10 layers of which 4 share KV, 6 caches; a 48-token window shorter than
one image's 64 soft tokens; bidirectional attention inside each image; a 70-token budget).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer equals mlx-vlm's
own `stream_generate` (tests/reference.py) with no image, one, two of different sizes (66 and
64 soft tokens) and two of one size, in float32 and bf16; cached == uncached (vision cache,
prefix blocks, follow-up turns, a hit that ends inside an image run); batched == alone; a
one-pixel change misses both caches; the token budget is part of the cache key and sizes
give the processor's token counts.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from support import EngineHarness, Run, chat_body, tiny_model

from gateway.engine.families.gemma4 import Gemma4
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
    return [first, first.resize((640, 360)), first.rotate(90)]


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_greedy_answer_equals_mlx_vlm_generate(weights: str, images: list[Image.Image]) -> None:
    """Invariant: engine == mlx-vlm's generate (prompt ids, answer ids, logprobs) with 0, 1
    and 2 images (two sizes, and one size: mlx-vlm batches those through its tower), image
    runs crossing 32-token block boundaries and the window wrapped."""
    path = tiny_model("gemma4", weights)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, Gemma4)
        cases = [(QUESTION, images[:1]), ("Hi", []), (LONG, images[:2]), (QUESTION, images[::2])]
        for question, media in cases:
            body = chat_body(question, images=len(media), max_tokens=12)
            messages = reference_messages(question, len(media))
            assert_reference_answer(h, path, body, media, messages)
    finally:
        h.close()


def test_token_counts_follow_the_image_shape(images: list[Image.Image]) -> None:
    """Invariant: `image_grid` (sizes only) gives the processor's own grid and token count
    (64 for 448 x 448, 66 for 640 x 360; a tiny image is scaled up to the budget)."""
    h = EngineHarness(path=tiny_model("gemma4"), max_batch=2)
    try:
        model = h.engine.model
        for image in [*images, images[0].resize((56, 56)), images[0].resize((900, 120))]:
            pixels, grid = model.preprocess(image)
            assert model.image_grid(*image.size) == grid
            tokens = model.span_ids(grid).count(model.image_token_id)
            assert tokens == grid[1] * grid[2] // 9 <= model.budget
        assert model.span_ids(model.image_grid(448, 448)).count(model.image_token_id) == 64
        assert model.span_ids(model.image_grid(640, 360)).count(model.image_token_id) == 66
    finally:
        h.close()


def test_token_budget_is_part_of_the_cache_key(tmp_path: Path) -> None:
    """Invariant: another `max_soft_tokens` (other pixels, other token count) is another
    processor fingerprint, so the same image never shares a vision-cache entry across
    budgets."""
    copy = tmp_path / "gemma4-140"
    shutil.copytree(tiny_model("gemma4"), copy)
    config = json.loads((copy / "processor_config.json").read_text())
    config["image_processor"]["max_soft_tokens"] = 140
    (copy / "processor_config.json").write_text(json.dumps(config))
    base, other = Gemma4(str(tiny_model("gemma4")), lazy=True), Gemma4(str(copy), lazy=True)
    assert other.budget == 140
    assert base.processor_fingerprint != other.processor_fingerprint
    assert other.image_grid(448, 448) != base.image_grid(448, 448)


def _conversation(h: EngineHarness, image: Image.Image) -> list[Run]:
    """Three turns about the image resending the history, then two new questions about it."""
    first = chat_body(LONG, images=1, max_tokens=10)
    then: list[Request] = [
        (chat_body(QUESTION, images=1, max_tokens=10), [image]),
        (chat_body(LONG, images=1, max_tokens=10), [image]),
    ]
    return conversation(h, (first, [image]), 3, lambda t: f"And what about part {t}?", then)


def test_cached_equals_uncached(images: list[Image.Image]) -> None:
    """Invariant: prefix-block hits (follow-up turns; a new question about the same image,
    whose hit ends inside the image run: its blocks were computed with the whole image
    visible, the rest is recomputed reading ahead) and vision hits change no token id and no
    logprob."""

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        assert all(r.finish.usage.cached_tokens > 0 for r in runs[1:3])
        body = chat_body(QUESTION, images=1, max_tokens=10)
        span = engine_request(cached, body, images[:1]).images[0].layout
        hit = runs[3].finish.usage.cached_tokens
        assert hit % 32 == 0 and span.start < hit < span.end  # ends inside the image
        assert runs[3].finish.usage.vision_hits == 1

    talk = functools.partial(_conversation, image=images[0])
    assert_cached_equals_uncached(tiny_model("gemma4"), talk, check, max_batch=4)


def test_batched_equals_alone(images: list[Image.Image]) -> None:
    """Invariant: rows decoded together (different prompt lengths, ring phases, left padding,
    image and text rows) answer as each does alone."""
    h = EngineHarness(path=tiny_model("gemma4"), max_batch=8)
    try:
        cases = [(QUESTION, images[:1]), ("Hi", []), (LONG, images[:2]), ("Short?", images[1:2])]
        requests = [(chat_body(q, images=len(m), max_tokens=12), m) for q, m in cases]
        assert_batched_equals_alone(h, requests)
    finally:
        h.close()


def test_one_pixel_change_misses_both_caches(images: list[Image.Image]) -> None:
    """Invariant: a different image never shares a vision entry or an image block."""
    h = EngineHarness(path=tiny_model("gemma4"), max_batch=2)
    try:
        body = chat_body(QUESTION, images=1, max_tokens=4)
        first, _ = assert_one_pixel_misses(h, body, images[0], (5, 5))
        assert first.finish.usage.vision_misses == 1
    finally:
        h.close()


def test_registry_maps_gemma4_to_its_family() -> None:
    """Invariant: a `model_type` "gemma4" checkpoint is served by `Gemma4`, and errors name it."""
    from gateway.engine.families.registry import family_for, supported_families

    assert family_for({"model_type": "gemma4", "vision_config": {}}) is Gemma4
    assert "gemma4" in supported_families()
