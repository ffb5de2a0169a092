"""mRoPE positions for Qwen2/2.5/3-VL prompts, computed once per request with numpy.

Text tokens advance all three position axes by one. An image whose merged grid is
(t, h, w) occupies t*h*w tokens but only max(t, h, w) positions: its tokens sit at
`start + (ti, hi, wi)`, and the text after it resumes at `start + max(t, h, w)`. So every image
shifts the text after it by `max(t, h, w) - t*h*w` (the rope delta, <= 0).

This mirrors mlx-vlm's `get_rope_index` for images (checked by tests against it) without its
per-token Python loops and without touching the model's shared `_rope_deltas` state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ImageLayout:
    """Where one image's placeholder run sits in the prompt and its merged grid."""

    start: int  # token index of the first placeholder
    t: int
    h: int  # merged rows (patch rows // spatial_merge_size)
    w: int

    @property
    def num_tokens(self) -> int:
        return self.t * self.h * self.w

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def rope_shift(self) -> int:
        """How much this image moves the positions of the text after it (<= 0)."""
        return max(self.t, self.h, self.w) - self.num_tokens


def rope_delta_at(images: Sequence[ImageLayout], cut: int) -> int:
    """Rope delta for text at token index >= `cut`, given the images wholly before `cut`.

    `cut` must not fall inside an image span.
    """
    delta = 0
    for image in images:
        if image.end <= cut:
            delta += image.rope_shift
        elif image.start < cut:
            raise ValueError(f"cut {cut} falls inside an image span [{image.start}, {image.end})")
    return delta


def mrope_positions(length: int, images: Sequence[ImageLayout], start: int = 0) -> np.ndarray:
    """Positions (3, length - start) int32 for prompt tokens [start, length).

    `images` are ordered and non-overlapping; `start` must not fall inside an image.
    """
    out = np.empty((3, length), dtype=np.int32)
    cursor = 0  # next token index to fill
    delta = 0  # position = index + delta for text
    for image in images:
        text = np.arange(cursor, image.start, dtype=np.int32) + delta
        out[:, cursor : image.start] = text
        base = image.start + delta
        ti, hi, wi = np.meshgrid(
            np.arange(image.t), np.arange(image.h), np.arange(image.w), indexing="ij"
        )
        out[0, image.start : image.end] = base + ti.ravel()
        out[1, image.start : image.end] = base + hi.ravel()
        out[2, image.start : image.end] = base + wi.ravel()
        delta += image.rope_shift
        cursor = image.end
    out[:, cursor:length] = np.arange(cursor, length, dtype=np.int32) + delta
    if start:
        rope_delta_at(images, start)  # validates that start is not inside an image
    return out[:, start:]
