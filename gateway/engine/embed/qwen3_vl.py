"""Qwen3-VL-Embedding (`model_type: qwen3_vl_embedding`): Qwen3-VL's tower and language model,
the last real token's final hidden state as the vector, normalized (config `normalize`).

The model is the one mlx-vlm's `load_embedding_model` builds; the forward is its
`Model._last_hidden_state` with two serving changes that leave every real row's numbers
as they are: each image's features come from the tower run on that image alone (so the
engine can cache them by pixel hash: a repeated image costs no tower pass), and several
inputs share one right-padded forward (causal and key masks: a real row never sees a pad,
and a pad row, whose output is dropped, sees real keys only, so no row is all-masked).
Inputs are laid out as mlx-vlm's server does: a string tokenized as is; content with
images rendered by the chat template as one user turn, generation prompt opened, each
`<|image_pad|>` expanded to the image's merged patches (`processors/qwen_vl.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np

from caches.hashing import fingerprint
from gateway.engine.embed.embedder import (
    Embedder,
    ImageFeatures,
    Prepared,
    padded,
    tokenizer_limit,
)
from gateway.engine.embed.request import EmbedCard, EmbedImage, EmbedItem, EmbedRefused
from gateway.engine.families.family import model_fingerprint
from gateway.processors.image_processor import fast_image_processor
from gateway.processors.qwen_vl import QwenVLProcessor, QwenVLSettings

MODEL_TYPES = ("qwen3_vl_embedding",)


class QwenVLEmbedder(Embedder):
    """A loaded Qwen3-VL-Embedding checkpoint (engine thread; `prepare` any thread)."""

    MODEL_TYPES: tuple[str, ...] = MODEL_TYPES  # a subclass serves its own

    def __init__(self, path: str) -> None:
        self.model, self.processor = self._load(path)
        config = self.model.config
        model_type = str(config.model_type)
        if model_type not in self.MODEL_TYPES:
            raise ValueError(f"not a {self.MODEL_TYPES[0]} checkpoint: model type {model_type!r}")
        self.tokenizer = getattr(self.processor, "tokenizer", self.processor)
        self.image_processor = self.processor.image_processor
        self.image_token_id = int(config.image_token_id)
        self.video_token_id = int(config.video_token_id)
        self.prompt = QwenVLProcessor(path, model_type, self.tokenizer, self._settings())
        text = config.text_config
        self.card = EmbedCard(
            family="qwen3_vl_embedding",
            model_type=model_type,
            media=frozenset({"image"}),
            dimensions=int(text.hidden_size),
            max_tokens=tokenizer_limit(
                self.tokenizer, getattr(text, "max_position_embeddings", None)
            ),
            matryoshka=True,  # Qwen3-VL-Embedding is trained for prefixes (its model card)
            normalize=bool(getattr(config, "normalize", True)),
        )
        self.fingerprint = model_fingerprint(path, model_type)
        ip = self.image_processor
        keys = ("min_pixels", "max_pixels", "patch_size", "merge_size", "image_mean", "image_std")
        self.processor_fingerprint = fingerprint(*((k, repr(getattr(ip, k, None))) for k in keys))

    @staticmethod
    def _load(path: str) -> tuple[Any, Any]:
        """(model, processor) as mlx-vlm's server loads an embedding model."""
        from mlx_vlm.embedding_loader import load_embedding_model
        from mlx_vlm.utils import load_processor

        folder = Path(path)
        return load_embedding_model(folder), load_processor(folder, add_detokenizer=False)

    def _settings(self) -> QwenVLSettings:
        config, ip = self.model.config, self.image_processor
        fast = fast_image_processor(ip)
        if fast is None:
            raise ValueError("this checkpoint's image processor is not one the gateway reproduces")
        spec = fast.spec
        start = int(config.vision_start_token_id)
        end = int(getattr(config, "vision_end_token_id", 0) or 0) or int(
            self.tokenizer.convert_tokens_to_ids("<|vision_end|>")
        )
        return QwenVLSettings(
            image_token_id=self.image_token_id,
            video_token_id=self.video_token_id,
            vision_start_id=start,
            vision_end_id=end,
            merge_size=int(config.vision_config.spatial_merge_size),
            patch_size=spec.patch_size,
            resize_factor=spec.patch_size * spec.merge_size,
            min_pixels=spec.min_pixels,
            max_pixels=spec.max_pixels,
            spec=spec,
            tokens_per_second=None,
            timestamps=True,
        )

    # ----- any thread ---------------------------------------------------------------------------

    def prepare(self, item: EmbedItem) -> Prepared:
        if item.pair is not None:
            raise EmbedRefused("this model embeds; it does not rerank (a pair)")
        if item.ids is not None:
            ids = list(item.ids)
            vocab = int(self.model.config.text_config.vocab_size)
            visual = (self.image_token_id, self.video_token_id)
            if any(not 0 <= i < vocab or i in visual for i in ids):
                raise EmbedRefused(
                    f"a token id is outside this model's vocabulary (0..{vocab - 1}) or is an "
                    "image placeholder (send images as image parts)"
                )
            self.check_length(ids)
            return Prepared(tuple(ids))
        if item.text is not None:
            ids = list(self.tokenizer(item.text)["input_ids"])
            if self.image_token_id in ids or self.video_token_id in ids:
                # Text spelling a placeholder token would be laid over by another input's
                # image features in a shared forward: refused as the ids form is.
                raise EmbedRefused(
                    "the text holds an image placeholder token (send images as image parts)"
                )
            self.check_length(ids)
            return Prepared(tuple(ids))
        content: list[dict[str, Any]] = [
            {"type": "text", "text": p} if isinstance(p, str) else {"type": "image"}
            for p in item.parts or ()
        ]
        return self._prepared([{"role": "user", "content": content}], item.images)

    def _prepared(
        self, messages: list[dict[str, Any]], images: tuple[EmbedImage, ...]
    ) -> Prepared:
        """`messages` through the chat template, each image's placeholder run laid out at
        its grid; EmbedRefused for what the template or the context refuses."""
        try:
            text = self.prompt.render(messages)
            grids = [self.prompt.image_grid(i.width, i.height) for i in images]
            ids, _ = self.prompt.layout_prompt(self.prompt.tokenize(text), grids)
        except ValueError as exc:
            raise EmbedRefused(str(exc)) from None
        self.check_length(ids)
        return Prepared(tuple(ids), images, tuple(grids))

    def pixels(self, image: EmbedImage) -> np.ndarray:
        """The image's pixel values, as the checkpoint's processor makes them (any thread)."""
        fast = fast_image_processor(self.image_processor)
        assert fast is not None  # checked at load (`_settings`)
        return fast(image.image)[0]

    def image_tokens(self, grid: tuple[int, int, int]) -> int:
        merge = self.prompt.merge_size
        return grid[0] * grid[1] * grid[2] // (merge * merge)

    # ----- engine thread ------------------------------------------------------------------------

    def encode_image(self, image: EmbedImage, grid: tuple[int, int, int]) -> ImageFeatures:
        tower = self.model.vision_tower
        dtype = tower.patch_embed.proj.weight.dtype
        pixels = mx.array(self.pixels(image)).astype(dtype)
        features, deepstack = tower(pixels, mx.array([grid]))
        layers = tuple(deepstack) if deepstack is not None else None
        mx.eval(features, *(layers or ()))
        nbytes = features.nbytes + sum(d.nbytes for d in layers or ())
        return ImageFeatures(features, layers, grid, nbytes)

    def pooled(self, rows: Sequence[Prepared], features: Sequence[ImageFeatures]) -> mx.array:
        from mlx_vlm.models.qwen3_vl_embedding.qwen3_vl_embedding import last_non_padding_token

        hidden, attention = self.hidden(rows, features)
        return last_non_padding_token(hidden, attention)

    def hidden(
        self, rows: Sequence[Prepared], features: Sequence[ImageFeatures], causal: bool = False
    ) -> tuple[mx.array, mx.array]:
        """The rows' final hidden states, right-padded, and their attention mask (rows,
        longest). `causal`: with no padding, mask by "causal" as mlx-vlm's reranker does
        (else, and by default, the causal-and-key mask its embedding model builds)."""
        from mlx_vlm.models.cache import create_causal_mask
        from mlx_vlm.models.qwen3_vl.qwen3_vl import masked_scatter

        ids, mask = padded(rows)
        input_ids, attention = mx.array(ids), mx.array(mask)
        lm = self.model.language_model
        embeds = lm.model.embed_tokens(input_ids)
        visual_masks = deepstack = grid_thw = None
        if features:
            image_mask = input_ids == self.image_token_id
            merged = mx.concatenate([f.features for f in features], axis=0)
            embeds = masked_scatter(
                embeds, mx.broadcast_to(image_mask[..., None], embeds.shape), merged
            )
            if features[0].deepstack is not None:
                layers = len(features[0].deepstack)
                deepstack = [
                    mx.concatenate([f.deepstack[k] for f in features], axis=0)  # type: ignore[index]
                    for k in range(layers)
                ]
            visual_masks = image_mask | (input_ids == self.video_token_id)
            grid_thw = mx.array([g for row in rows for g in row.grids])
        width = ids.shape[1]
        keys = attention.astype(mx.bool_)
        model_mask: Any = create_causal_mask(width)[None, None, :, :] & mx.expand_dims(keys, (1, 2))
        if causal and bool(mask.all()):
            model_mask = "causal"
        positions, _ = lm.get_rope_index(
            input_ids, image_grid_thw=grid_thw, attention_mask=attention
        )
        hidden = lm.model(
            input_ids,
            inputs_embeds=embeds,
            mask=model_mask,
            cache=None,
            position_ids=positions,
            visual_pos_masks=visual_masks,
            deepstack_visual_embeds=deepstack,
        )
        return hidden, attention
