"""Every vision family's tower announces its units to the step budget.

The engine's per-step time budget (gateway.engine.scheduler.budget) sizes admission work from
the `Unit` each `next()` of a family's `encode_steps_many` yields before evaluating it; a
family that yielded nothing would have its whole tower run in one step while rows decode
(the freeze issue 30 removed). Pinned per family: the stepwise encode yields at least two
`Unit`s (the embedding, then blocks) and returns, bit for bit, the features of the whole
tower at once.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from PIL import Image
from support import tiny_model

from gateway.engine.families.registry import load_model
from gateway.engine.model.vision import Unit

ARCHS = ["qwen2_vl", "smolvlm", "gemma3", "gemma4", "mistral3", "lfm2_vl"]


def _image() -> Image.Image:
    pixels = np.random.default_rng(7).integers(0, 256, (96, 128, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


@pytest.mark.parametrize("arch", ARCHS)
def test_stepwise_tower_yields_units_and_the_whole_towers_features(arch: str) -> None:
    family = load_model(str(tiny_model(arch)))
    pixels, grid = family.preprocess(_image())
    steps = family.encode_steps(pixels, grid)
    units = []
    while True:
        try:
            units.append(next(steps))
        except StopIteration as done:
            stepwise = done.value
            break
    assert len(units) >= 2 and all(isinstance(u, Unit) for u in units), units
    assert units[0].kind == "embed"
    whole = family.encode_image(pixels, grid)
    assert mx.array_equal(stepwise.features, whole.features).item()
