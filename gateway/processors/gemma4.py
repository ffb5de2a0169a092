"""The prompt side of Gemma 4: the template writes `<|image|>` where an image part is; the
reference processor replaces it by `<|image>` + one `<|image|>` soft token per pooled patch
+ `<image|>` (`VlmProcessor` expands the ids). Each image is resized, aspect ratio kept, to
the largest multiple of `pooling_kernel_size * patch_size` px per side within
`max_soft_tokens * k^2` patches, so the token count follows the image's shape.

A checkpoint with an audio tower also takes audio parts: the template writes `<|audio|>`,
which becomes `<|audio>` + one `<|audio|>` per `audio_ms_per_token` of the clip (at most
`audio_seq_length`) + `<audio|>`; a clip's grid is an `AudioGrid` (its token count).

`Gemma4Settings` is resolved once by the engine-side family from mlx-vlm's config and image
processor (`gateway.engine.families.gemma4`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from gateway.processors.audio import AudioGrid, audio_tokens
from gateway.processors.positions import ImageLayout
from gateway.processors.processor import Grid
from gateway.processors.video_layout import VideoLayout
from gateway.processors.vlm import VlmProcessor


@dataclass(frozen=True)
class Gemma4Audio:
    """A checkpoint's audio prompt settings: the soft token's and the markers' ids, the
    feature extractor's rate (Hz; clips are resampled to it), the milliseconds per soft
    token and the most soft tokens a clip takes (longer clips are refused, not cut)."""

    audio_token_id: int  # `<|audio|>`: the template's placeholder and the soft token
    boa_id: int  # `<|audio>`
    eoa_id: int  # `<audio|>`
    rate: int
    ms_per_token: int
    max_tokens: int

    @property
    def max_seconds(self) -> float:
        return self.max_tokens * self.ms_per_token / 1000.0


@dataclass(frozen=True)
class Gemma4Settings:
    """A Gemma 4 checkpoint's prompt settings: the soft token's and the markers' ids, the
    patch size (px), the pooling kernel (patches per side of one soft token), the token
    budget per image (`max_soft_tokens`) and whether the processor resizes at all."""

    image_token_id: int
    boi_id: int  # `<|image>`
    eoi_id: int  # `<image|>`
    patch: int
    pool: int
    budget: int
    do_resize: bool
    audio: Gemma4Audio | None = None  # None: no audio tower


class Gemma4Processor(VlmProcessor):
    """A Gemma 4 checkpoint's prompt side. See the module doc."""

    family = "gemma4"

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: Gemma4Settings):
        image_id = settings.image_token_id
        # The template writes one `<|image|>` per image: the placeholder is the soft token.
        super().__init__(path, model_type, tokenizer, image_id, image_id)
        self.settings = settings
        if settings.audio is not None:
            self.media = frozenset({"image", "audio"})

    @property
    def audio_rate(self) -> int | None:
        """The rate (Hz) audio is resampled to; None: the checkpoint takes no audio."""
        return None if self.settings.audio is None else self.settings.audio.rate

    def audio_grid(self, num_samples: int, rate: int) -> AudioGrid:
        """The grid of a clip of `num_samples` at `rate` Hz (the model's rate). ValueError
        for an empty clip, one longer than the checkpoint's limit or another rate."""
        audio = self.settings.audio
        if audio is None:
            raise ValueError(f"{self.model_type} has no audio tower: it takes no audio")
        if rate != audio.rate:
            raise ValueError(f"audio at {rate} Hz; this model reads {audio.rate} Hz")
        limit = audio.max_tokens * audio.ms_per_token * audio.rate // 1000
        if num_samples > limit:
            raise ValueError(
                f"the clip is {num_samples / rate:.2f} s long; this model reads at most "
                f"{audio.max_seconds:g} s a clip"
            )
        return AudioGrid.of(audio_tokens(num_samples, rate, audio.ms_per_token, audio.max_tokens))

    def span_ids(self, grid: Grid) -> list[int]:
        s = self.settings
        if isinstance(grid, AudioGrid):
            assert s.audio is not None, "an audio grid for a model without audio"
            a = s.audio
            return [a.boa_id, *[a.audio_token_id] * grid.tokens, a.eoa_id]
        _, h, w = grid
        return [s.boi_id, *[s.image_token_id] * (h * w // s.pool**2), s.eoi_id]

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Each `<|image|>` and `<|audio|>` placeholder -> its run (`span_ids`), one flat
        span per medium, `grids` in prompt order (an `AudioGrid` for each audio placeholder,
        an image grid for each image one)."""
        audio = self.settings.audio
        audio_id = audio.audio_token_id if audio is not None else None
        wanted = [
            "audio" if t == audio_id else "image"
            for t in ids
            if t == self.placeholder_id or t == audio_id
        ]
        given = ["audio" if isinstance(g, AudioGrid) else "image" for g in grids]
        if any(isinstance(g, VideoLayout) for g in grids):
            raise self.no_video()
        if wanted != given:
            raise ValueError(f"prompt has media placeholders {wanted} for media {given}")
        out: list[int] = []
        layouts: list[ImageLayout] = []
        items = iter(grids)
        for token in ids:
            if token != self.placeholder_id and token != audio_id:
                out.append(token)
                continue
            run = self.span_ids(next(items))  # type: ignore[arg-type]
            layouts.append(ImageLayout.flat(len(out), len(run)))
            out.extend(run)
        return out, layouts

    def image_grid(self, width: int, height: int) -> Grid:
        """(1, rows, cols) patches of the resized image (the processor's own arithmetic)."""
        s = self.settings
        if width < 1 or height < 1:
            raise ValueError(f"an image of {width}x{height} pixels")
        if s.do_resize:
            height, width = _budget_size(height, width, s.patch, s.budget * s.pool**2, s.pool)
        rows, cols = height // s.patch, width // s.patch
        if rows % s.pool or cols % s.pool or not rows:
            raise ValueError(f"{width}x{height} px is not whole {s.pool}x{s.pool} pools")
        return (1, rows, cols)


def _budget_size(
    height: int, width: int, patch: int, max_patches: int, pool: int
) -> tuple[int, int]:
    """mlx-vlm 0.7.10's `get_aspect_ratio_preserving_size` (its Gemma 4 processor's resize
    target), restated so that the prompt side imports no MLX: the largest multiple of
    `pool * patch` px per side within `max_patches` patches, aspect ratio kept; a side that
    would vanish gets one multiple and the other its ratio's worth, capped."""
    factor = math.sqrt(max_patches * patch**2 / (height * width))
    side = pool * patch
    target_height = int(math.floor(factor * height / side)) * side
    target_width = int(math.floor(factor * width / side)) * side
    if target_height == 0 and target_width == 0:
        raise ValueError("Attempting to resize to a 0 x 0 image.")
    longest = (max_patches // pool**2) * side
    if target_height == 0:
        target_height = side
        target_width = min(int(math.floor(width / height)) * side, longest)
    elif target_width == 0:
        target_width = side
        target_height = min(int(math.floor(height / width)) * side, longest)
    return target_height, target_width
