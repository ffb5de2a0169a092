"""Sampled video frames -> Qwen-VL temporal patches (numpy + Pillow). Thread-safe, blocking.

What the Qwen-VL video processors do (transformers' Qwen2-VL / Qwen3-VL video processors,
mlx-vlm's numpy port of the latter), on top of the image arithmetic of
`gateway.processors.image_processor`:
1. every frame is resized to one size (sides multiples of patch * merge, area within the
   budget below, aspect ratio kept), BICUBIC on uint8;
2. values are rescaled and normalised per channel (the image processor's value table);
3. the frame count is padded to a multiple of `temporal_patch_size` by repeating the last frame,
   and each run of `temporal_patch_size` frames becomes one temporal patch: rows ordered
   (t, row block, column block, row in block, column in block), columns (C, T, P, P).
So a clip of `temporal_patch_size` copies of one frame gives exactly that frame's image
patches (tested), and the tower treats each temporal patch as its own attention segment.

Budget: a frame pair costs h * w / merge^2 tokens. Each pair gets at most
`MAX_TOKENS_PER_PATCH` tokens and the whole clip at most `MAX_TOKENS_PER_VIDEO` (so more frames
means smaller frames), never more than the processor's own `max_pixels` per frame (the budget
qwen-vl-utils applies on the client side for the reference models).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from PIL import Image

from gateway.processors.image_processor import QwenImageProcessor, smart_resize

MAX_TOKENS_PER_PATCH = 768
MAX_TOKENS_PER_VIDEO = 16384


@dataclass(frozen=True)
class VideoFrames:
    """A clip's sampled frames as the engine receives them: (T, H, W, 3) uint8 RGB, with the
    frames' times in seconds. Immutable by convention (the array may be shared)."""

    frames: np.ndarray
    times: tuple[float, ...]
    # (height, width) in pixels to resize every frame to; None: the budget's size for this
    # many frames. Set when a part of a clip must match the patches of the whole clip.
    resize_to: tuple[int, int] | None = None

    @property
    def width(self) -> int:
        return int(self.frames.shape[2])

    @property
    def height(self) -> int:
        return int(self.frames.shape[1])

    @property
    def nbytes(self) -> int:
        return int(self.frames.nbytes)


def video_grid(
    processor: QwenImageProcessor, frames: int, width: int, height: int
) -> tuple[int, int, int]:
    """The (t, h, w) patch grid of a clip of `frames` frames of width x height pixels.
    ValueError for an aspect ratio over 200 (as for images)."""
    s = processor.spec
    t = math.ceil(frames / s.temporal_patch_size)
    factor = s.patch_size * s.merge_size
    tokens = max(4, min(MAX_TOKENS_PER_PATCH, MAX_TOKENS_PER_VIDEO // t))
    max_pixels = min(s.max_pixels, tokens * factor * factor)
    min_pixels = min(s.min_pixels, max_pixels)
    h, w = smart_resize(height, width, factor, min_pixels, max_pixels)
    return (t, h // s.patch_size, w // s.patch_size)


def video_patches(
    processor: QwenImageProcessor, clip: VideoFrames
) -> tuple[np.ndarray, tuple[int, int, int]]:
    """(pixel_values (t*h*w, 3*T*P*P) float32, grid (t, h, w) in patches) of a clip."""
    s = processor.spec
    count, height, width, _ = clip.frames.shape
    p, tps, m = s.patch_size, s.temporal_patch_size, s.merge_size
    if clip.resize_to is None:
        grid = video_grid(processor, count, width, height)
    else:
        grid = (math.ceil(count / tps), clip.resize_to[0] // p, clip.resize_to[1] // p)
    gt, gh, gw = grid
    size = (gw * p, gh * p)
    resized = np.empty((gt * tps, gh * p, gw * p, 3), dtype=np.uint8)
    for i, frame in enumerate(clip.frames):
        image = Image.fromarray(frame)
        if image.size != size:
            image = image.resize(size, Image.Resampling.BICUBIC)
        resized[i] = np.asarray(image)
    resized[count:] = resized[count - 1]  # pad with the last frame, as the processors do
    blocks = resized.reshape(gt, tps, gh // m, m, p, gw // m, m, p, 3)
    # -> (t, row block, col block, row in block, col in block, C, T, P, P)
    blocks = np.ascontiguousarray(blocks.transpose(0, 2, 5, 3, 6, 8, 1, 4, 7))
    table = processor.table
    out = np.empty(blocks.shape, dtype=np.float32)
    for c in range(3):
        out[:, :, :, :, :, c] = table[c].take(blocks[:, :, :, :, :, c])
    return out.reshape(gt * gh * gw, 3 * tps * p * p), grid


def group_times(times: tuple[float, ...], temporal_patch_size: int) -> list[float]:
    """Seconds of each temporal patch: the mean of its first and last frame's time (the
    padded last patch repeats the last frame), as Qwen3-VL's processor stamps them."""
    padded = list(times) + [times[-1]] * (-len(times) % temporal_patch_size)
    return [
        (padded[i] + padded[i + temporal_patch_size - 1]) / 2
        for i in range(0, len(padded), temporal_patch_size)
    ]


def seconds_per_patch(times: tuple[float, ...], temporal_patch_size: int) -> float:
    """Qwen2.5-VL's `second_per_grid_t`: temporal_patch_size / sampling fps, the fps being
    measured from the sampled frames' times (1 frame: taken as 2 fps)."""
    if len(times) < 2 or times[-1] <= times[0]:
        return temporal_patch_size / 2.0
    fps = (len(times) - 1) / (times[-1] - times[0])
    return temporal_patch_size / fps
