"""Mistral 3's vision side (a Pixtral tower and Mistral 3's projector), one unit at a time.

The tower is mlx-vlm's own modules (patch convolution, `ln_pre`, the 2D rotary embedding over
the patch grid, the encoder layers, the multimodal projector with its learned 2 x 2 patch
merger); only the loop that strings them together lives here, so the engine can decode
between two units: the patch embedding, then each encoder layer, then the projector.

Each image is its own forward, exactly as mlx-vlm computes a single image (the 2D position
ids over its own grid, its own zero block mask), so an image's features depend on its pixels
alone, never on which images share its tower call: a cached feature row is the row a fresh
encode would give. (mlx-vlm runs several images of one prompt as one sequence with a block
mask; on CPU its rows equal the per-image ones bit for bit, pinned by
tests/gateway/engine/families/test_mistral3_vision.py.)

The features an image hands the prompt hold one row per token of its span: the projector's
row for each `[IMG]` and the token embedding of `[IMG_BREAK]` after each cell row but the
last, whose place `[IMG_END]` takes, so a span (breaks and end included) is one unit for the
caches and its embeddings are those mlx-vlm's merge writes.

Engine thread only.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_vlm.models.pixtral.vision import (
    generate_block_attention_mask,
    position_ids_in_meshgrid,
)

from gateway.engine.model.vision import EncodedImage

Grid = tuple[int, int, int]


class PixtralEncoder:
    """Runs `model` (mlx-vlm's mistral3 `Model`) from pixels to span features.

    `break_id` / `end_id`: the `[IMG_BREAK]` / `[IMG_END]` token ids; `embed_dtype`: the dtype
    of the language model's input embeddings (features are cast to it, as mlx-vlm's merge
    does when both agree). Reads the model's weights only."""

    def __init__(self, model: Any, break_id: int, end_id: int, embed_dtype: mx.Dtype) -> None:
        self.model = model
        self.vision = model.vision_tower.vision_model
        self.projector = model.multi_modal_projector
        self.patch = int(self.vision.patch_size)
        self.merge = int(model.config.spatial_merge_size)
        self.embed_dtype = embed_dtype
        self.dtype = self.vision.patch_conv.weight.dtype
        self.layers = _layers_used(len(self.vision.transformer.layers), model.vision_feature_layer)
        self._tail_ids = mx.array([break_id, end_id], dtype=mx.int32)

    def span_tokens(self, grid: Grid) -> int:
        """Tokens of the span of an image with this patch grid: cells + one per cell row."""
        rows, cols = grid[1] // self.merge, grid[2] // self.merge
        return rows * cols + rows

    def steps_many(
        self,
        images: Sequence[tuple[np.ndarray, Grid]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[None, None, list[EncodedImage]]:
        """Images ((3, H, W) float pixels, (1, H/patch, W/patch) grid) through the tower,
        one unit per `next()` while `stepwise()` (else the rest as one graph); returns each
        image's span features ((span tokens, hidden), `embed_dtype`), in order."""
        states = [self._embed_patches(pixels, grid) for pixels, grid in images]
        hidden = [h for h, _, _ in states]
        yield from self._unit(hidden, stepwise)
        for layer in self.vision.transformer.layers[: self.layers]:
            hidden = [
                layer(h, mask=mask, position_embeddings=pe)
                for h, (_, pe, mask) in zip(hidden, states)
            ]
            yield from self._unit(hidden, stepwise)
        encoded = [EncodedImage(self._span(h, grid), None) for h, (_, grid) in zip(hidden, images)]
        mx.eval([e.features for e in encoded])
        return encoded

    def _unit(
        self, outputs: list[mx.array], stepwise: Callable[[], bool]
    ) -> Generator[None, None, None]:
        if stepwise():
            mx.eval(outputs)
            yield

    def _embed_patches(
        self, pixels: np.ndarray, grid: Grid
    ) -> tuple[mx.array, tuple[mx.array, mx.array], mx.array]:
        """Patch embedding of one image with its 2D rotary embedding and block mask, built
        as mlx-vlm's `PixtralVisionModel` builds them for a single image."""
        rows, cols = grid[1], grid[2]
        x = mx.array(pixels)[None].transpose(0, 2, 3, 1).astype(self.dtype)
        patches = self.vision.patch_conv(x)[0, :rows, :cols]
        flat = self.vision.ln_pre(patches.reshape(-1, patches.shape[-1])[None])
        max_width = self.vision.config.image_size // self.vision.config.patch_size
        position_ids = position_ids_in_meshgrid([patches], max_width=max_width)
        rope = self.vision.patch_positional_embedding(flat, position_ids)
        mask = generate_block_attention_mask([rows * cols], flat)
        return flat, rope, mask

    def _span(self, hidden: mx.array, grid: Grid) -> mx.array:
        """Projector features of one image laid out as its span: each cell row followed by
        `[IMG_BREAK]`, the last by `[IMG_END]`."""
        size = [(grid[1] * self.patch, grid[2] * self.patch)]
        cells = self.projector(hidden[0], size).astype(self.embed_dtype)
        rows, cols = grid[1] // self.merge, grid[2] // self.merge
        pair = self.model.language_model.model.embed_tokens(self._tail_ids)  # (2, hidden)
        tails = mx.concatenate([mx.repeat(pair[:1], rows - 1, axis=0), pair[1:]])
        laid = mx.concatenate([cells.reshape(rows, cols, -1), tails[:, None, :]], axis=1)
        return laid.reshape(rows * (cols + 1), -1)


def _layers_used(count: int, feature_layer: Any) -> int:
    """Encoder layers to run for mlx-vlm's `hidden_states[vision_feature_layer]` (index 0 is
    the patch embedding, i the output of layer i). ValueError for a list of layers, which
    mlx-vlm 0.7.10's mistral3 does not take either."""
    if not isinstance(feature_layer, int) or not -(count + 1) <= feature_layer <= count:
        raise ValueError(f"unsupported vision_feature_layer {feature_layer!r}")
    return feature_layer % (count + 1)
