"""Mistral 3 (`model_type` "mistral3": Mistral Small 3.1 / 3.2, Pixtral vision) over mlx-vlm:
the only module that knows Pixtral's image layout.

Prompt side (any thread): the checkpoint's own chat template writes one `[IMG]` where each
image part stands; it expands into Pixtral's variable-resolution span: one row of `[IMG]` per
row of `spatial_merge_size`-merged patch cells, `[IMG_BREAK]` after each row but the last,
`[IMG_END]` after that. The cell grid comes from the image's size alone: mlx-vlm's Pixtral
image processor scales an image down (never up) until it fits `size.longest_edge`, then
rounds each side up to whole cells (`patch_size * spatial_merge_size` px), so the token count
follows the image's shape and those settings (`processor_settings`, the cache key, holds them
with every setting that changes pixels). `preprocess` is that processor itself, called as
mlx-vlm's Mistral 3 processor calls it: its pixels are the reference's by construction.

Engine side (engine thread): mlx-vlm's Pixtral tower and Mistral 3 projector, each image its
own forward as mlx-vlm computes a single image (2D RoPE over its own patch grid, its own block
mask), so an image's features depend on its pixels alone, never on which images share its
tower call (mlx-vlm runs a prompt's images as one sequence with a block mask; on CPU its rows
equal the per-image ones bit for bit, pinned by the reference tests with two images). The
tower steps one unit per engine step (the patch convolution, then each encoder layer). The
language model is mlx-vlm's `Mistral`: 1D RoPE from each layer's cache offset and full
attention in every layer (one trimmable `KVCache` each), so the prefix cache, its disk tier
and the vision cache are all exact and on (docs/caching.md). The rest is `VlmFamily`'s.

Only the `mistral` text model is served: mlx-vlm's `ministral3` text model scales attention
by row 0's position for every row of a batch (a batched answer would not be the answer
alone) and keeps sliding-window layers in some sizes; `mistral4` keeps a latent KV. Both are
refused at load.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_vlm.models.pixtral.image_processing_pixtral import (
    _size_to_pair,
    get_resize_output_image_size,
)
from mlx_vlm.models.pixtral.vision import (
    generate_block_attention_mask,
    position_ids_in_meshgrid,
)
from PIL import Image

from gateway.engine.families.family import Grid
from gateway.engine.families.vlm_base import VlmFamily

MODEL_TYPES = ("mistral3",)
TEXT_MODEL_TYPES = ("mistral",)
# Image-processor settings that change the pixels or the cell grid (and so the token count).
_SETTINGS = (
    "size",
    "patch_size",
    "image_mean",
    "image_std",
    "do_resize",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "do_convert_rgb",
    "resample",
)


class Mistral3(VlmFamily):
    """A loaded Mistral 3 checkpoint. Construct on the thread that will own MLX; `lazy`:
    weights unread (prompt side only)."""

    family = "mistral3"
    MODEL_TYPES = MODEL_TYPES
    EOS_MARKERS = ("</s>",)

    def __init__(self, path: str, lazy: bool = False) -> None:
        super().__init__(path, lazy=lazy)
        config = self.model.config
        text_type = str(config.text_config.model_type)
        if text_type not in TEXT_MODEL_TYPES:
            raise ValueError(
                f"{self.model_type} with a {text_type!r} text model is not served "
                f"(served: {', '.join(TEXT_MODEL_TYPES)})"
            )
        self.patch = int(config.vision_config.patch_size)
        self.merge = int(config.spatial_merge_size)
        if int(self.processor.patch_size) != self.patch:
            raise ValueError(
                f"processor patch size {self.processor.patch_size} != the tower's {self.patch}"
            )
        self.cell = self.patch * int(self.processor.spatial_merge_size)  # px per cell side
        self._image_id = int(config.image_token_index)
        self.break_id = int(self.processor.image_break_token_id)
        self.end_id = int(self.processor.image_end_token_id)
        vision = self.model.vision_tower.vision_model
        self._layers = _layers_used(len(vision.transformer.layers), config.vision_feature_layer)
        # The tower's 2D RoPE table covers this many patches per side (`image_size`); a
        # processor set to a longer edge (or not resizing) would index past it.
        self.max_side = int(config.vision_config.image_size) // self.patch

    # ----- prompt side (any thread) -----------------------------------------------------------

    @property
    def image_token_id(self) -> int:
        return self._image_id

    @property
    def placeholder_id(self) -> int:
        return self._image_id  # the template writes one `[IMG]` per image

    def processor_settings(self) -> dict[str, Any]:
        """Called by the base's `__init__`, before this class's own attributes exist."""
        proc = self.processor
        settings = {k: getattr(self.image_processor, k, None) for k in _SETTINGS}
        settings["cell"] = (proc.patch_size, proc.spatial_merge_size)  # px per cell side
        settings["tokens"] = (proc.image_token, proc.image_break_token, proc.image_end_token)
        return settings

    def render(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The checkpoint's template, with a leading system message's text given as one text
        part: Mistral Small 3.1's template reads a first system message as
        `content[0]['text']` whatever its type (a plain string fails to render) and writes
        exactly that text; other messages render their string content as it is."""
        if messages and messages[0]["role"] == "system":
            content = messages[0]["content"]
            if isinstance(content, str):
                first = {**messages[0], "content": [{"type": "text", "text": content}]}
                messages = [first, *messages[1:]]
        return super().render(messages, tools, template_kwargs)

    def image_grid(self, width: int, height: int) -> Grid:
        """(1, rows, cols) in tower patches of the processor's output for this size (the
        processor's own arithmetic). ValueError for an image so elongated that a side
        would scale to nothing, or one the processor leaves larger than the tower's
        `image_size` (a processor edge set past it: mlx-vlm would read past the tower's 2D
        position table)."""
        ip = self.image_processor
        h, w = height, width
        if ip.do_resize:
            edge = _size_to_pair(ip.size)
            scale = max(height / edge[0], width / edge[1])
            if scale > 1 and (int(height / scale) < 1 or int(width / scale) < 1):
                raise ValueError(f"a side would scale below 1 px to fit {edge[0]} px")
            h, w = get_resize_output_image_size((height, width), edge, (self.cell, self.cell))
        if h < self.cell or w < self.cell:
            raise ValueError(f"a side under {self.cell} px makes no image tokens")
        if max(h, w) > self.max_side * self.patch:
            raise ValueError(
                f"the processor makes it {w}x{h} px, over the vision tower's "
                f"{self.max_side * self.patch} px (its position table)"
            )
        return (1, h // self.patch, w // self.patch)

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL image -> ((3, H, W) float32 pixels, grid): mlx-vlm's Pixtral image processor
        called as its Mistral 3 processor calls it (cells of `patch * merge` px)."""
        if not isinstance(image, Image.Image):
            raise ValueError(f"{self.model_type} takes images only")
        out = self.image_processor([image], patch_size=self.cell)
        h, w = (int(x) for x in out["image_sizes"][0])
        pixels = np.ascontiguousarray(np.asarray(out["pixel_values"])[0, :, :h, :w])
        return pixels, (1, h // self.patch, w // self.patch)

    def span_ids(self, grid: Grid) -> list[int]:
        """Rows of `[IMG]` cells, `[IMG_BREAK]` between rows, `[IMG_END]` last."""
        rows, cols = grid[1] // self.merge, grid[2] // self.merge
        run: list[int] = []
        for row in range(rows):
            run.extend([self._image_id] * cols)
            run.append(self.break_id if row < rows - 1 else self.end_id)
        return run

    # ----- engine side (engine thread only) ---------------------------------------------------

    def tower_units(self) -> list[nn.Module]:
        vision = self.model.vision_tower.vision_model
        return [vision.patch_conv, *vision.transformer.layers]

    def tower_features(self, images: Sequence[tuple[np.ndarray, Grid]]) -> list[mx.array]:
        """Each image through the tower alone, as mlx-vlm's `PixtralVisionModel` runs one
        image, up to `vision_feature_layer`, then the projector (norm, 2 x 2 patch merger,
        MLP): (cells, hidden) each, lazily."""
        vision = self.model.vision_tower.vision_model
        max_width = vision.config.image_size // vision.config.patch_size
        out = []
        for pixels, (_, rows, cols) in images:
            x = mx.array(pixels)[None].transpose(0, 2, 3, 1).astype(vision.patch_conv.weight.dtype)
            patches = vision.patch_conv(x)[0, :rows, :cols]
            hidden = vision.ln_pre(patches.reshape(1, rows * cols, -1))
            position_ids = position_ids_in_meshgrid([patches], max_width=max_width)
            rope = vision.patch_positional_embedding(hidden, position_ids)
            mask = generate_block_attention_mask([rows * cols], hidden)
            for layer in vision.transformer.layers[: self._layers]:
                hidden = layer(hidden, mask=mask, position_embeddings=rope)
            size = [(rows * self.patch, cols * self.patch)]
            out.append(self.model.multi_modal_projector(hidden[0], size))
        return out


def _layers_used(count: int, feature_layer: Any) -> int:
    """Encoder layers to run for mlx-vlm's `hidden_states[vision_feature_layer]` (index 0 is
    the patch embedding, i the output of layer i). ValueError for a list of layers, which
    mlx-vlm 0.7.10's mistral3 does not take either."""
    if not isinstance(feature_layer, int) or not -(count + 1) <= feature_layer <= count:
        raise ValueError(f"unsupported vision_feature_layer {feature_layer!r}")
    return feature_layer % (count + 1)
