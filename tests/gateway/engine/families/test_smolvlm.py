"""SmolVLM through the engine (families/smolvlm.py on families/vlm_base.py), on the tiny
offline checkpoint (Idefics3-style 64 px tiles + a global image, 16 tokens each, row/column
separators, a Llama-style 1D-RoPE language model).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer equals mlx-vlm's
own `stream_generate` (tests/reference.py) on the same checkpoint, images and question, with
the same prompt ids, for one image, a wide one, two in one turn and none, in float32 and
bfloat16; cached == uncached (vision cache, prefix blocks resumed inside an image span, a
follow-up turn; the disk tier after a restart: test_families_disk.py); batched == alone; a
one-pixel change misses both caches. The grid from the size alone equals the processor's, and
the processor settings are part of the cache key.
"""

from __future__ import annotations

import functools
import json
import shutil
from pathlib import Path

import pytest
from PIL import Image
from support import EngineHarness, Run, chat_body, conversation, noise_image, tiny_model

from gateway.engine.families.smolvlm import SmolVLM
from tests.gateway.engine.families.common import (
    NO_CACHES,
    assert_batched_equals_alone,
    assert_cached_equals_uncached,
    assert_one_pixel_misses,
    assert_reference_answer,
    one_pixel_changed,
    reference_messages,
)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"


def _shapes() -> Image.Image:
    return Image.open(FIXTURES / "shapes.png").convert("RGB")  # 448 x 448: 3 x 3 tiles


def _wide() -> Image.Image:
    return _shapes().resize((640, 360))  # 2 rows x 3 columns of tiles


@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_greedy_answer_equals_mlx_vlm_generate(weights: str) -> None:
    """Invariant: engine prompt ids, token ids and logprobs == mlx-vlm's own generate, for
    one image, a wide image, two images in one turn and a text-only question."""
    path = tiny_model("smolvlm", weights)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, SmolVLM)
        for images in ([_shapes()], [_wide()], [_shapes(), _wide()], []):
            body = chat_body(QUESTION, images=len(images), max_tokens=12)
            # prompt ids equal too: the expansion, separators included
            messages = reference_messages(QUESTION, len(images))
            assert_reference_answer(h, path, body, images, messages)
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

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        assert all(r.finish.usage.cached_tokens > 0 for r in runs[1:])
        fresh = runs[-1].finish.usage
        model = cached.engine.model
        start = 5  # after "<|im_start|>User:"
        span = len(model.span_ids(model.image_grid(448, 448)))
        assert start < fresh.cached_tokens < start + span  # resumed inside the image span
        assert fresh.vision_hits == 1

    talk = functools.partial(conversation, image=_shapes(), turns=3)
    assert_cached_equals_uncached(tiny_model("smolvlm"), talk, check, max_batch=4)


def test_batched_equals_alone() -> None:
    """Invariant: requests with different images (and a text one) prefilled and decoded
    together answer as each does alone."""
    h = EngineHarness(path=tiny_model("smolvlm"), max_batch=8, cache=NO_CACHES)
    try:
        images = [[noise_image(1, 200, 120)], [noise_image(2, 90, 300)], [_shapes()], []]
        bodies = [
            chat_body(f"Question {i}?", images=len(im), max_tokens=10)
            for i, im in enumerate(images)
        ]
        assert_batched_equals_alone(h, list(zip(bodies, images, strict=True)))
    finally:
        h.close()


def test_one_pixel_change_misses_both_caches() -> None:
    """Invariant: an image one pixel away from a cached one gets no vision hit and no prefix
    block past its span's start, and answers as it does with no caches at all."""
    path = tiny_model("smolvlm")
    h = EngineHarness(path=path, max_batch=4)
    plain = EngineHarness(path=path, max_batch=4, cache=NO_CACHES)
    try:
        body = chat_body(QUESTION, images=1, max_tokens=10)
        image = _shapes()
        _, again = assert_one_pixel_misses(h, body, image, (300, 17))
        assert again.finish.usage.cached_tokens <= 5  # nothing of the image span
        cold = plain.run(body, [one_pixel_changed(image, (300, 17))])
        assert (again.token_ids, again.logprobs) == (cold.token_ids, cold.logprobs)
    finally:
        h.close()
        plain.close()
