"""The prompt side of Qwen2-VL, Qwen2.5-VL and Qwen3-VL (and Qwen3.5, which shares it):
`<|vision_start|><|image_pad|><|vision_end|>` with the pad expanded to t*h*w merged patches;
a video as one block (Qwen2/2.5-VL) or one timestamped block per temporal patch (Qwen3-VL).

`QwenVLSettings` is everything the prompt side needs of the checkpoint's config and image
processor, resolved once by the engine-side family from what mlx-vlm loaded, so the HTTP
process never reads (or re-derives) them itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.processors.image_processor import QwenImageProcessor, QwenImageSpec, smart_resize
from gateway.processors.positions import ImageLayout
from gateway.processors.processor import Grid, PromptProcessor
from gateway.processors.video_layout import VideoLayout, VideoTokens, expand_video
from gateway.processors.video_processor import (
    VideoFrames,
    group_times,
    seconds_per_patch,
    video_grid,
)


@dataclass(frozen=True)
class QwenVLSettings:
    """A Qwen-VL checkpoint's prompt settings: its placeholder ids, the merge size, the image
    sizes (`patch_size`, `resize_factor`, `min_pixels`, `max_pixels`; `spec`: the fast image
    processor's, None when the checkpoint's processor is one it does not reproduce, and then
    there is no video) and Qwen2.5-VL's time scale (`tokens_per_second`; None: the time axis
    is the patch index)."""

    image_token_id: int
    video_token_id: int
    vision_start_id: int
    vision_end_id: int
    merge_size: int  # patches per token side (the layout's)
    patch_size: int
    resize_factor: int  # image sides are resized to multiples of this (patch * merge)
    min_pixels: int | None
    max_pixels: int | None
    spec: QwenImageSpec | None
    tokens_per_second: float | None
    timestamps: bool  # Qwen3-VL: one `<t seconds>` block per temporal patch


class QwenVLProcessor(PromptProcessor):
    """A Qwen-VL checkpoint's prompt side. See the module doc."""

    family = "qwen_vl"
    media = frozenset({"image", "video"})

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: QwenVLSettings):
        super().__init__(path, model_type, tokenizer)
        self.settings = settings
        self.image_token_id = settings.image_token_id
        self.video_token_id = settings.video_token_id
        self.merge_size = settings.merge_size
        self._video_tokens = VideoTokens(
            settings.video_token_id,
            settings.vision_start_id,
            settings.vision_end_id,
            settings.merge_size,
        )
        spec = settings.spec
        self._video = None if spec is None else QwenImageProcessor(spec, parallel=False)

    def image_grid(self, width: int, height: int) -> Grid:
        """The (t, h, w) patch grid of an image, without touching pixels. Raises ValueError
        for an aspect ratio over 200 (the processors refuse those too)."""
        s = self.settings
        h, w = smart_resize(height, width, s.resize_factor, s.min_pixels, s.max_pixels)
        return (1, h // s.patch_size, w // s.patch_size)

    def _video_processor(self) -> QwenImageProcessor:
        if self._video is None:
            raise ValueError("this model's image processor is not one the video path supports")
        return self._video

    def video_grid(self, frames: int, width: int, height: int) -> Grid:
        """The (t, h, w) patch grid of a clip (see `gateway.processors.video_processor`)."""
        return video_grid(self._video_processor(), frames, width, height)

    def video_layout(self, grid: Grid, times: Sequence[float]) -> VideoLayout:
        """How a clip with this grid and these frame times sits in this model's prompt."""
        s = self.settings
        tps = self._video_processor().spec.temporal_patch_size
        scale = 1.0
        if s.tokens_per_second is not None:
            scale = seconds_per_patch(tuple(times), tps) * s.tokens_per_second
        stamps = group_times(tuple(times), tps) if s.timestamps else None
        return VideoLayout(grid, scale, None if stamps is None else tuple(stamps))

    def video_clip(
        self, frames: np.ndarray, times: Sequence[float], grid: Grid, block: int | None = None
    ) -> VideoFrames:
        """The frames the engine preprocesses for a clip of this grid: all of them, or those
        of temporal patch `block` (Qwen3-VL's per-patch inputs), resized as in the whole clip."""
        spec = self._video_processor().spec
        size = (grid[1] * spec.patch_size, grid[2] * spec.patch_size)
        if block is None:
            return VideoFrames(frames, tuple(times), size)
        n = spec.temporal_patch_size
        lo, hi = block * n, min((block + 1) * n, len(frames))
        return VideoFrames(frames[lo:hi], tuple(times[lo:hi]), size)

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Expand each image placeholder into its run of `num_tokens` placeholders and each
        video placeholder into its block(s) (`gateway.processors.video_layout`); `grids` holds
        one entry per image (a grid) or video (a `VideoLayout`), in prompt order. A video
        gives `VideoLayout.blocks` layouts."""
        videos = sum(isinstance(g, VideoLayout) for g in grids)
        expected = (
            sum(1 for i in ids if i == self.image_token_id),
            sum(1 for i in ids if i == self.video_token_id),
        )
        if expected != (len(grids) - videos, videos):
            raise ValueError(
                f"prompt has {expected[0]} image and {expected[1]} video placeholders for "
                f"{len(grids) - videos} images and {videos} videos"
            )
        out: list[int] = []
        layouts: list[ImageLayout] = []
        items = iter(grids)
        m = self.merge_size
        for token in ids:
            if token not in (self.image_token_id, self.video_token_id):
                out.append(token)
                continue
            item = next(items)
            if isinstance(item, VideoLayout):
                if token != self.video_token_id:
                    raise ValueError("images and videos are not in prompt order")
                expand_video(out, layouts, item, self._video_tokens, self.tokenize)
                continue
            if token != self.image_token_id:
                raise ValueError("images and videos are not in prompt order")
            t, h, w = item
            layout = ImageLayout(start=len(out), t=t, h=h // m, w=w // m)
            layouts.append(layout)
            out.extend([self.image_token_id] * layout.num_tokens)
        return out, layouts


class Qwen35Processor(QwenVLProcessor):
    """A Qwen3.5 / Qwen3.6 checkpoint's prompt side: Qwen-VL's layout and image grids, images
    only (the Qwen3-VL video path is not checked against this family)."""

    family = "qwen3_5"
    media = frozenset({"image"})

    def video_grid(self, frames: int, width: int, height: int) -> Grid:
        raise ValueError(f"{self.model_type} video is not supported yet")
