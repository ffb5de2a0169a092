"""Mistral 3 (`model_type` "mistral3": Mistral Small 3.1 / 3.2, Pixtral vision) over mlx-vlm.

Prompt side (any thread): the checkpoint's own chat template writes one `[IMG]` where each
image part stands; `layout_prompt` expands it into Pixtral's variable-resolution span: one
row of `[IMG]` per row of 2 x 2-merged patch cells, `[IMG_BREAK]` after each row but the
last, `[IMG_END]` after it. The cell grid comes from the image's size alone: mlx-vlm's Pixtral
image processor scales an image down (never up) until it fits `size.longest_edge`, then
rounds each side up to whole cells (`patch_size * spatial_merge_size` px), so the token count
follows the image's shape and those two settings (`processor_fingerprint` holds them, with
every other setting that changes pixels). `preprocess` is that processor itself: its pixels
are the reference's by construction.

Engine side (engine thread): the tower runs one unit per step (`pixtral_vision`); an image's
features hold one row per span token, break and end rows included (their token embeddings),
so a span is one piece for the caches. The language model is mlx-vlm's `Mistral`: 1D RoPE
from each layer's cache offset (spans are `ImageLayout.flat`, every rope delta is 0), full
attention in every layer (one trimmable `KVCache` each), so the prefix cache, its disk tier
and the vision cache are all on. Prefill feeds embeddings (text rows are the embedding
table's rows, image rows the features), padded to fixed rows as the exact-reuse rule asks.

Only the `mistral` text model is served: mlx-vlm's `ministral3` text model scales attention
by row 0's position for every row of a batch (so a batched answer would not be the answer
alone) and `mistral4` keeps a different (latent) KV; both are refused at load.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_vlm.models.pixtral.image_processing_pixtral import (
    _size_to_pair,
    get_resize_output_image_size,
)
from PIL import Image

from caches.hashing import fingerprint
from gateway.engine.families.family import Grid, ModelFamily, eos_ids, model_fingerprint
from gateway.engine.families.pixtral_vision import PixtralEncoder
from gateway.engine.model.kv import RowBatchKVCache, RowKVCache, share_row_state
from gateway.engine.model.positions import ImageLayout
from gateway.engine.model.prompt_forward import (
    GroupPart,
    PrefillPlan,
    join_caches,
    plan_inputs,
    split_caches,
)
from gateway.engine.model.video_layout import VideoLayout
from gateway.engine.model.video_processor import VideoFrames
from gateway.engine.model.vision import EncodedImage

MODEL_TYPES = ("mistral3",)
TEXT_MODEL_TYPES = ("mistral",)
# Image-processor settings that change the pixels or the cell grid (and so the token count).
_PROCESSOR_KEYS = (
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


class Mistral3Core(nn.Module):
    """mlx-vlm's Mistral language model as BatchGenerator sees it: `(B, L)` ids and per-layer
    caches in, logits out. Positions are each row's cache offset (mlx-vlm's own rope), so a
    row decodes exactly as in mlx-vlm's generate."""

    def __init__(self, language_model: nn.Module) -> None:
        super().__init__()
        self.lm = language_model

    @property
    def layers(self) -> list[nn.Module]:
        return self.lm.model.layers

    def make_cache(self) -> list[RowKVCache]:
        return [RowKVCache() for _ in self.layers]

    def __call__(self, inputs: mx.array, cache: list[Any] | None = None, **_: Any) -> mx.array:
        logits = self.lm(inputs, cache=cache).logits
        if cache and isinstance(cache[0], RowBatchKVCache):
            share_row_state(cache)  # equal values; cuts every layer's lazy offset chain
        return logits


class Mistral3(ModelFamily):
    """A loaded Mistral 3 checkpoint. Construct on the thread that will own MLX; `lazy`:
    weights unread (prompt side only)."""

    family = "mistral3"
    media = frozenset({"image"})

    def __init__(self, path: str, lazy: bool = False) -> None:
        from mlx_vlm import load  # slow import: only when a model is actually loaded

        self.path = path
        self.model, self.processor = load(path, lazy=lazy)
        config = self.model.config
        self.model_type = str(config.model_type)
        text_type = str(config.text_config.model_type)
        if self.model_type not in MODEL_TYPES or text_type not in TEXT_MODEL_TYPES:
            raise ValueError(
                f"not a supported Mistral 3 checkpoint: model type {self.model_type!r} with a "
                f"{text_type!r} text model (served: {', '.join(TEXT_MODEL_TYPES)})"
            )
        tokenizer = self.processor.tokenizer
        self.image_processor = self.processor.image_processor
        self.patch = int(config.vision_config.patch_size)
        self.merge = int(config.spatial_merge_size)
        if int(self.processor.patch_size) != self.patch:
            raise ValueError(
                f"processor patch size {self.processor.patch_size} != the tower's {self.patch}"
            )
        self.cell = self.patch * int(self.processor.spatial_merge_size)  # px per cell side
        self.image_id = int(config.image_token_index)
        self.break_id = int(self.processor.image_break_token_id)
        self.end_id = int(self.processor.image_end_token_id)
        self.vocab_size = int(config.text_config.vocab_size)
        self._init_tokens(tokenizer, eos_ids(tokenizer, config.eos_token_id, ("</s>",)))
        language = self.model.language_model
        self.text_core = Mistral3Core(language)
        self._embed = language.model.embed_tokens
        self._tied = bool(config.text_config.tie_word_embeddings)
        self.embed_dtype = self._embed(mx.array([0], dtype=mx.int32)).dtype
        self.vision = PixtralEncoder(self.model, self.break_id, self.end_id, self.embed_dtype)
        self.vision_dtype = self.vision.dtype
        self.fingerprint = model_fingerprint(path, self.model_type)
        ip = self.image_processor
        self.processor_fingerprint = fingerprint(
            *((k, _plain(getattr(ip, k, None))) for k in _PROCESSOR_KEYS),
            ("cell", self.cell),
            ("tokens", self.image_id, self.break_id, self.end_id),
        )

    # ----- prompt side (any thread) -----------------------------------------------------------

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The checkpoint's template, with a leading system message's text given as one text
        part: Mistral Small 3.1's template reads a first system message as
        `content[0]['text']` whatever its type (a plain string fails to render), and writes
        exactly that text."""
        if messages and messages[0]["role"] == "system":
            content = messages[0]["content"]
            if isinstance(content, str):
                first = {"role": "system", "content": [{"type": "text", "text": content}]}
                messages = [first, *messages[1:]]
        return super().render(messages)

    def image_grid(self, width: int, height: int) -> Grid:
        """(1, rows, cols) in tower patches of the processor's output for this size.
        ValueError for an image so elongated that one side would scale to nothing."""
        ip = self.image_processor
        h, w = height, width
        if ip.do_resize:
            edge = _edge(ip.size)
            scale = max(height / edge[0], width / edge[1])
            if scale > 1 and (int(height / scale) < 1 or int(width / scale) < 1):
                raise ValueError(f"one side would scale below 1 px at a {edge[0]} px edge")
            h, w = get_resize_output_image_size((height, width), edge, (self.cell, self.cell))
        if h < self.cell or w < self.cell:
            raise ValueError(f"a side under {self.cell} px makes no image tokens")
        return (1, h // self.patch, w // self.patch)

    def preprocess(self, image: Any) -> tuple[np.ndarray, Grid]:
        """PIL image -> ((3, H, W) float32 pixels, grid): mlx-vlm's Pixtral image processor
        called as the Mistral 3 processor calls it (cells of `patch * merge` px)."""
        if isinstance(image, VideoFrames) or not isinstance(image, Image.Image):
            raise ValueError(f"{self.model_type} takes images only")
        out = self.image_processor([image], patch_size=self.cell)
        h, w = (int(x) for x in out["image_sizes"][0])
        pixels = np.ascontiguousarray(np.asarray(out["pixel_values"])[0, :, :h, :w])
        return pixels, (1, h // self.patch, w // self.patch)

    def _no_video(self) -> ValueError:
        return ValueError(f"{self.model_type} takes no video")

    def video_grid(self, frames: int, width: int, height: int) -> Grid:
        raise self._no_video()

    def video_layout(self, grid: Grid, times: Sequence[float]) -> VideoLayout:
        raise self._no_video()

    def video_clip(
        self, frames: np.ndarray, times: Sequence[float], grid: Grid, block: int | None = None
    ) -> VideoFrames:
        raise self._no_video()

    def layout_prompt(
        self, ids: Sequence[int], grids: Sequence[Grid | VideoLayout]
    ) -> tuple[list[int], list[ImageLayout]]:
        """Each `[IMG]` the template wrote -> rows of `[IMG]` cells with `[IMG_BREAK]` between
        rows and `[IMG_END]` last; one flat span per image covering all of it."""
        placeholders = sum(1 for t in ids if t == self.image_id)
        if placeholders != len(grids) or any(isinstance(g, VideoLayout) for g in grids):
            raise ValueError(
                f"prompt has {placeholders} image placeholders for {len(grids)} images"
            )
        out: list[int] = []
        layouts: list[ImageLayout] = []
        items = iter(grids)
        for token in ids:
            if token != self.image_id:
                out.append(token)
                continue
            _, h, w = next(items)  # type: ignore[misc]
            rows, cols = h // self.merge, w // self.merge
            start = len(out)
            for row in range(rows):
                out.extend([self.image_id] * cols)
                out.append(self.break_id if row < rows - 1 else self.end_id)
            layouts.append(ImageLayout.flat(start, len(out) - start))
        return out, layouts

    # ----- engine side (engine thread only) ---------------------------------------------------

    def new_cache(self, rope_delta: int = 0) -> list[RowKVCache]:
        return [RowKVCache(rope_delta) for _ in self.text_core.layers]

    def encode_steps_many(
        self,
        images: Sequence[tuple[np.ndarray, Grid]],
        stepwise: Callable[[], bool] = lambda: True,
    ) -> Generator[None, None, list[EncodedImage]]:
        """The tower one unit per `next()` (`PixtralEncoder.steps_many`)."""
        return self.vision.steps_many(images, stepwise)

    def prefill_plan(
        self,
        prompt_ids: Sequence[int],
        layouts: Sequence[ImageLayout],
        encoded: Sequence[EncodedImage | None],
        start: int,
        end: int,
    ) -> PrefillPlan:
        """Embeddings of tokens [start, end) with each span's features in place (the span's
        break and end rows included) and their 1D positions (`start` .. `end - 1`)."""
        spans = (self.image_id, self.break_id, self.end_id)
        plan = plan_inputs(self._embed, spans, prompt_ids, layouts, encoded, start, end)
        host = np.arange(start, end, dtype=np.int32)[None]
        return replace(plan, positions=mx.array(host)[:, None, :], host_positions=host)

    def prefill(
        self, plan: PrefillPlan, cache: list[RowKVCache], lo: int, hi: int, rows: int = 0
    ) -> mx.array:
        """Plan rows [lo, hi), padded with zero embeddings to `rows` query rows after the real
        ones (causal attention keeps them out of every real row; their KV is trimmed)."""
        embeds = _padded(plan.embeds[:, lo:hi], rows)  # type: ignore[index]
        pad = embeds.shape[1] - (hi - lo)
        hidden = self.model.language_model.model(None, inputs_embeds=embeds, cache=cache)
        if pad:
            for layer in cache:
                layer.trim(pad)
        mx.eval([c.state for c in cache])
        return hidden

    def prefill_group(self, parts: Sequence[GroupPart], rows: int) -> mx.array:
        offset = parts[0].cache[0].offset
        assert all(p.cache[0].offset == offset for p in parts), "blocks at different positions"
        embeds = mx.concatenate(
            [_padded(p.plan.embeds[:, p.lo : p.hi], rows) for p in parts],  # type: ignore[index]
            axis=0,
        )
        joint = join_caches([p.cache for p in parts])
        hidden = self.model.language_model.model(None, inputs_embeds=embeds, cache=joint)
        mx.eval([c.state for c in joint])
        split_caches([p.cache for p in parts], [p.hi - p.lo for p in parts], joint)
        return hidden

    def logits(self, states: mx.array) -> mx.array:
        """As mlx-vlm's language model maps its final (normed) hidden states."""
        if self._tied:
            return self._embed.as_linear(states)
        return self.model.language_model.lm_head(states)


def _padded(embeds: mx.array, rows: int) -> mx.array:
    """(1, n, d) embeddings followed by zero rows up to `rows`."""
    pad = rows - embeds.shape[1]
    if pad <= 0:
        return embeds
    return mx.concatenate([embeds, mx.zeros((1, pad, embeds.shape[2]), embeds.dtype)], axis=1)


def _edge(size: Any) -> tuple[int, int]:
    """The processor's `size` as (max height, max width), as mlx-vlm's processor reads it."""
    return _size_to_pair(size)


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _plain(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_plain(v) for v in value)
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return repr(value)
