"""Mistral 3 (`model_type` "mistral3": Mistral Small 3.1 / 3.2, Pixtral vision) over mlx-vlm:
the only module that knows Pixtral's tower and pixels.

Prompt side (any thread): `gateway.processors.mistral3.Mistral3Processor`, built from what
mlx-vlm loaded; this family delegates to it. Each `[IMG]` the template writes expands into
Pixtral's variable-resolution span (`[IMG]` rows, `[IMG_BREAK]` between, `[IMG_END]` last),
whose cell grid follows the image's shape and the processor's settings
(`processor_settings`, the cache key, holds them with every setting that changes pixels).
`preprocess` is mlx-vlm's Pixtral image processor itself, called as mlx-vlm's Mistral 3
processor calls it: its pixels are the reference's by construction.

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
from mlx_vlm.models.pixtral.image_processing_pixtral import _size_to_pair
from mlx_vlm.models.pixtral.vision import (
    generate_block_attention_mask,
    position_ids_in_meshgrid,
)
from PIL import Image

from gateway.engine.families.family import Grid
from gateway.engine.families.vlm_base import VlmFamily
from gateway.processors.mistral3 import Mistral3Processor, Mistral3Settings
from gateway.processors.processor import PromptProcessor

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
    prompt_split = True  # the prompt side is `Mistral3Processor`
    prompt: Mistral3Processor

    def __init__(self, path: str, lazy: bool = False) -> None:
        super().__init__(path, lazy=lazy)
        config = self.model.config
        text_type = str(config.text_config.model_type)
        if text_type not in TEXT_MODEL_TYPES:
            raise ValueError(
                f"{self.model_type} with a {text_type!r} text model is not served "
                f"(served: {', '.join(TEXT_MODEL_TYPES)})"
            )
        settings = self.prompt.settings
        self.patch, self.merge, self.cell = settings.patch, settings.merge, settings.cell
        if int(self.processor.patch_size) != self.patch:
            raise ValueError(
                f"processor patch size {self.processor.patch_size} != the tower's {self.patch}"
            )
        self._image_id = settings.image_token_id
        self.break_id, self.end_id = settings.break_id, settings.end_id
        vision = self.model.vision_tower.vision_model
        self._layers = _layers_used(len(vision.transformer.layers), config.vision_feature_layer)
        self.max_side = settings.max_side

    def own_prompt(self, tokenizer: Any, given: PromptProcessor | None) -> PromptProcessor:
        """A `Mistral3Processor` over the settings resolved from mlx-vlm's config and processor
        (loaded by then: `_init_tokens` calls this)."""
        config, proc, ip = self.model.config, self.processor, self.image_processor
        patch = int(config.vision_config.patch_size)
        settings = Mistral3Settings(
            image_token_id=int(config.image_token_index),
            break_id=int(proc.image_break_token_id),
            end_id=int(proc.image_end_token_id),
            patch=patch,
            merge=int(config.spatial_merge_size),
            cell=patch * int(proc.spatial_merge_size),  # px per cell side
            edge=_size_to_pair(ip.size) if ip.do_resize else None,
            # The tower's 2D RoPE table covers this many patches per side (`image_size`); a
            # processor set to a longer edge (or not resizing) would index past it.
            max_side=int(config.vision_config.image_size) // patch,
        )
        own = Mistral3Processor(self.path, self.model_type, tokenizer, settings)
        return given or own

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

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL image -> ((3, H, W) float32 pixels, grid): mlx-vlm's Pixtral image processor
        called as its Mistral 3 processor calls it (cells of `patch * merge` px)."""
        if not isinstance(image, Image.Image):
            raise ValueError(f"{self.model_type} takes images only")
        out = self.image_processor([image], patch_size=self.cell)
        h, w = (int(x) for x in out["image_sizes"][0])
        pixels = np.ascontiguousarray(np.asarray(out["pixel_values"])[0, :, :h, :w])
        return pixels, (1, h // self.patch, w // self.patch)

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
