"""Video through the Qwen-VL video path: patches, positions, the engine, the caches.

Pinned, on all three architectures: our video positions equal mlx-vlm's `get_rope_index`
(Qwen2.5-VL at a time scale of 1, where mlx-vlm 0.7.10 agrees with the reference; at other
scales against a transcription of transformers' Qwen2.5-VL rule, which mlx-vlm leaves out);
a clip of one frame repeated gives exactly that frame's image patches and, on Qwen2/2.5-VL,
exactly the image's answer; a repeat question about a video skips the tower and the
prefill and answers token for token (logprobs included) what an uncached engine answers;
video rows batched with others answer what they answer alone.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image
from support import EngineHarness, Run, tiny_model
from video_clips import noise_frames

from gateway.config import CacheConfig
from gateway.engine.families.qwen_vl import QwenVL
from gateway.frontend.chat import ChatMessage, ChatRequest, TextPart, VideoPart
from gateway.media.video_decode import DecodedVideo, VideoSampling, video_hash
from gateway.processors.positions import ImageLayout, mrope_positions, rope_delta_at
from gateway.processors.video_layout import VideoLayout

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
SAMPLING = VideoSampling(fps=2.0, max_frames=8, max_seconds=30.0, max_pixels=10**7)


def video(frames: np.ndarray, fps: float = 2.0) -> DecodedVideo:
    times = tuple(i / fps for i in range(len(frames)))
    frames = np.ascontiguousarray(frames)
    return DecodedVideo(frames, times, len(frames) / fps, video_hash(frames, times, SAMPLING),
                        "data", 0.0, 0.0)  # fmt: skip


def chat(question: str, videos: int = 1, max_tokens: int = 6) -> ChatRequest:
    parts = (*[VideoPart("x", "v")] * videos, TextPart(question))
    return ChatRequest.greedy("test", (ChatMessage("user", parts),), max_tokens, logprobs=True)


_ids = iter(range(10**6))


def submit(h: EngineHarness, request: ChatRequest, media: list) -> Run:
    import time

    built = h.prompts.build(request, media, f"v{next(_ids)}", time.perf_counter())
    run = Run()
    h.engine.submit(built, run.sink)
    return run


@pytest.mark.parametrize("arch", ARCHS)
def test_video_positions_match_mlx_vlm(arch: str) -> None:
    """Invariant: mrope_positions == mlx-vlm get_rope_index for images and videos mixed."""
    model = QwenVL(str(tiny_model(arch)), lazy=True)
    m = model.merge_size
    image = (1, 2 * m, 3 * m)
    for frames in (1, 2, 5, 8):
        grid = model.video_grid(frames, 64, 48)
        times = tuple(i / 4.0 for i in range(frames))  # 4 fps: Qwen2.5-VL scale 1
        layout = model.video_layout(grid, times)
        assert layout.time_scale == 1.0 or grid[0] == 1  # one patch: no time axis
        content = [{"type": "image"}, {"type": "video"}, {"type": "text", "text": "hi"}]
        ids = model.tokenize(model.render([{"role": "user", "content": content}]))
        prompt, layouts = model.layout_prompt(ids, [image, layout])
        assert len(layouts) == 1 + layout.blocks
        ref, ref_delta = model.model.language_model.get_rope_index(
            mx.array([prompt]), mx.array([image]), mx.array([grid])
        )
        mine = mrope_positions(len(prompt), layouts)
        assert np.array_equal(np.array(ref)[:, 0, :], mine), (arch, frames)
        assert rope_delta_at(layouts, len(prompt)) == int(np.array(ref_delta).reshape(-1)[0])


def _reference_qwen2_5_video(text_before: int, t: int, h: int, w: int, scale: float) -> np.ndarray:
    """transformers' Qwen2.5-VL get_rope_index for one video block after some text,
    transcribed: t index = (arange(t) * second_per_grid_t * tokens_per_second).long()."""
    text = np.broadcast_to(np.arange(text_before), (3, text_before))
    t_index = (np.arange(t, dtype=np.float32)[:, None] * np.float32(scale)).astype(np.int64)
    t_index = np.broadcast_to(t_index, (t, h * w)).reshape(-1)
    h_index = np.broadcast_to(np.arange(h)[None, :, None], (t, h, w)).reshape(-1)
    w_index = np.broadcast_to(np.arange(w)[None, None, :], (t, h, w)).reshape(-1)
    block = np.stack([t_index, h_index, w_index]) + text_before
    after = block.max() + 1 + np.arange(3)
    return np.concatenate([text, block, np.broadcast_to(after, (3, 3))], axis=1)


@pytest.mark.parametrize("scale", [0.5, 2.0, 1.5, 4.0])
def test_qwen2_5_video_time_axis_follows_second_per_grid(scale: float) -> None:
    """Invariant: the time axis advances int(ti * second_per_grid_t * tokens_per_second)."""
    layout = ImageLayout(start=4, t=5, h=2, w=3, time_scale=scale)
    mine = mrope_positions(4 + layout.num_tokens + 3, [layout])
    assert np.array_equal(mine, _reference_qwen2_5_video(4, 5, 2, 3, scale))


def test_qwen2_5_time_scale_comes_from_the_sampling_rate() -> None:
    """Invariant: scale = temporal_patch_size / fps * tokens_per_second (2 fps -> 2)."""
    model = QwenVL(str(tiny_model("qwen2_5_vl")), lazy=True)
    grid = model.video_grid(4, 64, 48)
    assert model.video_layout(grid, (0.0, 0.5, 1.0, 1.5)).time_scale == 2.0
    assert model.video_layout(grid, (0.0, 0.25, 0.5, 0.75)).time_scale == 1.0


@pytest.mark.parametrize("arch", ARCHS)
def test_a_still_clip_gives_the_image_patches(arch: str) -> None:
    """Invariant: temporal_patch_size copies of one frame == that frame's image patches."""
    model = QwenVL(str(tiny_model(arch)), lazy=True)
    frame = noise_frames(1, 64, 48, seed=3)[0]
    image_values, image_grid = model.preprocess(Image.fromarray(frame))
    grid = model.video_grid(2, 64, 48)
    clip = model.video_clip(np.stack([frame, frame]), (0.0, 0.5), grid)
    values, video_grid = model.preprocess(clip)
    assert video_grid == image_grid == grid
    assert np.array_equal(values, image_values)
    # One frame alone is padded with itself: the same patches again.
    assert np.array_equal(model.preprocess(model.video_clip(frame[None], (0.0,), grid))[0], values)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
def test_a_still_clip_answers_what_the_image_answers(arch: str) -> None:
    """Invariant: through the engine, a clip of one repeated frame == that image (token ids
    and logprobs): the video path feeds the same features at the same positions."""
    from support import chat_body

    h = EngineHarness(arch, cache=CacheConfig(vision_enabled=False, prefix_enabled=False))
    try:
        frame = noise_frames(1, 64, 48, seed=4)[0]
        as_image = h.run(
            chat_body("What happens?", images=1, max_tokens=6), [Image.fromarray(frame)]
        )
        as_video = submit(h, chat("What happens?"), [video(np.stack([frame, frame]))]).wait()
        assert as_video.token_ids == as_image.token_ids
        assert np.allclose(as_video.logprobs, as_image.logprobs, atol=1e-5)
        assert as_video.finish.usage.prompt_tokens == as_image.finish.usage.prompt_tokens
    finally:
        h.close()


def _questions(h: EngineHarness, clip: DecodedVideo, other: DecodedVideo) -> list[Run]:
    runs = [submit(h, chat("Warm-up?", max_tokens=3), [other]).wait()]
    for question in ["What happens?", "What colour is it?", "What happens?"]:
        runs.append(submit(h, chat(question), [clip]).wait())
    return runs


@pytest.mark.parametrize("arch", ARCHS)
def test_video_cached_equals_uncached(arch: str) -> None:
    """Invariant: repeat questions about a clip hit both caches (no tower, most of the prompt
    from the prefix cache) and answer exactly what an engine without caches answers."""
    # 8-token exact-reuse blocks: these prompts are a few dozen tokens long.
    cached = EngineHarness(arch, max_batch=4, cache=CacheConfig(kv_block_tokens=8))
    plain = EngineHarness(
        arch,
        max_batch=4,
        cache=CacheConfig(vision_enabled=False, prefix_enabled=False, kv_block_tokens=8),
    )
    try:
        clip, other = (
            video(noise_frames(6, 112, 112, seed=7)),
            video(noise_frames(3, 64, 48, seed=8)),
        )
        with_cache, without = _questions(cached, clip, other), _questions(plain, clip, other)
        for a, b in zip(with_cache, without, strict=True):
            assert a.token_ids == b.token_ids
            assert a.logprobs == b.logprobs
        first, repeat = with_cache[1].finish.usage, with_cache[3].finish.usage
        assert first.vision_misses >= 1 and repeat.vision_misses == 0
        assert repeat.cached_tokens > first.prompt_tokens // 2
        # Control: a clip with one changed frame misses the vision cache.
        changed = clip.frames.copy()
        changed[2, 0, 0, 0] ^= 1
        miss = submit(cached, chat("What happens?"), [video(changed)]).wait()
        assert miss.finish.usage.vision_misses >= 1
    finally:
        cached.close()
        plain.close()


@pytest.mark.parametrize("arch", ARCHS)
def test_video_rows_batched_equal_alone(arch: str) -> None:
    """Invariant: video requests prefilled and decoded together answer what each does alone."""
    h = EngineHarness(
        arch, max_batch=4, cache=CacheConfig(vision_enabled=False, prefix_enabled=False)
    )
    try:
        clips = [video(noise_frames(n, 64, 48, seed=20 + n)) for n in (2, 4, 5)]
        alone = [submit(h, chat("Describe."), [c]).wait() for c in clips]
        with h.arriving_together():
            runs = [submit(h, chat("Describe."), [c]) for c in clips]
        for a, b in zip(alone, [r.wait() for r in runs], strict=True):
            assert a.token_ids == b.token_ids
            assert np.allclose(a.logprobs, b.logprobs, atol=1e-4)
    finally:
        h.close()


def test_video_layout_is_frozen_data() -> None:
    """Invariant: a VideoLayout compares by value (it travels inside requests)."""
    assert VideoLayout((1, 2, 2), 2.0) == VideoLayout((1, 2, 2), 2.0)


@pytest.mark.parametrize("arch", ARCHS)
def test_prompt_and_patches_match_the_checkpoint_processor(arch: str) -> None:
    """Invariant: for a small clip, our expanded prompt (Qwen3-VL: timestamps and one block
    per temporal patch) and our video patches equal mlx-vlm's processor's, exactly."""
    model = QwenVL(str(tiny_model(arch)), lazy=True)
    frames = noise_frames(4, 64, 48, seed=1)
    times = (0.0, 0.5, 1.0, 1.5)
    text = model.render(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "hi"}]}]
    )
    out = model.processor(text=[text], videos=[frames], fps=[2.0], return_tensors="np")
    grid = model.video_grid(len(frames), 64, 48)
    assert tuple(int(x) for x in np.asarray(out["video_grid_thw"])[0]) == grid
    mine, _ = model.layout_prompt(model.tokenize(text), [model.video_layout(grid, times)])
    assert [int(i) for i in np.asarray(out["input_ids"])[0]] == mine
    values, _ = model.preprocess(model.video_clip(frames, times, grid))
    assert np.array_equal(np.asarray(out["pixel_values_videos"]), values)


@pytest.mark.parametrize("arch", ARCHS)
def test_the_tower_sees_each_temporal_patch_on_its_own(arch: str) -> None:
    """Invariant: a clip's features == each temporal patch encoded alone, concatenated (the
    reference towers attend within a frame pair only), which is what lets Qwen3-VL's
    per-patch blocks and a whole clip share one tower call."""
    model = QwenVL(str(tiny_model(arch)))
    frames = noise_frames(6, 64, 48, seed=9)
    grid = model.video_grid(len(frames), 64, 48)
    values, _ = model.preprocess(model.video_clip(frames, (0, 0.5, 1, 1.5, 2, 2.5), grid))
    whole = model.encode_image(values, grid)
    t, h, w = grid
    parts = [model.encode_image(values[k * h * w : (k + 1) * h * w], (1, h, w)) for k in range(t)]
    joined = mx.concatenate([p.features for p in parts])
    assert np.allclose(np.array(whole.features), np.array(joined), atol=1e-5)
    if whole.deepstack:
        for layer, pieces in zip(whole.deepstack, zip(*[p.deepstack for p in parts]), strict=True):
            assert np.allclose(np.array(layer), np.array(mx.concatenate(pieces)), atol=1e-5)
