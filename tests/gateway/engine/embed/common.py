"""Helpers of the embedding engine tests: inputs, and one embedder's vectors alone."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from PIL import Image

from caches.hashing import pixel_hash
from gateway.engine.embed.embedder import Embedder, as_numpy, normalized
from gateway.engine.embed.request import EmbedImage


def embed_image(image: Image.Image) -> EmbedImage:
    pixels = pixel_hash("RGB", image.width, image.height, image.tobytes())
    return EmbedImage(image, pixels, image.width, image.height)


def vectors(
    embedder: Embedder, items: Sequence[object], dimensions: int | None = None
) -> np.ndarray:
    """The items' vectors computed in one forward (features by one tower pass each)."""
    rows = [embedder.prepare(item) for item in items]  # type: ignore[arg-type]
    features = [
        embedder.encode_image(image, grid)
        for row in rows
        for image, grid in zip(row.images, row.grids, strict=True)
    ]
    pooled = embedder.pooled(rows, features)
    return as_numpy(normalized(pooled, dimensions, embedder.card.normalize))
