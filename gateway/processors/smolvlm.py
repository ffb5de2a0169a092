"""The prompt side of SmolVLM (Idefics3-style tiles): an image is resized (longest edge to
`size`), rounded up to whole tiles of `max_image_size` px and cut into rows x cols tiles,
followed by the whole image as one tile (the global image); an image that fits in one tile is
not split. The template's one `<image>` per image expands to, per tile row,
`<fake_token_around_image><row_r_col_c>` + `image_seq_len` x `<image>` for each column and a
newline, then `\\n<fake_token_around_image><global-img>` + `image_seq_len` x `<image>` +
`<fake_token_around_image>` (mlx-vlm's processor's expansion, tokenized the same way).

Grid: `(1, rows * p, cols * p)` unmerged patches of the tiled image (p = patches per tile
side), `(1, p, p)` for an unsplit image (a split image has at least two tiles on one side, so
the two never meet).

`SmolVLMSettings` is resolved once by the engine-side family from mlx-vlm's config and
processor (`gateway.engine.families.smolvlm`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gateway.processors.processor import Grid
from gateway.processors.vlm import VlmProcessor

# The Idefics3 image processor's hard cap after the first resize (transformers' MAX_IMAGE_SIZE).
_MAX_IMAGE_SIZE = 4096


@dataclass(frozen=True)
class SmolVLMSettings:
    """A SmolVLM checkpoint's prompt settings: the `<image>` id, the tile side (px, the
    processor's `max_image_size`) and patches per tile side, image tokens per tile, the
    first resize (to `longest_edge`, else to `fixed_size`; only when `do_resize`), whether
    images are split into tiles, and the separators' text."""

    image_token_id: int
    tile: int
    per_side: int
    seq_len: int
    longest_edge: int | None
    fixed_size: tuple[int, int] | None  # (height, width)
    do_resize: bool
    do_image_splitting: bool
    fake_image_token: str
    image_token: str
    global_image_token: str


class SmolVLMProcessor(VlmProcessor):
    """A SmolVLM checkpoint's prompt side. See the module doc."""

    family = "smolvlm"
    text_as_parts = True  # SmolVLM's template renders a plain string content as nothing

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: SmolVLMSettings):
        image_id = settings.image_token_id
        # The template writes one `<image>` per image: the placeholder is the image token.
        super().__init__(path, model_type, tokenizer, image_id, image_id)
        self.settings = settings
        self._runs: dict[tuple[int, int], list[int]] = {}

    def image_grid(self, width: int, height: int) -> Grid:
        """The grid the processor gives, from the size alone (the processor's own arithmetic)."""
        rows, cols = self._tiles(width, height)
        p = self.settings.per_side
        return (1, p, p) if rows == 0 else (1, rows * p, cols * p)

    def _tiles(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of tiles; (0, 0) for an image that is not split."""
        s, tile = self.settings, self.settings.tile
        if s.do_resize:
            height, width = self._resized(height, width)
        if not s.do_image_splitting:
            return 0, 0
        # resize_for_vision_encoder: each side up to whole tiles, keeping the aspect ratio.
        aspect = width / height
        if width >= height:
            width = math.ceil(width / tile) * tile
            height = math.ceil(int(width / aspect) / tile) * tile
        else:
            height = math.ceil(height / tile) * tile
            width = math.ceil(int(height * aspect) / tile) * tile
        if height > tile or width > tile:
            return height // tile, width // tile
        return 0, 0

    def _resized(self, height: int, width: int) -> tuple[int, int]:
        """The Idefics3 processor's first resize: the longest edge to `longest_edge` (even
        short side), then below 4096 px; or a fixed `height` x `width`."""
        longest = self.settings.longest_edge
        if not longest:
            fixed = self.settings.fixed_size
            if fixed is None:
                raise ValueError("the image processor's size has no longest_edge or height/width")
            return fixed
        aspect = width / height
        if width >= height:
            width = longest
            height = int(width / aspect)
            height += height % 2
        else:
            height = longest
            width = int(height * aspect)
            width += width % 2
        height, width = max(height, 1), max(width, 1)
        aspect = width / height
        if width >= height and width > _MAX_IMAGE_SIZE:
            width = _MAX_IMAGE_SIZE
            height = int(width / aspect)
        elif height > width and height > _MAX_IMAGE_SIZE:
            height = _MAX_IMAGE_SIZE
            width = int(height * aspect)
        return max(height, 1), max(width, 1)

    def rows_cols(self, grid: Grid) -> tuple[int, int]:
        """(rows, cols) of tiles of an image of this grid; (0, 0) when it is not split."""
        _, h, w = grid
        p = self.settings.per_side
        if (h, w) == (p, p):
            return 0, 0
        return h // p, w // p

    def span_ids(self, grid: Grid) -> list[int]:
        key = self.rows_cols(grid)
        run = self._runs.get(key)
        if run is None:
            run = self.tokenize(self._span_text(*key))
            self._runs[key] = run  # a dict store is atomic; a race computes the same list
        return list(run)

    def _span_text(self, rows: int, cols: int) -> str:
        """mlx-vlm 0.7.10's `get_image_prompt_string` (its SmolVLM processor's expansion of
        one `<image>`), restated so that the prompt side imports no MLX."""
        s = self.settings
        fake, image, glob = s.fake_image_token, s.image_token, s.global_image_token
        whole = f"{fake}{glob}{image * s.seq_len}{fake}"
        if rows == 0 and cols == 0:
            return whole
        text = ""
        for r in range(rows):
            for c in range(cols):
                text += f"{fake}<row_{r + 1}_col_{c + 1}>{image * s.seq_len}"
            text += "\n"
        return f"{text}\n{whole}"
