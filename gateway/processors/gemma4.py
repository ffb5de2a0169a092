"""The prompt side of Gemma 4: the template writes `<|image|>` where an image part is; the
reference processor replaces it by `<|image>` + one `<|image|>` soft token per pooled patch
+ `<image|>` (`VlmProcessor` expands the ids). Each image is resized, aspect ratio kept, to
the largest multiple of `pooling_kernel_size * patch_size` px per side within
`max_soft_tokens * k^2` patches, so the token count follows the image's shape.

`Gemma4Settings` is resolved once by the engine-side family from mlx-vlm's config and image
processor (`gateway.engine.families.gemma4`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gateway.processors.processor import Grid
from gateway.processors.vlm import VlmProcessor


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


class Gemma4Processor(VlmProcessor):
    """A Gemma 4 checkpoint's prompt side. See the module doc."""

    family = "gemma4"

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: Gemma4Settings):
        image_id = settings.image_token_id
        # The template writes one `<|image|>` per image: the placeholder is the soft token.
        super().__init__(path, model_type, tokenizer, image_id, image_id)
        self.settings = settings

    def span_ids(self, grid: Grid) -> list[int]:
        s = self.settings
        _, h, w = grid
        return [s.boi_id, *[s.image_token_id] * (h * w // s.pool**2), s.eoi_id]

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
