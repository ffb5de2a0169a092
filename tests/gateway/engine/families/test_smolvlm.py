"""SmolVLM through the engine (families/smolvlm.py on families/vlm_base.py), on the tiny
offline checkpoint (Idefics3-style 64 px tiles + a global image, 16 tokens each, row/column
separators, a Llama-style 1D-RoPE language model).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer equals mlx-vlm's
own `stream_generate` (tests/reference.py) on the same checkpoint, images and question, with
the same prompt ids, for one image, a wide one, two in one turn and none, in float32 and
bfloat16; cached == uncached (vision cache, prefix blocks resumed inside an image span, a
follow-up turn, the disk tier after a restart); batched == alone; a one-pixel change misses
both caches. The grid from the size alone equals the processor's, and the processor settings
are part of the cache key.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from reference import reference_generate
from support import EngineHarness, chat_body, conversation, decoded, noise_image, tiny_model

from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig
from gateway.engine.families.smolvlm import SmolVLM

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"


def _shapes() -> Image.Image:
    return Image.open(FIXTURES / "shapes.png").convert("RGB")  # 448 x 448: 3 x 3 tiles


def _wide() -> Image.Image:
    return _shapes().resize((640, 360))  # 2 rows x 3 columns of tiles


def _messages(images: int, question: str = QUESTION) -> list[dict]:
    if not images:
        return [{"role": "user", "content": question}]
    content = [{"type": "image"}] * images + [{"type": "text", "text": question}]
    return [{"role": "user", "content": content}]


def _no_caches() -> CacheConfig:
    return CacheConfig(vision_enabled=False, prefix_enabled=False)


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_greedy_answer_equals_mlx_vlm_generate(weights: str) -> None:
    """Invariant: engine prompt ids, token ids and logprobs == mlx-vlm's own generate, for
    one image, a wide image, two images in one turn and a text-only question."""
    path = tiny_model("smolvlm", weights)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, SmolVLM)
        for images in ([_shapes()], [_wide()], [_shapes(), _wide()], []):
            ref = reference_generate(path, _messages(len(images)), images, max_tokens=12)
            body = chat_body(QUESTION, images=len(images), max_tokens=12)
            request = h.prompts.build(
                parse_chat_request(body), [decoded(i) for i in images], "layout", 0.0
            )
            assert request.prompt_ids == ref.prompt_ids  # the expansion, separators included
            run = h.run(body, images)
            assert run.token_ids == list(ref.token_ids), len(images)
            assert run.logprobs == list(ref.logprobs)  # tolerance zero
    finally:
        h.close()


def test_grid_from_size_equals_the_processors() -> None:
    """Invariant: `image_grid` (sizes only) == the processor's tiling, and the span holds
    `image_seq_len` image tokens per tile plus the global image."""
    model = SmolVLM(str(tiny_model("smolvlm")), lazy=True)
    image_id = model.image_token_id
    sizes = [(448, 448), (640, 360), (360, 640), (56, 56), (30, 1000), (1000, 30), (191, 193)]
    for width, height in [*sizes, (100, 64), (2000, 1500), (1, 1)]:
        pixels, grid = model.preprocess(Image.new("RGB", (width, height), (9, 99, 199)))
        assert model.image_grid(width, height) == grid, (width, height)
        tiles = pixels.shape[0]
        assert pixels.shape[1:] == (3, model.tile, model.tile)
        run = model.span_ids(grid)
        assert run.count(image_id) == tiles * model.seq_len
    assert model.image_grid(448, 448) == (1, 24, 24)  # 3 x 3 tiles of 8 x 8 patches


def test_processor_settings_are_part_of_the_cache_key(tmp_path: Path) -> None:
    """Invariant: a tiling setting that changes pixels and token counts changes
    `processor_fingerprint` (the vision-cache key) and the span length (the prefix key)."""
    source = tiny_model("smolvlm")
    other = tmp_path / "smolvlm-128"
    shutil.copytree(source, other)
    config = json.loads((other / "preprocessor_config.json").read_text())
    config["size"] = {"longest_edge": 128}
    (other / "preprocessor_config.json").write_text(json.dumps(config))
    a, b = SmolVLM(str(source), lazy=True), SmolVLM(str(other), lazy=True)
    assert a.processor_fingerprint != b.processor_fingerprint
    assert a.image_grid(448, 448) != b.image_grid(448, 448)


def test_cached_equals_uncached() -> None:
    """Invariant: a conversation about one image (each turn resending the history, then a
    fresh question) answers the same with the caches as without; the fresh question reads
    prefix blocks that end inside the image span and the image's features from the vision
    cache."""
    path = tiny_model("smolvlm")
    cached = EngineHarness(path=path, max_batch=4)
    plain = EngineHarness(path=path, max_batch=4, cache=_no_caches())
    try:
        image = _shapes()
        with_cache, without = conversation(cached, image, turns=3), conversation(plain, image, 3)
        for a, b in zip(with_cache, without, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs
        assert all(r.finish.usage.cached_tokens > 0 for r in with_cache[1:])
        fresh = with_cache[-1].finish.usage
        model = cached.engine.model
        start, span = (
            5,
            len(model.span_ids(model.image_grid(448, 448))),
        )  # after "<|im_start|>User:"
        assert start < fresh.cached_tokens < start + span  # resumed inside the image span
        assert fresh.vision_hits == 1
        assert all(r.finish.usage.cached_tokens == 0 for r in without)
    finally:
        cached.close()
        plain.close()


def test_batched_equals_alone() -> None:
    """Invariant: requests with different images (and a text one) prefilled and decoded
    together answer as each does alone."""
    path = tiny_model("smolvlm")
    h = EngineHarness(path=path, max_batch=8, cache=_no_caches())
    try:
        images = [[noise_image(1, 200, 120)], [noise_image(2, 90, 300)], [_shapes()], []]
        bodies = [
            chat_body(f"Question {i}?", images=len(im), max_tokens=10)
            for i, im in enumerate(images)
        ]
        alone = [h.run(b, im) for b, im in zip(bodies, images, strict=True)]
        with h.arriving_together():
            runs = [h.submit(b, im) for b, im in zip(bodies, images, strict=True)]
        for a, b in zip(alone, [r.wait() for r in runs], strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs
    finally:
        h.close()


def test_one_pixel_change_misses_both_caches() -> None:
    """Invariant: an image one pixel away from a cached one gets no vision hit and no prefix
    block past its span's start, and answers as it does with no caches at all."""
    path = tiny_model("smolvlm")
    h = EngineHarness(path=path, max_batch=4)
    plain = EngineHarness(path=path, max_batch=4, cache=_no_caches())
    try:
        image = _shapes()
        changed = image.copy()
        r, g, b = changed.getpixel((300, 17))
        changed.putpixel((300, 17), ((r + 1) % 256, g, b))
        body = chat_body(QUESTION, images=1, max_tokens=10)
        h.run(body, [image])
        again = h.run(body, [changed])
        assert again.finish.usage.vision_hits == 0 and again.finish.usage.vision_misses == 1
        assert again.finish.usage.cached_tokens <= 5  # nothing of the image span
        cold = plain.run(body, [changed])
        assert (again.token_ids, again.logprobs) == (cold.token_ids, cold.logprobs)
    finally:
        h.close()
        plain.close()


def test_a_restarted_engine_answers_from_the_disk_tier_exactly(tmp_path: Path) -> None:
    """Invariant: after a restart on the same --cache-dir the image prompt's KV blocks come
    from disk and the answer is the no-cache answer (token ids and logprobs)."""
    path = tiny_model("smolvlm")
    body = chat_body(QUESTION, images=1, max_tokens=10)
    runs = []
    for caches in (CacheConfig(cache_dir=tmp_path), CacheConfig(cache_dir=tmp_path), _no_caches()):
        h = EngineHarness(path=path, cache=caches, warmup=False)
        try:
            runs.append(h.run(body, [_shapes()]))
        finally:
            h.close()
    first, restarted, cold = runs
    assert restarted.finish.usage.cached_tokens > 0 and first.finish.usage.cached_tokens == 0
    for run in (first, restarted):
        assert (run.token_ids, run.logprobs) == (cold.token_ids, cold.logprobs)
