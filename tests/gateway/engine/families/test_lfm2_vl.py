"""LFM2-VL through the engine (families/lfm2_vl.py on families/vlm_base.py), on the tiny
offline checkpoint (a SigLIP2 NaFlex tower over 64 px tiles + a thumbnail or one smart-resized
view, pixel-unshuffled to 16 tokens per tile; an LFM2 language model whose short-convolution
layers keep a state beside full-attention layers).

Pinned at tolerance zero (token ids and logprobs): the engine's greedy answer equals mlx-vlm's
own `stream_generate` (tests/reference.py) on the same checkpoint, with the same prompt ids,
for a tiled image, a single-view image, two images in one turn and none (float32, bf16 and
4-bit); batched == alone; cached == uncached across an image conversation whose warm turns
restore the convolution states from the snapshots at their hits' last block ends; a
one-pixel change misses both caches; the same pixels in three formats share one entry. The
grid from the size alone equals the processor's views, and the tiling settings are part of
the cache key.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import mlx.core as mx
import pytest
from PIL import Image
from support import EngineHarness, Run, chat_body, conversation, noise_image, tiny_model

from gateway.api.openai.parse import parse_chat_request
from gateway.config import CacheConfig
from gateway.engine.families.lfm2_vl import Lfm2VL
from gateway.engine.families.lfm2_vl_forward import ConvStateCache
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.snapshots import layer_block
from gateway.engine.model.state_cache import BatchStateCache
from gateway.frontend.errors import prompt_error
from gateway.frontend.prompt import PromptBuilder, UnsupportedImage
from gateway.media.image_decode import decode_and_hash
from gateway.media.loader import DecodedImage
from tests.gateway.engine.families.common import (
    NO_CACHES,
    assert_batched_equals_alone,
    assert_cached_equals_uncached,
    assert_one_pixel_misses,
    assert_reference_answer,
    engine_request,
    one_pixel_changed,
    reference_messages,
)

FIXTURES = Path(__file__).resolve().parents[4] / "fixtures"
QUESTION = "What is in this picture?"


def _shapes() -> Image.Image:
    return Image.open(FIXTURES / "shapes.png").convert("RGB")  # 448 x 448: 3 x 3 tiles + thumb


def _wide() -> Image.Image:
    return _shapes().resize((640, 360))  # a wide grid of tiles + thumbnail


def _small() -> Image.Image:
    return noise_image(3, 40, 48)  # one smart-resized view (no tiles)


@pytest.mark.parametrize("weights", ["float32", "bfloat16", "q4"])
def test_greedy_answer_equals_mlx_vlm_generate(weights: str) -> None:
    """Invariant: engine prompt ids, token ids and logprobs == mlx-vlm's own generate, for a
    tiled image, a single-view one, two images in one turn and a text-only question, over
    the convolution and attention layers' caches. (The prompt's last token is fed apart as
    mlx-vlm feeds it; on this CPU feeding it with its block gives the same bits, so this
    test does not tell the two apart.)"""
    path = tiny_model("lfm2_vl", weights)
    h = EngineHarness(path=path, max_batch=4)
    try:
        assert isinstance(h.engine.model, Lfm2VL)
        kinds = [type(c) for c in h.engine.model.new_cache()]
        assert kinds == [ConvStateCache, ConvStateCache, RowKVCache, ConvStateCache]
        for images in ([_shapes()], [_small()], [_wide(), _small()], []):
            body = chat_body(QUESTION, images=len(images), max_tokens=12)
            messages = reference_messages(QUESTION, len(images))
            assert_reference_answer(h, path, body, images, messages)
    finally:
        h.close()


def test_grid_from_size_equals_the_processors() -> None:
    """Invariant: `image_grid` (sizes only) decodes to the views mlx-vlm's image processor
    makes (tiles and thumbnail, or one view), and the span holds one image token per
    pixel-unshuffled patch pair of every view, in the markers mlx-vlm's processor writes."""
    model = Lfm2VL(str(tiny_model("lfm2_vl")), lazy=True)
    image_id = model.image_token_id
    sizes = [(448, 448), (640, 360), (360, 640), (56, 56), (30, 1000), (1000, 30), (191, 193)]
    for width, height in [*sizes, (100, 64), (2000, 1500), (40, 48), (1, 1), (70, 50)]:
        pixels, grid = model.preprocess(Image.new("RGB", (width, height), (9, 99, 199)))
        assert model.image_grid(width, height) == grid, (width, height)
        _, _, views = model.prompt.views(grid)
        assert pixels.shape[0] == len(views) == grid[0]
        run = model.span_ids(grid)
        assert run.count(image_id) == sum(model.prompt.tokens(h, w) for h, w in views)
    assert model.image_grid(448, 448)[0] == 10  # 3 x 3 tiles + the thumbnail
    assert model.image_grid(40, 48) == (1, 6, 4)  # one view of 48 x 32 px (h x w), 8 px patches
    tokens = model.tokenizer.convert_ids_to_tokens(model.span_ids(model.image_grid(448, 448)))
    marks = [t for t in tokens if t != "<image>"]
    rows_cols = [f"<|img_row_{r}_col_{c}|>" for r in (1, 2, 3) for c in (1, 2, 3)]
    assert marks == ["<|image_start|>", *rows_cols, "<|img_thumbnail|>", "<|image_end|>"]


def test_processor_settings_are_part_of_the_cache_key(tmp_path: Path) -> None:
    """Invariant: a tiling setting that changes pixels and token counts changes
    `processor_fingerprint` (the vision-cache key) and the grid (the span, the prefix key)."""
    source = tiny_model("lfm2_vl")
    other = tmp_path / "lfm2_vl-tiles"
    shutil.copytree(source, other)
    config = json.loads((other / "preprocessor_config.json").read_text())
    config["tile_size"] = 128  # honoured (mlx-vlm re-applies only the tile-count defaults)
    (other / "preprocessor_config.json").write_text(json.dumps(config))
    a, b = Lfm2VL(str(source), lazy=True), Lfm2VL(str(other), lazy=True)
    assert a.processor_fingerprint != b.processor_fingerprint
    span = [len(m.span_ids(m.image_grid(448, 448))) for m in (a, b)]
    assert span[0] < span[1]  # 3 x 3 tiles of 16 tokens, then of 64


def _talk(h: EngineHarness) -> list[Run]:
    """Three turns about the tiled image resending the history, then a fresh question."""
    return conversation(h, _shapes(), turns=3)


def test_cached_equals_uncached() -> None:
    """Invariant: an image conversation answers the same with the caches as without: every
    warm turn restores the convolution states from the snapshots at its hit's last block end
    (a whole number of blocks) and prefills the rest; the fresh question about the same
    image hits the vision cache."""

    def check(cached: EngineHarness, runs: list[Run]) -> None:
        block = cached.engine.loaded.prefiller.block
        usage = [r.finish.usage for r in runs]
        assert all(u.cached_tokens > 0 and u.cached_tokens % block == 0 for u in usage[1:])
        stats = cached.engine.cache_stats()["prefix"]
        assert stats["snapshot_hits"] == stats["hits"] == len(runs) - 1
        assert stats["snapshots"] == stats["blocks"] > 0
        assert 0 < stats["snapshot_bytes"] < stats["bytes"]
        assert usage[-1].vision_hits == 1

    assert_cached_equals_uncached(tiny_model("lfm2_vl"), _talk, check, max_batch=4)


def test_batched_equals_alone() -> None:
    """Invariant: requests with different images (tiled, single view) and a text one,
    prefilled and decoded together (left-padded attention KV beside stacked convolution
    states), answer as each does alone."""
    h = EngineHarness(path=tiny_model("lfm2_vl"), max_batch=8, cache=NO_CACHES)
    try:
        images = [[noise_image(1, 200, 120)], [_small()], [_shapes()], []]
        bodies = [
            chat_body(f"Question {i}?", images=len(im), max_tokens=10)
            for i, im in enumerate(images)
        ]
        assert_batched_equals_alone(h, list(zip(bodies, images, strict=True)))
    finally:
        h.close()


def test_one_pixel_change_misses_both_caches() -> None:
    """Invariant: an image one pixel away from a cached one (two images) never shares its
    entry: no vision hit, no prefix block past its span's start, and it answers as it does
    with no caches at all."""
    path = tiny_model("lfm2_vl")
    h = EngineHarness(path=path, max_batch=4)
    plain = EngineHarness(path=path, max_batch=4, cache=NO_CACHES)
    try:
        body = chat_body(QUESTION, images=1, max_tokens=10)
        image = _shapes()
        _, again = assert_one_pixel_misses(h, body, image, (300, 17))
        cold = plain.run(body, [one_pixel_changed(image, (300, 17))])
        assert (again.token_ids, again.logprobs) == (cold.token_ids, cold.logprobs)
    finally:
        h.close()
        plain.close()


def _delivered(image: Image.Image, fmt: str, **save: object) -> DecodedImage:
    """`image` encoded as `fmt` and decoded as the media loader decodes it."""
    buf = io.BytesIO()
    image.save(buf, format=fmt, **save)
    rgb, digest, decode, hashed = decode_and_hash(buf.getvalue(), 10**8)
    return DecodedImage(rgb, digest, rgb.width, rgb.height, "data", decode, hashed)


def test_the_same_pixels_in_another_format_share_one_entry() -> None:
    """Invariant: the same pixels delivered as PNG, lossless WebP and BMP are one vision
    entry (one encode, then hits) and one prefix path through the image, with the answer of
    an engine without caches."""
    path = tiny_model("lfm2_vl")
    h = EngineHarness(path=path, max_batch=4)
    plain = EngineHarness(path=path, max_batch=4, cache=NO_CACHES)
    try:
        body = chat_body(QUESTION, images=1, max_tokens=8)
        image = _wide()
        deliveries = [
            _delivered(image, "PNG"),
            _delivered(image, "WEBP", lossless=True),
            _delivered(image, "BMP"),
        ]
        assert len({d.content_hash for d in deliveries}) == 1
        runs = [h.run(body, [d]) for d in deliveries]
        usage = [r.finish.usage for r in runs]
        assert [u.vision_misses for u in usage] == [1, 0, 0]
        layout = engine_request(h, body, [deliveries[0]]).images[0].layout
        image_end = layout.start + layout.num_tokens
        assert all(u.cached_tokens > image_end for u in usage[1:])  # past the image span
        cold = plain.run(body, [image])
        assert all((r.token_ids, r.logprobs) == (cold.token_ids, cold.logprobs) for r in runs)
    finally:
        h.close()
        plain.close()


def test_choices_fork_the_convolution_states() -> None:
    """Invariant: a request for n choices (one prefill, its caches copied into n rows, the
    convolution states too) draws in choice i what a request seeded seed + i draws alone;
    greedy choices are the greedy answer."""
    h = EngineHarness(path=tiny_model("lfm2_vl"), max_batch=6, cache=NO_CACHES)
    try:
        body = chat_body(QUESTION, images=1, max_tokens=8, temperature=1.0)
        singles = [h.run(dict(body, seed=11 + i), [_small()]) for i in range(3)]
        run = h.run(dict(body, seed=11, n=3), [_small()])
        for i, single in enumerate(singles):
            assert run.choice(i) == (single.token_ids, single.logprobs), i
        greedy = chat_body("Hi", max_tokens=6)
        single = h.run(greedy)
        run = h.run(dict(greedy, n=2))
        assert run.choice(0) == run.choice(1) == (single.token_ids, single.logprobs)
    finally:
        h.close()


def test_a_convolution_state_is_a_one_array_snapshot_pair() -> None:
    """Invariant: a conv layer's block value is the pair every state layer stores (the state
    at the block's end, a one-element placeholder); restoring it gives the one-array cache
    mlx-vlm's `ShortConv` reads, at the hit's offset; the decode batch stacks such rows."""
    mx.random.seed(0)
    conv = ConvStateCache()
    state = mx.random.normal((1, 2, 8))
    conv.cache, conv.offset = [state], 32
    conv.mark()
    pair = layer_block(conv, 0, 32)
    assert pair[0] is state and pair[1].shape == (1, 1)
    restored = ConvStateCache()
    restored.restore_blocks([pair, pair], 64)
    assert restored.cache == [state] and restored.offset == 64 and set(restored.marks) == {32, 64}
    batch = BatchStateCache.merge([conv, restored])
    assert len(batch.cache) == 1 and batch.offsets == [32, 64]
    assert mx.array_equal(batch.extract(1).cache[0], state).item()


@pytest.mark.parametrize(
    ("part", "field"),
    [
        (
            {"type": "input_audio", "input_audio": {"data": "UklGRg==", "format": "wav"}},
            "input_audio",
        ),
        ({"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}, "video_url"),
    ],
)
def test_audio_and_video_parts_are_a_400_naming_the_part(part: dict, field: str) -> None:
    """Invariant: LFM2-VL takes images only: an audio or video part is refused before any
    media work, a 400 whose param names the part and whose code names its kind."""
    model = Lfm2VL(str(tiny_model("lfm2_vl")), lazy=True)
    content = [{"type": "text", "text": QUESTION}, part]
    chat = parse_chat_request({"model": "t", "messages": [{"role": "user", "content": content}]})
    with pytest.raises(UnsupportedImage) as refused:
        PromptBuilder(model, 8192, 16).check_media_kinds(chat)
    error = prompt_error(refused.value, chat)
    kind = "audio" if field == "input_audio" else "video"
    assert (error.status, error.code) == (400, f"unsupported_{kind}")
    assert error.param is not None and error.param.startswith(f"messages[0].content[1].{field}")
    assert "send images or text" in error.message


def test_without_the_exact_rule_the_prefix_cache_is_off() -> None:
    """Invariant: with --no-exact-cache no forward ends at a block boundary, so there are no
    convolution-state snapshots: the prefix cache is off (the reason in the stats), and
    prompts are still prefilled unpadded by the family, so batched == alone."""
    cache = CacheConfig(exact_reuse=False)
    h = EngineHarness(path=tiny_model("lfm2_vl"), max_batch=8, cache=cache)
    try:
        cases = [(QUESTION, [_small()]), ("Hi", []), ("A longer question, this one?", [])]
        requests = [(chat_body(q, images=len(i), max_tokens=10), i) for q, i in cases]
        assert_batched_equals_alone(h, requests)
        h.run(*requests[0])  # the same prompt again: nothing to reuse
        stats = h.engine.cache_stats()
        assert stats["family"]["prefix_cache"].startswith("off: recurrent-state snapshots")
        assert stats["prefix"]["hits"] == 0 and stats["prefix"]["blocks"] == 0
    finally:
        h.close()
