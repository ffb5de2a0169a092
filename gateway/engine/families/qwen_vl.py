"""The Qwen2-VL / Qwen2.5-VL / Qwen3-VL family over mlx-vlm: the only module that knows
mlx-vlm's Qwen-VL internals.

Prompt side (`image_grid`, `preprocess`, `layout_prompt`, video): tokenizer and numpy work, any
thread. Engine side (`encode_steps_many`, `prefill*`, `text_core`, `new_cache`): MLX work, engine
thread only. Images: `<|vision_start|><|image_pad|><|vision_end|>` with the pad expanded to
t*h*w merged patches; positions: mRoPE (`processors/positions.py`), carried into decode as a
per-row rope delta (`engine/model/kv.py`); KV: one full-attention cache per layer.

mlx-vlm is used for loading, the image processor, the vision tower and the language model; the
caching, positions and batching are ours (see docs/architecture.md: mlx-vlm's own vision/prefix
caches and batch generator do not handle Qwen-VL image reuse).
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, ClassVar

import mlx.core as mx
import numpy as np
from PIL import Image

from caches.hashing import fingerprint
from gateway.engine.families.family import ModelFamily, eos_ids, model_fingerprint
from gateway.engine.model.compiled_mrope import install_compiled_mrope
from gateway.engine.model.kv import RowKVCache
from gateway.engine.model.prompt_forward import (
    GroupPart,
    PrefillPlan,
    forward,
    forward_group,
    plan_inputs,
)
from gateway.engine.model.text_core import TextCore, logits_from_hidden
from gateway.engine.model.vision import EncodedImage, Unit, VisionEncoder
from gateway.processors.image_processor import fast_image_processor
from gateway.processors.positions import ImageLayout
from gateway.processors.qwen_vl import QwenVLProcessor, QwenVLSettings
from gateway.processors.video_processor import (
    VideoFrames,
    video_patches,
)

MODEL_TYPES = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl")
_PROCESSOR_KEYS = (
    "min_pixels",
    "max_pixels",
    "patch_size",
    "merge_size",
    "temporal_patch_size",
    "image_mean",
    "image_std",
    "do_resize",
    "do_rescale",
    "rescale_factor",
    "do_normalize",
    "do_convert_rgb",
    "size",
    "resample",
)


class QwenVL(ModelFamily):
    """A loaded Qwen-VL checkpoint. Construct on the thread that will own MLX."""

    family = "qwen_vl"
    media = frozenset({"image", "video"})
    prompt_split = True  # the prompt side is `QwenVLProcessor`
    MODEL_TYPES: ClassVar[tuple[str, ...]] = MODEL_TYPES  # a subclass serves its own

    def __init__(self, path: str, lazy: bool = False) -> None:
        """`lazy`: leave the weights unread (a prompt-side copy in a process that never runs
        the model: tokenizer, processor and config only cost memory)."""
        from mlx_vlm import load  # slow import: only when a model is actually loaded

        self.path = path
        self.model, self.processor = load(path, lazy=lazy)
        config = self.model.config
        self.model_type: str = config.model_type
        if self.model_type not in self.MODEL_TYPES:
            raise ValueError(f"not a {self.family} checkpoint: model type {self.model_type!r}")
        tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.image_processor = self.processor.image_processor
        self.merge_size: int = config.vision_config.spatial_merge_size
        self.image_token_id: int = int(config.image_token_id)
        self.video_token_id: int = int(config.video_token_id)
        self.vision_start_id: int = int(config.vision_start_token_id)
        self.vision_end_id: int = int(getattr(config, "vision_end_token_id", 0) or 0) or int(
            tokenizer.convert_tokens_to_ids("<|vision_end|>")
        )
        # Qwen2.5-VL: time-axis positions per second of video (None: time axis = patch index).
        self.tokens_per_second: float | None = (
            float(getattr(config.vision_config, "tokens_per_second", 2))
            if self.model_type == "qwen2_5_vl"
            else None
        )
        self.vocab_size: int = int(config.text_config.vocab_size)
        markers = ("<|im_end|>", "<|endoftext|>")
        self._init_tokens(
            tokenizer,
            eos_ids(tokenizer, getattr(config, "eos_token_id", None), markers),
            QwenVLProcessor(path, self.model_type, tokenizer, self._settings()),
        )
        self.text_core = TextCore(self.model.language_model)
        # Image blocks' mRoPE as one fused chain per layer (compiled_mrope.py): same values.
        # A lazy copy (the HTTP process's prompt side) never runs a forward: left alone.
        self.compiled_mrope = not lazy and install_compiled_mrope(self.model.language_model)
        # The dtype the embedding *produces* (image features are cast to it): for a quantized
        # checkpoint `embed_tokens.weight` is the packed uint32 array, and casting features to
        # that truncated them to integers (see docs/caching.md, "quantized checkpoints").
        embed = self.model.language_model.model.embed_tokens
        self.embed_dtype = embed(mx.array([0], dtype=mx.int32)).dtype
        self.vision = VisionEncoder(self.model.vision_tower, self.model_type, self.embed_dtype)
        self.vision_dtype = self.vision.dtype
        self.fingerprint = model_fingerprint(path, self.model_type)
        self.processor_fingerprint = fingerprint(
            *((k, _plain(getattr(self.image_processor, k, None))) for k in _PROCESSOR_KEYS)
        )

    # ----- prompt side (any thread) -----------------------------------------------------------

    def preprocess(self, image: Any) -> tuple[np.ndarray, tuple[int, int, int]]:
        """PIL RGB image -> (pixel_values, grid_thw in patches). Thread-safe.

        `gateway.processors.image_processor` gives the checkpoint processor's exact output,
        faster;
        the processor itself runs for configs it does not reproduce (logged once) and inputs
        other than RGB PIL images.
        """
        fast = fast_image_processor(self.image_processor)
        if isinstance(image, VideoFrames):
            if fast is None:
                raise ValueError("this model's image processor is not one the video path supports")
            return video_patches(fast, image)
        if fast is not None and isinstance(image, Image.Image) and image.mode == "RGB":
            return fast(image)
        out = self.image_processor(images=[image], return_tensors="np")
        pixels = np.asarray(out["pixel_values"])
        grid = tuple(int(x) for x in np.asarray(out["image_grid_thw"]).reshape(-1)[:3])
        return pixels, grid  # type: ignore[return-value]

    def _settings(self) -> QwenVLSettings:
        """The prompt settings of this checkpoint, from mlx-vlm's config and image processor
        (the fast processor's sizes where it reproduces the checkpoint's, else the
        processor's own attributes)."""
        config, ip = self.model.config, self.image_processor
        fast = fast_image_processor(ip)
        if fast is not None:
            spec = fast.spec
            patch, min_px, max_px = spec.patch_size, spec.min_pixels, spec.max_pixels
            factor = patch * spec.merge_size
        else:
            size = getattr(ip, "size", None) or {}
            min_px = getattr(ip, "min_pixels", None) or size.get("shortest_edge")
            max_px = getattr(ip, "max_pixels", None) or size.get("longest_edge")
            patch = int(ip.patch_size)
            factor = patch * int(ip.merge_size)
        return QwenVLSettings(
            image_token_id=self.image_token_id,
            video_token_id=self.video_token_id,
            vision_start_id=self.vision_start_id,
            vision_end_id=self.vision_end_id,
            merge_size=self.merge_size,
            patch_size=patch,
            resize_factor=factor,
            min_pixels=min_px,
            max_pixels=max_px,
            spec=None if fast is None else fast.spec,
            tokens_per_second=self.tokens_per_second,
            timestamps=config.model_type == "qwen3_vl",
        )

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        return [self.kv_layer(rope_delta) for _ in self.text_core.layers]

    def encode_steps_many(
        self,
        images: Sequence[tuple[np.ndarray, tuple[int, int, int]]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[Unit, None, list[EncodedImage]]:
        """Several images through the tower in one call, a unit at a time while `stepwise()`
        (see `VisionEncoder.steps_many`); returns each image's features."""
        return self.vision.steps_many(images, stepwise)

    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """Inputs for prefilling prompt tokens [start, end) (`prompt_forward.plan_inputs`)."""
        embed = self.model.language_model.model.embed_tokens
        visual = (self.image_token_id, self.video_token_id)
        return plan_inputs(embed, visual, prompt_ids, layouts, encoded, start, end)

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Feed plan tokens [lo, hi) into `cache`, padded to `rows` query rows
        (`prompt_forward.forward`); the hidden states, lazily."""
        lm, fast = self.model.language_model.model, self.text_core.fast_rope
        return forward(lm, plan, cache, lo, hi, rows, fast_text=fast)

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        """Several requests' ranges at the same positions in one forward
        (`prompt_forward.forward_group`); the hidden states (len(parts), rows, hidden)."""
        lm, fast = self.model.language_model.model, self.text_core.fast_rope
        return forward_group(lm, parts, rows, fast_text=fast)

    def logits(self, states: mx.array) -> mx.array:
        """Logits of the language model's final hidden states (`prefill` returns those)."""
        return logits_from_hidden(self.model.language_model, states)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)
