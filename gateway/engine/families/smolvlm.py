"""SmolVLM (Idefics3-style) over mlx-vlm: the only module that knows SmolVLM's image layout.

An image is resized (longest edge to `size`), rounded up to whole tiles of `max_image_size`
pixels, cut into rows x cols tiles and followed by the whole image resized to one tile (the
global image); an image that fits in one tile is not split (one image, no row/col markers).
Each tile goes through the SigLIP tower alone, is pixel-shuffled by `scale_factor` and
projected to `image_seq_len` language-model tokens. The template's one `<image>` per image
expands to, per tile row, `<fake_token_around_image><row_r_col_c>` + `image_seq_len` x
`<image>` for each column and a newline, then `\\n<fake_token_around_image><global-img>` +
`image_seq_len` x `<image>` + `<fake_token_around_image>` (mlx-vlm's processor's expansion,
tokenized the same way). The language model is Llama-style (SmolLM2): 1D RoPE from the cache
offset, one full-attention KV cache per layer, so every cache part is exact (docs/caching.md).

Grid: `(1, rows * p, cols * p)` unmerged patches of the tiled image (p = patches per tile
side), `(1, p, p)` for an unsplit image (a split image has at least two tiles on one side, so
the two never meet); the engine's patch budget counts the tiles' patches.

Prompt side any thread, engine side engine thread only (see `ModelFamily`, `VlmFamily`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.families.family import Grid
from gateway.engine.families.vlm_base import VlmFamily

MODEL_TYPES = ("smolvlm",)
# The Idefics3 image processor's hard cap after the first resize (transformers' MAX_IMAGE_SIZE).
_MAX_IMAGE_SIZE = 4096
_SETTINGS = (
    "do_resize",
    "size",
    "resample",
    "do_image_splitting",
    "max_image_size",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "do_convert_rgb",
    "do_pad",
)


class SmolVLM(VlmFamily):
    """A loaded SmolVLM checkpoint. Construct on the thread that will own MLX."""

    family = "smolvlm"
    MODEL_TYPES = MODEL_TYPES
    EOS_MARKERS = ("<end_of_utterance>",)
    TEXT_AS_PARTS = True  # SmolVLM's template renders a plain string content as nothing

    def __init__(self, path: str, lazy: bool = False) -> None:
        super().__init__(path, lazy=lazy)
        config = self.model.config
        self._image_id = int(config.image_token_index)
        self.tile = int(self.image_processor.max_image_size["longest_edge"])
        self.patch = int(config.vision_config.patch_size)
        self.per_side = self.tile // self.patch
        self.seq_len = int(self.processor.image_seq_len)
        expected = self.per_side**2 // int(config.scale_factor) ** 2
        if self.seq_len != expected:
            # The processor would expand more or fewer tokens than the tower gives per tile.
            raise ValueError(
                f"processor image_seq_len {self.seq_len} != {expected} tokens per tile "
                f"({self.tile} px tiles, {self.patch} px patches, scale {config.scale_factor})"
            )
        self._runs: dict[tuple[int, int], list[int]] = {}

    # ----- prompt side (any thread) -----------------------------------------------------------

    @property
    def image_token_id(self) -> int:
        return self._image_id

    @property
    def placeholder_id(self) -> int:
        return self._image_id  # the template writes one `<image>` per image

    def processor_settings(self) -> dict[str, Any]:
        ip = self.image_processor
        settings = {k: getattr(ip, k, None) for k in _SETTINGS}
        settings["image_seq_len"] = self.processor.image_seq_len
        return settings

    def image_grid(self, width: int, height: int) -> Grid:
        """The grid `preprocess` gives, from the size alone (the processor's own arithmetic)."""
        rows, cols = self._tiles(width, height)
        p = self.per_side
        return (1, p, p) if rows == 0 else (1, rows * p, cols * p)

    def _tiles(self, width: int, height: int) -> tuple[int, int]:
        """(rows, cols) of tiles; (0, 0) for an image that is not split."""
        ip, tile = self.image_processor, self.tile
        if ip.do_resize:
            height, width = _resized(height, width, ip.size)
        if not ip.do_image_splitting:
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

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL RGB image -> (tiles then the global image: (n, 3, tile, tile) float32, grid),
        the checkpoint's own image processor's output."""
        out = self.image_processor([[image]], return_row_col_info=True)
        pixels = np.asarray(out["pixel_values"])[0]
        mask = out.get("pixel_attention_mask")
        if mask is not None and not np.asarray(mask).all():
            raise ValueError("the image processor padded a tile; that layout is not supported")
        rows, cols = int(out["rows"][0][0]), int(out["cols"][0][0])
        p = self.per_side
        grid = (1, p, p) if rows == 0 else (1, rows * p, cols * p)
        return np.ascontiguousarray(pixels, dtype=np.float32), grid

    def span_ids(self, grid: Grid) -> list[int]:
        rows, cols = self._rows_cols(grid)
        key = (rows, cols)
        run = self._runs.get(key)
        if run is None:
            from mlx_vlm.models.smolvlm.processing_smolvlm import get_image_prompt_string

            text = get_image_prompt_string(
                rows,
                cols,
                self.seq_len,
                fake_token_around_image=self.processor.fake_image_token,
                image_token=self.processor.image_token,
                global_image_token=self.processor.global_image_token,
            )
            run = self.tokenize(text)
            self._runs[key] = run  # a dict store is atomic; a race computes the same list
        return list(run)

    def _rows_cols(self, grid: Grid) -> tuple[int, int]:
        _, h, w = grid
        p = self.per_side
        if (h, w) == (p, p):
            return 0, 0
        return h // p, w // p

    def _tile_count(self, grid: Grid) -> int:
        rows, cols = self._rows_cols(grid)
        return 1 if rows == 0 else rows * cols + 1

    # ----- engine side (engine thread only) ---------------------------------------------------

    def tower_units(self) -> list[nn.Module]:
        vision = self.model.vision_model
        return [vision.embeddings, *vision.encoder.layers]

    def tower_features(self, images: Sequence[tuple[np.ndarray, Grid]]) -> list[mx.array]:
        """Every image's tiles through the tower as one batch (each tile attends only to
        itself, so a tile's features do not depend on the others), as mlx-vlm's
        `get_input_embeddings` runs it: float32 pixels, an all-true patch mask, the pooled
        output cast to the pixels' dtype, then the connector."""
        pixels = mx.array(np.concatenate([p for p, _ in images]))
        n = pixels.shape[0]
        patch_mask = mx.ones((n, self.per_side, self.per_side), dtype=mx.bool_)
        pooled, *_ = self.model.vision_model(
            pixels.transpose(0, 2, 3, 1), patch_attention_mask=patch_mask, output_hidden_states=True
        )
        features = self.model.connector(pooled.astype(pixels.dtype))
        out = []
        first = 0
        for _, grid in images:
            count = self._tile_count(grid)
            out.append(features[first : first + count].reshape(-1, features.shape[-1]))
            first += count
        return out


def _resized(height: int, width: int, size: dict[str, int]) -> tuple[int, int]:
    """The Idefics3 processor's first resize: the longest edge to `size["longest_edge"]`
    (even short side), then below 4096 px; or a fixed `height` x `width`."""
    if size.get("longest_edge"):
        longest = int(size["longest_edge"])
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
    return int(size["height"]), int(size["width"])
