"""SmolVLM (Idefics3-style) over mlx-vlm: the only module that knows SmolVLM's tower and
pixels; its prompt side (tiling arithmetic, the span's tokens) is
`gateway.processors.smolvlm.SmolVLMProcessor`, which this family builds and delegates to.

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

from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from gateway.engine.families.family import Grid
from gateway.engine.families.vlm_base import VlmFamily
from gateway.processors.processor import PromptProcessor
from gateway.processors.smolvlm import SmolVLMProcessor, SmolVLMSettings

MODEL_TYPES = ("smolvlm",)
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
    prompt_split = True  # the prompt side is `SmolVLMProcessor` (string content as a part)
    prompt: SmolVLMProcessor

    def __init__(self, path: str, lazy: bool = False) -> None:
        super().__init__(path, lazy=lazy)
        config = self.model.config
        settings = self.prompt.settings
        self._image_id = settings.image_token_id
        self.tile = settings.tile
        self.patch = int(config.vision_config.patch_size)
        self.per_side = settings.per_side
        self.seq_len = settings.seq_len
        expected = self.per_side**2 // int(config.scale_factor) ** 2
        if self.seq_len != expected:
            # The processor would expand more or fewer tokens than the tower gives per tile.
            raise ValueError(
                f"processor image_seq_len {self.seq_len} != {expected} tokens per tile "
                f"({self.tile} px tiles, {self.patch} px patches, scale {config.scale_factor})"
            )

    def own_prompt(self, tokenizer: Any, given: PromptProcessor | None) -> PromptProcessor:
        """A `SmolVLMProcessor` over the settings resolved from mlx-vlm's config and processor
        (loaded by then: `_init_tokens` calls this)."""
        config, ip, proc = self.model.config, self.image_processor, self.processor
        tile = int(ip.max_image_size["longest_edge"])
        size = {} if ip.size is None else ip.size  # a dict or a SizeDict (unset keys: None)
        longest, height, width = (size.get(k) for k in ("longest_edge", "height", "width"))
        fixed = None if height is None or width is None else (int(height), int(width))
        settings = SmolVLMSettings(
            image_token_id=int(config.image_token_index),
            tile=tile,
            per_side=tile // int(config.vision_config.patch_size),
            seq_len=int(proc.image_seq_len),
            longest_edge=int(longest) if longest else None,
            fixed_size=fixed,
            do_resize=bool(ip.do_resize),
            do_image_splitting=bool(ip.do_image_splitting),
            fake_image_token=str(proc.fake_image_token),
            image_token=str(proc.image_token),
            global_image_token=str(proc.global_image_token),
        )
        own = SmolVLMProcessor(self.path, self.model_type, tokenizer, settings)
        return given or own

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

    def _tile_count(self, grid: Grid) -> int:
        rows, cols = self.prompt.rows_cols(grid)
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
