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

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from PIL import Image
from reference import reference_generate
from support import EngineHarness, chat_body, decoded, tiny_model

from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig
from gateway.engine.families.gemma4 import Gemma4

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"
LONG = "Tell me more about the colours and the shapes you can see here."


@pytest.fixture(scope="module")
def images() -> list[Image.Image]:
    first = Image.open(FIXTURES / "shapes.png").convert("RGB")
    return [first, first.resize((640, 360)), first.rotate(90)]


def _messages(question: str, n: int) -> list[dict]:
    return [
        {"role": "user", "content": [{"type": "image"}] * n + [{"type": "text", "text": question}]}
    ]


def _request(h: EngineHarness, question: str, media: list[Image.Image]) -> Any:
    """The EngineRequest the prompt builder makes for a chat body (prompt ids, spans)."""
    chat = parse_chat_request(chat_body(question, images=len(media)))
    return h.prompts.build(chat, [decoded(i) for i in media], "probe", 0.0)


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
            n = len(media)
            run = h.run(chat_body(question, images=n, max_tokens=12), media)
            ref = reference_generate(path, _messages(question, n), media, max_tokens=12)
            assert list(_request(h, question, media).prompt_ids) == list(ref.prompt_ids)
            assert run.token_ids == list(ref.token_ids)
            assert run.logprobs == list(ref.logprobs)  # tolerance zero
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


def _conversation(h: EngineHarness, image: Image.Image, turns: int = 3) -> list:
    """An image conversation resending its history each turn, then new questions about the
    same image."""
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
    """Invariant: prefix-block hits (follow-up turns; a new question about the same image,
    whose hit ends inside the image run: its blocks were computed with the whole image
    visible, the rest is recomputed reading ahead) and vision hits change no token id and no
    logprob."""
    path = tiny_model("gemma4")
    off = CacheConfig(prefix_enabled=False, vision_enabled=False)
    cached = EngineHarness(path=path, max_batch=4)
    plain = EngineHarness(path=path, max_batch=4, cache=off)
    try:
        with_cache, without = _conversation(cached, images[0]), _conversation(plain, images[0])
        for a, b in zip(with_cache, without, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs
        assert all(r.finish.usage.cached_tokens > 0 for r in with_cache[1:3])
        request = _request(cached, QUESTION, images[:1])
        span = request.images[0].layout
        hit = with_cache[3].finish.usage.cached_tokens
        assert hit % 32 == 0 and span.start < hit < span.end  # ends inside the image
        assert with_cache[3].finish.usage.vision_hits == 1
        assert all(r.finish.usage.cached_tokens == 0 for r in without)
    finally:
        cached.close()
        plain.close()


def test_batched_equals_alone(images: list[Image.Image]) -> None:
    """Invariant: rows decoded together (different prompt lengths, ring phases, left padding,
    image and text rows) answer as each does alone."""
    h = EngineHarness(path=tiny_model("gemma4"), max_batch=8)
    try:
        cases = [(QUESTION, images[:1]), ("Hi", []), (LONG, images[:2]), ("Short?", images[1:2])]
        bodies = [chat_body(q, images=len(m), max_tokens=12) for q, m in cases]
        media = [m for _, m in cases]
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
    h = EngineHarness(path=tiny_model("gemma4"), max_batch=2)
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


def test_registry_maps_gemma4_to_its_family() -> None:
    """Invariant: a `model_type` "gemma4" checkpoint is served by `Gemma4`, and errors name it."""
    from gateway.engine.families.registry import family_for, supported_families

    assert family_for({"model_type": "gemma4", "vision_config": {}}) is Gemma4
    assert "gemma4" in supported_families()
