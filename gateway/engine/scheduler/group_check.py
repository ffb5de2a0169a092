"""Whether the vision tower may encode several images in one call on this device.

Grouping the images of several requests into one tower call is only allowed when it cannot
change an image's features: the caches promise that a cached answer equals the uncached one
bit for bit, and the image a cached turn encoded alone is encoded again, in another group,
by an uncached request. On CPU the tower's kernels give each image the same bits in any group
(tests/gateway/engine/model/test_vision_units.py); on an H200 (CUDA, bf16) they do not (a
1024 px image alone vs beside another differed by up to 0.16, measured 2026-12-01): the
matmuls see a different number of rows and pick other tilings. So the engine checks, once
at load, on the device it runs on, and groups only where the bits agree.

Engine thread only (it runs the tower).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import mlx.core as mx
import numpy as np
from PIL import Image

from gateway.engine.families.family import ModelFamily
from gateway.engine.model.vision import EncodedImage

log = logging.getLogger(__name__)

# Two small images of different shapes: cheap on any device, and a group whose row count
# differs from either image's alone.
_SIZES = ((112, 84), (84, 112))


def _encode(model: ModelFamily, group: Sequence[tuple[np.ndarray, object]]) -> list[EncodedImage]:
    steps = model.encode_steps_many(group, lambda: False)  # type: ignore[arg-type]
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def _same(a: EncodedImage, b: EncodedImage) -> bool:
    if not mx.array_equal(a.features, b.features).item():
        return False
    deep_a, deep_b = a.deepstack or (), b.deepstack or ()
    return len(deep_a) == len(deep_b) and all(
        mx.array_equal(x, y).item() for x, y in zip(deep_a, deep_b)
    )


def towers_group_exactly(model: ModelFamily) -> bool:
    """True when each of two images gets bit-identical features alone and in one group (and
    for a model without images, or whose family encodes each image alone, where the question
    does not arise)."""
    if "image" not in model.media or model.encodes_each_alone:
        return True
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)) for w, h in _SIZES]
    prepared = [model.preprocess(image) for image in images]
    alone = [_encode(model, [p])[0] for p in prepared]
    together = _encode(model, prepared)
    exact = all(_same(a, b) for a, b in zip(alone, together, strict=True))
    log.info(
        "vision tower: %s",
        "images of several requests share a call (bit-identical to alone on this device)"
        if exact
        else "one image per call (a group changes the features' bits on this device)",
    )
    return exact
