"""The prompt side of LFM2-VL: the template writes one `<image>` per image part; mlx-vlm's
LFM2-VL processor (its NumPy image processor, `models/lfm2_vl/processing_lfm2_vl.py` of
mlx-vlm 0.7.10) decides each image's views from its size and expands the `<image>` into:

- a small image (its smart-resized size within `max_pixels_tolerance` x the token budget, or
  tiling off): one view, smart-resized to multiples of `patch * factor` px per side with
  between `min_image_tokens` and `max_image_tokens` tokens; the run is `<|image_start|>` +
  one `<image>` per token (the view's patch grid pixel-unshuffled by `factor`, odd sides
  padded up) + `<|image_end|>`;
- a large one: resized to a grid of `tile_size` px tiles (rows x cols within [min_tiles,
  max_tiles], the aspect ratio closest, ties to the grid whose area best fits the image),
  plus, with `use_thumbnail`, the whole image smart-resized as above (the thumbnail, last);
  the run is `<|image_start|>`, per tile (row-major) `<|img_row_R_col_C|>` + the tile's
  tokens, then `<|img_thumbnail|>` + the thumbnail's tokens, then `<|image_end|>` (the
  markers only when `use_image_special_tokens`).

Grid (what the prompt side and the engine agree on, from the size alone): `(1, h, w)` for a
single view of h x w patches; for a tiled image `(views, rows * PACK + th, cols * PACK + tw)`
with (th, tw) the thumbnail's patches ((0, 0) without one) and `views` the tile count plus
the thumbnail. `PACK` exceeds any view side in patches, so the two forms never meet and each
decodes back (`Lfm2VlProcessor.views`). The product overstates a tiled image's patches: the
engine's tower budget then encodes such an image in a group of its own.

`Lfm2VlSettings` is resolved once by the engine-side family from mlx-vlm's loaded image
processor (`gateway.engine.families.lfm2_vl`): mlx-vlm re-applies the official tiling
defaults whatever the checkpoint's files say, so the loaded values are the ones to read.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from gateway.processors.processor import Grid
from gateway.processors.vlm import VlmProcessor

PACK = 1 << 14  # larger than any view side in patches (a side is at most max tokens x factor)


@dataclass(frozen=True)
class Lfm2VlSettings:
    """An LFM2-VL checkpoint's prompt settings (every one that changes token counts):
    the `<image>` id and the marker texts, the encoder patch side (px) and pixel-unshuffle
    factor, the single-view token budget, and the tiling settings."""

    image_token_id: int
    image_token: str
    image_start_token: str
    image_end_token: str
    thumbnail_token: str
    use_image_special_tokens: bool
    patch: int
    factor: int
    min_image_tokens: int
    max_image_tokens: int
    max_pixels_tolerance: float
    do_image_splitting: bool
    tile_size: int
    min_tiles: int
    max_tiles: int
    use_thumbnail: bool


class Lfm2VlProcessor(VlmProcessor):
    """An LFM2-VL checkpoint's prompt side. See the module doc."""

    family = "lfm2_vl"

    def __init__(self, path: str, model_type: str, tokenizer: Any, settings: Lfm2VlSettings):
        image_id = settings.image_token_id
        # The template writes one `<image>` per image: the placeholder is the image token.
        super().__init__(path, model_type, tokenizer, image_id, image_id)
        if settings.do_image_splitting and settings.min_tiles < 2:
            # A 1 x 1 grid is tiled in pixels (one tile_size view) but expanded as an untiled
            # image in text by mlx-vlm's processor: the counts would disagree.
            raise ValueError(f"min_tiles {settings.min_tiles} < 2 is not supported")
        self.settings = settings
        self._runs: dict[Grid, list[int]] = {}

    # ----- grids -------------------------------------------------------------------------------

    def image_grid(self, width: int, height: int) -> Grid:
        """The grid mlx-vlm's processor gives an image of this size (module doc)."""
        s = self.settings
        if width < 1 or height < 1:
            raise ValueError(f"image of {width} x {height} px")
        th, tw = self._smart_resize(height, width)
        if s.do_image_splitting and self._too_large(height, width):
            cols, rows = self._grid_layout(height, width)
            tp = s.tile_size // s.patch
            thumb = s.use_thumbnail and rows * cols > 1
            views = rows * cols + int(thumb)
            h, w = (th // s.patch, tw // s.patch) if thumb else (0, 0)
            if tp >= PACK or h >= PACK or w >= PACK:
                raise ValueError(f"image of {width} x {height} px: a view too large to lay out")
            return (views, rows * PACK + h, cols * PACK + w)
        h, w = th // s.patch, tw // s.patch
        if h >= PACK or w >= PACK:
            raise ValueError(f"image of {width} x {height} px: a view too large to lay out")
        return (1, h, w)

    def views(self, grid: Grid) -> tuple[int, int, list[tuple[int, int]]]:
        """(rows, cols, each view's (h, w) patches in prompt order) of an image of this grid;
        rows = cols = 0 for a single view."""
        t, h, w = grid
        if t == 1 and h < PACK and w < PACK:
            return 0, 0, [(h, w)]
        rows, th = divmod(h, PACK)
        cols, tw = divmod(w, PACK)
        tp = self.settings.tile_size // self.settings.patch
        out = [(tp, tp)] * (rows * cols)
        if th and tw:
            out.append((th, tw))
        if len(out) != t:
            raise ValueError(f"grid {grid} is not an LFM2-VL image grid")
        return rows, cols, out

    def tokens(self, h: int, w: int) -> int:
        """Image tokens of a view of h x w patches: the pixel unshuffle pads odd sides."""
        f = self.settings.factor
        return -(-h // f) * -(-w // f)

    # ----- the span ----------------------------------------------------------------------------

    def span_ids(self, grid: Grid) -> list[int]:
        run = self._runs.get(grid)
        if run is None:
            run = self.tokenize(self._span_text(grid))
            self._runs[grid] = run  # a dict store is atomic; a race computes the same list
        return list(run)

    def _span_text(self, grid: Grid) -> str:
        """mlx-vlm 0.7.10's expansion of one `<image>` (its processor's `__call__`)."""
        s = self.settings
        rows, cols, views = self.views(grid)
        marks = s.use_image_special_tokens
        text = s.image_start_token if marks else ""
        if rows == 0:
            text += s.image_token * self.tokens(*views[0])
        else:
            for r in range(rows):
                for c in range(cols):
                    if marks:
                        text += f"<|img_row_{r + 1}_col_{c + 1}|>"
                    text += s.image_token * self.tokens(*views[r * cols + c])
            if len(views) > rows * cols:
                text += s.thumbnail_token if marks else ""
                text += s.image_token * self.tokens(*views[-1])
        return text + (s.image_end_token if marks else "")

    # ----- mlx-vlm's arithmetic, restated (no MLX here) ----------------------------------------

    def _smart_resize(self, height: int, width: int) -> tuple[int, int]:
        """`_smart_resize`: (height, width) px of a single view or the thumbnail."""
        s = self.settings
        total = s.patch * s.factor
        min_pixels = s.min_image_tokens * s.patch**2 * s.factor**2
        max_pixels = s.max_image_tokens * s.patch**2 * s.factor**2
        h = max(total, round(height / total) * total)
        w = max(total, round(width / total) * total)
        if h * w > max_pixels:
            beta = math.sqrt((height * width) / max_pixels)
            h = max(total, math.floor(height / beta / total) * total)
            w = max(total, math.floor(width / beta / total) * total)
        elif h * w < min_pixels:
            beta = math.sqrt(min_pixels / (height * width))
            h = math.ceil(height * beta / total) * total
            w = math.ceil(width * beta / total) * total
        return h, w

    def _too_large(self, height: int, width: int) -> bool:
        """`_is_image_too_large`."""
        s = self.settings
        total = s.patch * s.factor
        h = max(s.patch, round(height / total) * total)
        w = max(s.patch, round(width / total) * total)
        limit = s.max_image_tokens * s.patch**2 * s.factor**2 * s.max_pixels_tolerance
        return h * w > limit

    def _grid_layout(self, height: int, width: int) -> tuple[int, int]:
        """`_get_grid_layout`'s (grid width, grid height): the closest aspect ratio among the
        grids of min_tiles..max_tiles tiles, ties to the later grid when the image's area
        exceeds half the grid's."""
        s = self.settings
        grids = [
            (a, b)
            for n in range(s.min_tiles, s.max_tiles + 1)
            for a in range(1, n + 1)
            for b in range(1, n + 1)
            if s.min_tiles <= a * b <= s.max_tiles
        ]
        # The same list through the same set: ties of equal tile count keep mlx-vlm's order.
        ratios = sorted(set(grids), key=lambda r: r[0] * r[1])
        aspect = width / height
        best, best_diff = (1, 1), float("inf")
        for a, b in ratios:
            diff = abs(aspect - a / b)
            if diff < best_diff:
                best, best_diff = (a, b), diff
            elif diff == best_diff and width * height > 0.5 * s.tile_size**2 * a * b:
                best = (a, b)
        return best
