"""The image mirror between the HTTP process and the engine process (no MLX).

Pinned: over any sequence of requests the engine side restores every image the HTTP side left
out (the two LRUs never disagree), repeated images are left out, and the byte budget holds.
"""

from __future__ import annotations

import random

from PIL import Image

from gateway.engine.image_store import ImageStore
from gateway.engine.request import EngineRequest, ImageInput, SamplingParams
from gateway.processors.positions import ImageLayout


def _request(images: list[tuple[str, Image.Image]]) -> EngineRequest:
    inputs = tuple(
        ImageInput(h, ImageLayout(0, 1, 1, 1), (1, 2, 2), image=img) for h, img in images
    )
    return EngineRequest("r", (1, 2), inputs, SamplingParams(max_tokens=1), 0.0)


def test_the_engine_side_restores_every_left_out_image() -> None:
    """Invariant: whatever the HTTP side omits, the engine side has, for random sequences of
    repeated and new images of different sizes under a small budget (many evictions)."""
    rng = random.Random(3)
    sizes = [(rng.randint(1, 40), rng.randint(1, 40)) for _ in range(12)]
    pool = [(f"h{i}", Image.new("RGB", size)) for i, size in enumerate(sizes)]
    http, engine = ImageStore(keep_images=False, budget_bytes=6000), ImageStore(True, 6000)
    omitted = 0
    for _ in range(400):
        chosen = rng.sample(pool, rng.randint(1, 3))
        sent = http.outgoing(_request(chosen))
        omitted += sum(i.image is None for i in sent.images)
        received = engine.incoming(sent)
        assert [i.image for i in received.images] == [img for _, img in chosen]
    assert omitted > 50  # the test exercised the omit path
    assert engine._bytes <= 6000 and http._bytes == engine._bytes


def test_a_repeated_image_crosses_once() -> None:
    """Invariant: the second request with the same pixels carries no image."""
    http = ImageStore(keep_images=False)
    image = Image.new("RGB", (64, 64))
    first = http.outgoing(_request([("same", image)]))
    second = http.outgoing(_request([("same", image)]))
    assert first.images[0].image is image and second.images[0].image is None
