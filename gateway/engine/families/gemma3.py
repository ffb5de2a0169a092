"""Gemma 3 (`model_type` "gemma3") over mlx-vlm: the only module that knows its image
processing and vision merge. The language model's forward is in `gemma3_forward.py`; the
prompt side (markers, soft tokens) is `gateway.processors.gemma3.Gemma3Processor`, which this
family builds from what mlx-vlm loaded and delegates to.

What differs from the other families (checked against mlx-vlm 0.7.10):
- prompt: the checkpoint's template writes `<start_of_image>` where an image part is; the
  processor replaces each by `\\n\\n<start_of_image>` + `image_seq_length` x
  `<image_soft_token>` + `<end_of_image>\\n\\n` before tokenizing. `tokenize` writes the
  newlines and both markers, `layout_prompt` the soft tokens between them (special tokens
  split the text, so the ids are the processor's); the span is the soft tokens only;
- every image is resized to the tower's square (`size`), so the token count is fixed
  (`image_seq_length`, = the config's `mm_tokens_per_image`); pan-and-scan crops are refused
  at load (not supported yet);
- features: SigLIP tower -> 2D average pool -> RMS norm -> projection, then divided by
  `sqrt(config.hidden_size)` as mlx-vlm's merge does (its *top-level* `hidden_size`, 2048 by
  default, not the text model's width; the language model multiplies every input embedding by
  `sqrt(text hidden)` again); text tokens equal to `pad_token_id` embed to zeros;
- positions: 1D (rope offsets from the cache), local and global rope bases per layer, so
  spans are `ImageLayout.flat`; attention is causal everywhere (mlx-vlm applies no
  bidirectional image mask, unlike transformers);
- KV: 5 sliding-window layers per global one; each sliding layer keeps all of its KV in a
  `WindowKVCache` (trimmable, stored as blocks like any layer) and reads its window in
  mlx-vlm's ring order (`engine/model/window_kv.py`). The prompt's last token is fed alone,
  as mlx-vlm feeds it (`last_token_apart`).

Prompt side any thread, engine side engine thread only (see `ModelFamily`).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from caches.hashing import fingerprint
from gateway.engine.families.family import Grid, ModelFamily, eos_ids, model_fingerprint
from gateway.engine.families.gemma3_forward import (
    Gemma3Core,
    Gemma3Forward,
    encode_steps,
    prefill_each,
)
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import GroupPart, PrefillPlan
from gateway.engine.model.vision import EncodedImage, Unit
from gateway.engine.model.window_kv import layer_caches
from gateway.processors.gemma3 import Gemma3Processor, Gemma3Settings
from gateway.processors.positions import ImageLayout
from gateway.processors.video_processor import VideoFrames

MODEL_TYPES = ("gemma3",)
# Image-processor settings that change pixels or the token count (part of cache keys).
_PROCESSOR_KEYS = (
    "size",
    "resample",
    "do_resize",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "image_mean",
    "image_std",
    "do_convert_rgb",
    "do_pan_and_scan",
    "pan_and_scan_min_crop_size",
    "pan_and_scan_max_num_crops",
    "pan_and_scan_min_ratio_to_activate",
)


class Gemma3(ModelFamily):
    """A loaded Gemma 3 checkpoint. Construct on the thread that will own MLX."""

    family = "gemma3"
    media = frozenset({"image"})
    prompt_split = True  # the prompt side is `Gemma3Processor`
    last_token_apart = True
    kv_quant_off = "keeps sliding-window layers read in ring order by its own attention"

    def __init__(self, path: str, lazy: bool = False) -> None:
        from mlx_vlm import load  # slow import: only when a model is actually loaded

        self.path = path
        self.model, self.processor = load(path, lazy=lazy)
        config = self.model.config
        self.model_type: str = config.model_type
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"not a Gemma 3 checkpoint: model type {self.model_type!r}")
        tokenizer = self.processor.tokenizer
        self.image_processor = self.processor.image_processor
        if getattr(self.image_processor, "do_pan_and_scan", None):
            raise ValueError("Gemma 3 pan-and-scan crops are not supported yet: turn it off")
        self.tokens_per_image = int(self.processor.image_seq_length)
        if self.tokens_per_image != int(config.text_config.mm_tokens_per_image):
            raise ValueError(
                f"processor expands {self.tokens_per_image} image tokens, the model makes "
                f"{config.text_config.mm_tokens_per_image}"
            )
        side = int(round(self.tokens_per_image**0.5))
        self.grid: Grid = (1, side, self.tokens_per_image // side)
        self.image_token_id = int(config.image_token_index)
        self.vocab_size = int(config.text_config.vocab_size)
        markers = ("<end_of_turn>", "<eos>")
        self._init_tokens(
            tokenizer,
            eos_ids(tokenizer, config.eos_token_id, markers),
            Gemma3Processor(path, self.model_type, tokenizer, self._settings(tokenizer)),
        )
        text = config.text_config
        self.window = int(text.sliding_window)
        pattern = int(text.sliding_window_pattern)
        self.sliding = tuple((i + 1) % pattern != 0 for i in range(text.num_hidden_layers))
        self.forward = Gemma3Forward(self.model, pad_id=config.pad_token_id)
        self.text_core = Gemma3Core(self.model.language_model, self.new_cache)
        embed = self.model.language_model.model.embed_tokens
        self.embed_dtype = embed(mx.array([0], dtype=mx.int32)).dtype
        tower = self.model.vision_tower.vision_model
        self.vision_dtype = tower.embeddings.patch_embedding.weight.dtype
        self.fingerprint = model_fingerprint(path, self.model_type)
        self.processor_fingerprint = fingerprint(
            ("image_seq_length", self.tokens_per_image),
            *((k, repr(getattr(self.image_processor, k, None))) for k in _PROCESSOR_KEYS),
        )

    def _settings(self, tokenizer: Any) -> Gemma3Settings:
        """The prompt settings of this checkpoint."""
        return Gemma3Settings.read(tokenizer, self.image_token_id, self.grid)

    # ----- prompt side (any thread) -----------------------------------------------------------

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL RGB image -> ((1, 3, size, size) float32 pixels, grid): the checkpoint's own
        image processor (resize to the tower's square, rescale, normalize)."""
        if isinstance(image, VideoFrames):
            raise ValueError("Gemma 3 takes no video")
        out = self.image_processor(images=[image], return_tensors="np")
        return np.asarray(out["pixel_values"]), self.grid

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        """A `WindowKVCache` per sliding layer, a `RowKVCache` per global one."""
        return layer_caches(self.sliding, self.window, rope_delta)

    def encode_steps_many(
        self,
        images: Sequence[tuple[np.ndarray, Grid]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[Unit, None, list[EncodedImage]]:
        """The tower one unit (embedding, then each encoder layer) per `next()`; features
        as merged into the embeddings (`gemma3_forward.encode_steps`)."""
        return encode_steps(self.model, self.embed_dtype, images, stepwise)

    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        return self.forward.plan(prompt_ids, layouts, encoded, start, end)

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        return self.forward.prefill(plan, cache, lo, hi, rows)

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Each part fed alone (`prefill`): every part's last token is a one-row step at its
        own position, so one batched forward would not be each part's own computation."""
        return prefill_each(self.prefill, parts, rows)

    def logits(self, states: mx.array) -> mx.array:
        return self.model.language_model.lm_head(states)
