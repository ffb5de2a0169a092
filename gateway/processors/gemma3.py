"""The prompt side of Gemma 3: the template writes `<start_of_image>` where an image part is;
the reference processor replaces each by `\\n\\n<start_of_image>` + `image_seq_length` x
`<image_soft_token>` + `<end_of_image>\\n\\n` before tokenizing. `tokenize` writes the newlines
and both markers, `layout_prompt` the soft tokens between them (special tokens split the
text, so the ids are the processor's); the span is the soft tokens only. Every image is
resized to the tower's square, so the token count is fixed.

`Gemma3Settings` is resolved once by the engine-side family from mlx-vlm's config and
processor (`gateway.engine.families.gemma3`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Self

from gateway.processors.positions import ImageLayout
from gateway.processors.processor import Grid, PromptProcessor
from gateway.processors.video_layout import VideoLayout


@dataclass(frozen=True)
class Gemma3Settings:
    """A Gemma 3 checkpoint's prompt settings: the soft token's id, the image markers (text
    and ids) and the grid every image gets (`tokens_per_image` soft tokens as (1, side,
    tokens / side))."""

    image_token_id: int
    boi: str  # `<start_of_image>`
    eoi: str  # `<end_of_image>`
    boi_id: int
    eoi_id: int
    grid: Grid

    @classmethod
    def read(cls, tokenizer: Any, image_token_id: int, grid: Grid, **more: Any) -> Self:
        """The settings with the image markers mlx-vlm's tokenizer names (`boi_token`,
        `eoi_token`) and their ids; `more` fills a subclass's own fields."""
        boi, eoi = tokenizer.boi_token, tokenizer.eoi_token
        return cls(
            image_token_id=image_token_id,
            boi=boi,
            eoi=eoi,
            boi_id=int(tokenizer.convert_tokens_to_ids(boi)),
            eoi_id=int(tokenizer.convert_tokens_to_ids(eoi)),
            grid=grid,
            **more,
        )


class Gemma3Processor(PromptProcessor):
    """A Gemma 3 checkpoint's prompt side. See the module doc."""

    family = "gemma3"
    media = frozenset({"image"})

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: Gemma3Settings):
        super().__init__(path, model_type, tokenizer)
        self.settings = settings

    def tokenize(self, text: str, special_tokens: bool = False) -> list[int]:
        """Token ids of `text`, each `<start_of_image>` written out as the processor
        writes it (newlines and both markers; `layout_prompt` adds the soft tokens)."""
        s = self.settings
        return super().tokenize(text.replace(s.boi, f"\n\n{s.boi}{s.eoi}\n\n"), special_tokens)

    def image_grid(self, width: int, height: int) -> Grid:
        """Every image becomes the same soft tokens (the tower's square)."""
        if width < 1 or height < 1:
            raise ValueError(f"an image of {width}x{height} pixels")
        return self.settings.grid

    def no_video(self) -> ValueError:
        return ValueError("Gemma 3 takes no video")

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Put each image's soft tokens between its `<start_of_image><end_of_image>` pair;
        one flat span per image (the soft tokens)."""
        s = self.settings
        starts = [i for i, t in enumerate(ids) if t == s.boi_id]
        if len(starts) != len(grids) or any(isinstance(g, VideoLayout) for g in grids):
            raise ValueError(f"prompt has {len(starts)} image markers for {len(grids)} images")
        out: list[int] = []
        layouts: list[ImageLayout] = []
        cursor = 0
        for start, grid in zip(starts, grids):
            if start + 1 >= len(ids) or ids[start + 1] != s.eoi_id:
                raise ValueError("an image marker is not followed by its end marker")
            out.extend(ids[cursor : start + 1])
            count = grid[0] * grid[1] * grid[2]  # type: ignore[index]
            layouts.append(ImageLayout.flat(len(out), count))
            out.extend([s.image_token_id] * count)
            cursor = start + 1
        out.extend(ids[cursor:])
        return out, layouts
