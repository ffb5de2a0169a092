"""The embedding-family interface the `EmbedEngine` calls: inputs -> token rows -> one pooled
vector per row, in batches.

A family runs the model mlx-vlm loads for the checkpoint with mlx-vlm's own pooling (so a
vector equals mlx-vlm's reference at tolerance zero), and adds what serving needs: inputs
prepared apart from the forward (`prepare`: tokens and image grids, no MLX work, any
thread), image features computed once per image (`encode_image`, cached by the engine by
pixel hash) and several rows in one right-padded forward (`pooled`). Right padding keeps each
row's sums in the same order as alone, which `tests/gateway/engine/embed` pins: a batched
vector is the vector alone.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import numpy as np

from gateway.engine.embed.request import EmbedCard, EmbedImage, EmbedItem, EmbedRefused


@dataclass(frozen=True)
class Prepared:
    """An input ready for the forward: its token ids (image placeholders expanded) and its
    images in prompt order with their (t, h, w) patch grids."""

    ids: tuple[int, ...]
    images: tuple[EmbedImage, ...] = ()
    grids: tuple[tuple[int, int, int], ...] = ()


@dataclass(frozen=True)
class ImageFeatures:
    """One image's tower output: `features` (one row per placeholder token) and the
    model's side outputs (`deepstack`: Qwen3-VL's per-layer features, or None); `nbytes`
    counts both against the vision cache's budget."""

    features: mx.array
    deepstack: tuple[mx.array, ...] | None
    grid: tuple[int, int, int]
    nbytes: int


class Embedder(ABC):
    """A loaded embedding checkpoint. Construct, `encode_image` and `pooled` on the engine
    thread (the one that owns MLX); `prepare` on any thread."""

    card: EmbedCard
    fingerprint: str  # the checkpoint's identity in cache keys
    processor_fingerprint: str = "-"  # pixel settings (vision cache keys); "-": no images

    @abstractmethod
    def prepare(self, item: EmbedItem) -> Prepared:
        """`item`'s token ids and images. Raises EmbedRefused (index unset) for an input the
        model cannot take: an image to a text model, an empty or over-long input."""

    def encode_image(self, image: EmbedImage, grid: tuple[int, int, int]) -> ImageFeatures:
        """`image` through the vision tower alone (engine thread)."""
        raise EmbedRefused("this model embeds text only; it takes no images")

    def image_tokens(self, grid: tuple[int, int, int]) -> int:
        """The placeholder tokens (feature rows) of an image with this patch grid."""
        raise EmbedRefused("this model embeds text only; it takes no images")

    @abstractmethod
    def pooled(self, rows: Sequence[Prepared], features: Sequence[ImageFeatures]) -> mx.array:
        """The rows' pooled vectors (rows, dimensions), before normalization, lazily:
        `features` holds the rows' images' features in row then prompt order."""

    def check_length(self, ids: Sequence[int]) -> None:
        """EmbedRefused for an empty input, or one over the model's `max_tokens`."""
        if not ids:
            raise EmbedRefused("the input is empty (it has no tokens)")
        if len(ids) > self.card.max_tokens:
            raise EmbedRefused(
                f"the input is {len(ids)} tokens, over this model's {self.card.max_tokens}"
            )


def padded(rows: Sequence[Prepared]) -> tuple[np.ndarray, np.ndarray]:
    """The rows' ids right-padded with 0 to the longest, and the attention mask (1 on real
    tokens), both (rows, longest) int32."""
    width = max(len(r.ids) for r in rows)
    ids = np.zeros((len(rows), width), dtype=np.int32)
    mask = np.zeros((len(rows), width), dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, : len(row.ids)] = row.ids
        mask[i, : len(row.ids)] = 1
    return ids, mask


def normalized(vectors: mx.array, dimensions: int | None, normalize: bool) -> mx.array:
    """The first `dimensions` of each vector (all when None), then unit length when
    `normalize`, with mlx-vlm's own `normalize_embeddings` (the reference's rounding)."""
    from mlx_vlm.models.pooling import normalize_embeddings

    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    return normalize_embeddings(vectors) if normalize else vectors


def as_numpy(vectors: mx.array) -> np.ndarray:
    """`vectors` as a float32 numpy array (evaluated)."""
    return np.array(vectors.astype(mx.float32))


# The longest input served, as mlx-vlm's server caps its embedding inputs: one forward over
# an input of n tokens holds an n x n attention mask per row (8192: 256 MiB in float32).
MAX_INPUT_TOKENS = 8192


def tokenizer_limit(tokenizer: Any, config_limit: int | None) -> int:
    """The longest input: the tokenizer's `model_max_length`, the config's position limit
    and `MAX_INPUT_TOKENS`, whichever is smallest (the first two may be absent or a huge
    sentinel)."""
    limits = [int(getattr(tokenizer, "model_max_length", 0) or 0), int(config_limit or 0)]
    return min([x for x in limits if 0 < x < 10**9] + [MAX_INPUT_TOKENS])
