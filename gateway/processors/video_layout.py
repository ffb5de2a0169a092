"""Where a video's tokens go in a Qwen-VL prompt. Pure Python; thread-safe.

The chat template renders a video as `<|vision_start|><|video_pad|><|vision_end|>`; the
model's processor then expands the single `<|video_pad|>`:
- Qwen2-VL and Qwen2.5-VL: into one run of t * h * w video tokens (t temporal patches of
  merged h x w tokens), one position block whose time axis Qwen2.5-VL scales by
  `second_per_grid_t * tokens_per_second` (`ImageLayout.time_scale`);
- Qwen3-VL: the whole wrapped placeholder into, per temporal patch,
  `<t.t seconds><|vision_start|>` + h * w video tokens + `<|vision_end|>`, each block an
  ordinary (1, h, w) layout.
`expand_video` does that on token ids, exactly as mlx-vlm's processors do on text (tested
against them, prompt and positions).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from gateway.processors.positions import ImageLayout


@dataclass(frozen=True)
class VideoLayout:
    """A clip's place in the prompt: its patch grid (t, h, w) in unmerged patches, the
    time-axis scale of its positions (Qwen2.5-VL) and, for Qwen3-VL, each temporal patch's
    timestamp in seconds (None: one block for the whole clip)."""

    grid: tuple[int, int, int]
    time_scale: float = 1.0
    stamps: tuple[float, ...] | None = None

    @property
    def blocks(self) -> int:
        """Placeholder runs the clip takes in the prompt."""
        return 1 if self.stamps is None else len(self.stamps)


@dataclass(frozen=True)
class VideoTokens:
    """The token ids a model uses around video placeholders."""

    video: int
    vision_start: int
    vision_end: int
    merge_size: int


def expand_video(
    out: list[int],
    layouts: list[ImageLayout],
    video: VideoLayout,
    tokens: VideoTokens,
    tokenize: Callable[[str], list[int]],
) -> None:
    """Append the clip's expansion to `out` (the prompt so far, which ends just before the
    template's `<|video_pad|>`) and its layouts to `layouts`. For Qwen3-VL the template's
    `<|vision_start|>` before the placeholder is replaced and its `<|vision_end|>` after it
    (still to come in the caller's token stream) closes the last block."""
    t, h, w = video.grid
    m = tokens.merge_size
    if video.stamps is None:
        layout = ImageLayout(len(out), t, h // m, w // m, video.time_scale)
        layouts.append(layout)
        out.extend([tokens.video] * layout.num_tokens)
        return
    wrapped = bool(out) and out[-1] == tokens.vision_start
    if wrapped:
        out.pop()
    for k, seconds in enumerate(video.stamps):
        out.extend(tokenize(f"<{seconds:.1f} seconds>"))
        out.append(tokens.vision_start)
        layout = ImageLayout(len(out), 1, h // m, w // m)
        layouts.append(layout)
        out.extend([tokens.video] * layout.num_tokens)
        if k < len(video.stamps) - 1 or not wrapped:
            out.append(tokens.vision_end)
