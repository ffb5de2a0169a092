"""LFM2-VL (`model_type` "lfm2_vl" / "lfm2-vl": Liquid AI's LFM2-VL 450M / 1.6B / 3B and
LFM2.5-VL) over mlx-vlm: the only module that knows LFM2-VL's tower and pixels; its prompt
side (views from the image's size, the span's tokens) is
`gateway.processors.lfm2_vl.Lfm2VlProcessor`, which this family builds and delegates to.

- Pixels: mlx-vlm's own NumPy LFM2-VL image processor (`preprocess`): each view (the tiles,
  row-major, then the thumbnail; or the one smart-resized view) packed into rows of
  `max_num_patches` flattened patches, zero-padded.
- Tower: SigLIP2 NaFlex (position embeddings resized to each view's patch grid, the padded
  patches masked out), pixel-unshuffled and projected, through mlx-vlm's own
  `encode_images`, all views of a group in one batch as mlx-vlm runs a prompt's; one unit
  per step (the patch embedding, then each encoder layer).
- Language model: LFM2 (1D RoPE from the cache offset), hybrid: short-convolution layers
  keep a fixed-size state (`lfm2_vl_forward.ConvStateCache`, a `RowStateCache`), attention
  layers ordinary KV (`RowKVCache`). Prompt forwards are the language model's own, unpadded,
  the last token apart as mlx-vlm's generate feeds it (`lfm2_vl_forward.prefill`).

Prefix reuse, exact: a convolution state cannot be cut back to a block boundary, so every
prompt forward marks the state where it ended and the prefix cache stores each block's
snapshot next to the attention layers' KV blocks, as for Qwen3.5 (`engine/model/snapshots.py`,
docs/caching.md). Off with `--no-exact-cache`.

Prompt side any thread, engine side engine thread only (see `ModelFamily`, `VlmFamily`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.families.family import Grid
from gateway.engine.families.lfm2_vl_forward import (
    ConvStateCache,
    Lfm2TextCore,
    prefill,
    prefill_each,
)
from gateway.engine.families.vlm_base import VlmFamily
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan
from gateway.processors.lfm2_vl import Lfm2VlProcessor, Lfm2VlSettings
from gateway.processors.processor import PromptProcessor

MODEL_TYPES = ("lfm2_vl", "lfm2-vl")
# The image processor's settings that change pixels or token counts (the cache key).
_SETTINGS = (
    "do_resize",
    "resample",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "do_pad",
    "max_num_patches",
    "downsample_factor",
    "encoder_patch_size",
    "min_image_tokens",
    "max_image_tokens",
    "tile_size",
    "max_pixels_tolerance",
    "do_image_splitting",
    "min_tiles",
    "max_tiles",
    "use_thumbnail",
)


class Lfm2VL(VlmFamily):
    """A loaded LFM2-VL checkpoint. Construct on the thread that will own MLX."""

    family = "lfm2_vl"
    MODEL_TYPES = MODEL_TYPES
    EOS_MARKERS = ("<|im_end|>",)
    prompt_split = True  # the prompt side is `Lfm2VlProcessor`
    state_snapshots = True
    last_token_apart = True
    kv_quant_off = "keeps convolution-state layers (a hybrid model)"
    prompt: Lfm2VlProcessor

    def __init__(self, path: str, lazy: bool = False) -> None:
        super().__init__(path, lazy=lazy)
        layers = self.text_core.layers
        self.text_core = Lfm2TextCore(self.language_model, layers)
        self._attention = tuple(bool(layer.is_attention_layer) for layer in layers)
        if self.image_processor is None:
            raise ValueError("an LFM2-VL checkpoint without its image processor")
        if int(self.image_processor.downsample_factor) != int(self.model.config.downsample_factor):
            raise ValueError("the image processor's downsample factor is not the model's")

    def own_prompt(self, tokenizer: Any, given: PromptProcessor | None) -> PromptProcessor:
        """An `Lfm2VlProcessor` over the settings of mlx-vlm's loaded processor (loaded by
        then: `_init_tokens` calls this)."""
        config, ip, proc = self.model.config, self.image_processor, self.processor
        settings = Lfm2VlSettings(
            image_token_id=int(config.image_token_index),
            image_token=str(proc.image_token),
            image_start_token=str(proc.image_start_token),
            image_end_token=str(proc.image_end_token),
            thumbnail_token=str(getattr(proc, "image_thumbnail_token", "<|img_thumbnail|>")),
            # mlx-vlm's processor call defaults it on whatever the config says.
            use_image_special_tokens=True,
            patch=int(ip.encoder_patch_size),
            factor=int(ip.downsample_factor),
            min_image_tokens=int(ip.min_image_tokens),
            max_image_tokens=int(ip.max_image_tokens),
            max_pixels_tolerance=float(ip.max_pixels_tolerance),
            do_image_splitting=bool(ip.do_image_splitting),
            tile_size=int(ip.tile_size),
            min_tiles=int(ip.min_tiles),
            max_tiles=int(ip.max_tiles),
            use_thumbnail=bool(ip.use_thumbnail),
        )
        own = Lfm2VlProcessor(self.path, self.model_type, tokenizer, settings)
        return given or own

    def _check_layers(self) -> None:
        """Convolution layers keep a state (served by `new_cache`), the others KV: nothing
        to refuse."""

    # ----- prompt side (any thread) -----------------------------------------------------------

    @property
    def image_token_id(self) -> int:
        return self.prompt.settings.image_token_id

    @property
    def placeholder_id(self) -> int:
        return self.prompt.settings.image_token_id  # the template writes one `<image>` each

    def processor_settings(self) -> dict[str, Any]:
        ip = self.image_processor
        settings = {k: getattr(ip, k, None) for k in _SETTINGS}
        settings["use_image_special_tokens"] = self.prompt.settings.use_image_special_tokens
        return settings

    def image_grid(self, width: int, height: int) -> Grid:
        return self.prompt.image_grid(width, height)

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL RGB image -> (its views' packed patches (views, max_num_patches, 3 * p * p)
        float32, grid), the checkpoint's own image processor's output; RuntimeError when its
        views are not the ones the grid promised the prompt."""
        out = self.image_processor.preprocess([image])
        grid = self.prompt.image_grid(*image.size)
        views = [tuple(int(x) for x in shape) for shape in np.asarray(out["spatial_shapes"])]
        if views != self.prompt.views(grid)[2]:
            raise RuntimeError(f"the image processor made views {views} for grid {grid}")
        pixels = np.asarray(out["pixel_values"], dtype=np.float32)
        return np.ascontiguousarray(pixels), grid

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[Any]:  # type: ignore[override]
        """Per layer: a `RowKVCache` for an attention layer, a `ConvStateCache` else."""
        return [
            self.kv_layer(rope_delta) if attention else ConvStateCache(rope_delta)
            for attention in self._attention
        ]

    def tower_units(self) -> list[nn.Module]:
        tower = self.model.vision_tower
        return [tower.embeddings, *tower.encoder.layers]

    def tower_features(self, images: Sequence[tuple[np.ndarray, Grid]]) -> list[mx.array]:
        """Every image's views through mlx-vlm's `encode_images` as one batch (each view
        attends to its own patches only), then each image's views' features in order."""
        shapes = [view for _, grid in images for view in self.prompt.views(grid)[2]]
        pixels = np.concatenate([p for p, _ in images])
        mask = np.zeros(pixels.shape[:2], dtype=np.int32)
        for row, (h, w) in enumerate(shapes):
            mask[row, : h * w] = 1
        features = self.model.encode_images(
            mx.array(pixels),
            spatial_shapes=mx.array(np.asarray(shapes, dtype=np.int32)),
            pixel_attention_mask=mx.array(mask),
        )
        out, first = [], 0
        for p, _ in images:
            views = features[first : first + p.shape[0]]
            out.append(views[0] if len(views) == 1 else mx.concatenate(views, axis=0))
            first += p.shape[0]
        return out

    def prefill(
        self, plan: PrefillPlan, cache: list[Any], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi) into `cache`, never padded (`lfm2_vl_forward.prefill`)."""
        return prefill(self.language_model, plan, cache, lo, hi)

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Each part alone (`lfm2_vl_forward.prefill_each`)."""
        return prefill_each(self.language_model, parts, rows)
