"""mRoPE positions for Qwen2/2.5/3-VL prompts, computed once per request with numpy.

Text tokens advance all three position axes by one. An image whose merged grid is
(t, h, w) occupies t*h*w tokens but only max(t, h, w) positions: its tokens sit at
`start + (ti, hi, wi)`, and the text after it resumes at `start + max(t, h, w)`. So every image
shifts the text after it by `max(t, h, w) - t*h*w` (the rope delta, <= 0).

A video (Qwen2/2.5-VL: one block of t temporal patches) is laid out the same way, except that
Qwen2.5-VL advances the time axis by `second_per_grid_t * tokens_per_second` per temporal patch
(truncated to an integer, in float32 as the reference computes it): `time_scale`. Its tokens
then sit at `start + (int(ti * time_scale), hi, wi)` and the text after it resumes one past the
largest of those. Qwen2-VL (and mlx-vlm 0.7.10's port of Qwen2.5-VL) use time_scale 1; Qwen3-VL
splits a video into one t=1 block per temporal patch with timestamp text between them, so each
block is an ordinary (1, h, w) layout.

This mirrors mlx-vlm's `get_rope_index` (checked by tests against it) without its per-token
Python loops and without touching the model's shared `_rope_deltas` state.
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
    time_scale: float = 1.0  # time-axis positions per temporal patch (Qwen2.5-VL video)

    @classmethod
    def flat(cls, start: int, num_tokens: int) -> ImageLayout:
        """A span of `num_tokens` tokens at consecutive 1D positions (a family without mRoPE:
        one position per token), so the text after it is not shifted (`rope_shift` 0)."""
        return cls(start, 1, 1, num_tokens)

    @property
    def t_positions(self) -> np.ndarray:
        """Time-axis offset of each temporal patch (int32, length t)."""
        if self.time_scale == 1.0:
            return np.arange(self.t, dtype=np.int32)
        scaled = np.arange(self.t, dtype=np.float32) * np.float32(self.time_scale)
        return scaled.astype(np.int32)  # truncation toward zero, as torch's .long()

    @property
    def span(self) -> int:
        """Positions the block occupies: one past its largest offset on any axis."""
        return max(int(self.t_positions[-1]) + 1, self.h, self.w)

    @property
    def num_tokens(self) -> int:
        return self.t * self.h * self.w

    @property
    def end(self) -> int:
        return self.start + self.num_tokens

    @property
    def rope_shift(self) -> int:
        """How much this image moves the positions of the text after it (<= 0)."""
        return self.span - self.num_tokens


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
            image.t_positions, np.arange(image.h), np.arange(image.w), indexing="ij"
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
