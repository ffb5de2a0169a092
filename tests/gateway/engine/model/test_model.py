"""The mlx-vlm adapter: image grids without preprocessing, and the Qwen2.5-VL window fix.

Pinned: `image_grid` (no pixel work) equals the processor's grid for many sizes; the
Qwen2.5-VL tower sees no empty attention windows and its output is unchanged by the fix.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from support import noise_image, tiny_model

from gateway.engine.families.qwen_vl import QwenVL


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_image_grid_matches_the_processor(arch: str) -> None:
    """Invariant: the grid predicted from the size alone is the checkpoint processor's, also
    for thin images (a side under half a merge block rounds to 0 before the min-pixels rule)."""
    model = QwenVL(str(tiny_model(arch)))
    sizes = [(1, 1), (28, 28), (56, 84), (300, 17), (640, 480), (1000, 1000), (1000, 10)]
    for width, height in [*sizes, (400, 13), (3, 600)]:
        out = model.image_processor(images=[noise_image(0, width, height)], return_tensors="np")
        grid = tuple(int(x) for x in np.asarray(out["image_grid_thw"]).reshape(-1)[:3])
        assert model.image_grid(width, height) == grid, (width, height)


def test_qwen2_5_vl_windows_are_unique_and_output_unchanged() -> None:
    model = QwenVL(str(tiny_model("qwen2_5_vl")))
    tower = model.model.vision_tower
    pixels, grid = model.preprocess(noise_image(3, 448, 448))
    grid_arr = mx.array([grid], dtype=mx.int32)
    _, bounds = tower.get_window_index(grid_arr)
    values = bounds.tolist()
    assert values == sorted(set(values)), "repeated window boundaries make empty windows"
    fixed = model.encode_image(pixels, grid).features
    original = type(tower).get_window_index.__get__(tower)
    _, raw = original(grid_arr)
    assert len(raw.tolist()) > len(values)  # the unpatched boundaries do repeat
    object.__setattr__(tower, "get_window_index", original)
    unpatched = model.encode_image(pixels, grid).features
    assert np.allclose(np.array(fixed), np.array(unpatched), atol=1e-5)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_stepwise_encode_is_one_block_per_step_and_exact(arch: str) -> None:
    """Invariant: the tower runs a unit at a time (so decode can interleave): for an image
    this small, the patch embedding, each block, the merger; the features equal a plain call
    of mlx-vlm's tower."""
    model = QwenVL(str(tiny_model(arch)))
    pixels, grid = model.preprocess(noise_image(5, 112, 84))
    steps = model.encode_steps(pixels, grid)
    kinds = []
    while True:
        try:
            kinds.append(next(steps).kind)
        except StopIteration as done:
            encoded = done.value
            break
    blocks = len(model.model.vision_tower.blocks)
    assert kinds == ["embed", *["block"] * blocks, "merge"]  # too small to cut into pieces
    reference = model.model.vision_tower(
        mx.array(pixels).astype(model.vision_dtype), mx.array([grid]), output_hidden_states=False
    )
    if isinstance(reference, tuple):
        reference, deepstack = reference
        assert len(deepstack) == len(encoded.deepstack)
    assert np.array_equal(np.array(encoded.features), np.array(reference.astype(model.embed_dtype)))
