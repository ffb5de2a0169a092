"""The vision tower run a unit at a time (gateway.engine.model.vision), tiny models, CPU.

Pinned, bit for bit (tolerance zero), for all three architectures: an image's features are
the same evaluated unit by unit (as while rows decode) and as one graph (idle), alone and in a
group with other images; the CPU pieces (attention query rows, patch-embedding rows) equal the
uncut tower; the unit protocol announces each unit before evaluating it (embedding pieces,
attention pieces, blocks, merger).
"""

from __future__ import annotations

from collections.abc import Generator
from functools import cache

import mlx.core as mx
import numpy as np
import pytest
from support import tiny_model

from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.vision import EncodedImage, Unit

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
# (t, h, w) patch grids: 224x224, 112x168 and 56x56 pixels.
GRIDS = [(1, 16, 16), (1, 8, 12), (1, 4, 4)]


@cache
def model(arch: str) -> QwenVL:
    return QwenVL(str(tiny_model(arch)))


def pixels(m: QwenVL, grid: tuple[int, int, int], seed: int) -> np.ndarray:
    embed = m.vision.tower.patch_embed
    channels = 3 * embed.temporal_patch_size * embed.patch_size**2
    rows = grid[0] * grid[1] * grid[2]
    return np.random.default_rng(seed).standard_normal((rows, channels)).astype(np.float32)


def drain(
    steps: Generator[Unit, None, list[EncodedImage]],
) -> tuple[list[Unit], list[EncodedImage]]:
    units = []
    while True:
        try:
            units.append(next(steps))
        except StopIteration as done:
            return units, done.value


def same(a: EncodedImage, b: EncodedImage) -> bool:
    pairs = [(a.features, b.features), *zip(a.deepstack or (), b.deepstack or (), strict=True)]
    return all(mx.array_equal(x, y).item() for x, y in pairs)


@pytest.mark.parametrize("arch", ARCHS)
def test_features_do_not_depend_on_schedule_or_group(arch: str) -> None:
    """Invariant: unit by unit == one graph, and alone == in a group (either position)."""
    m = model(arch)
    images = [(pixels(m, g, k), g) for k, g in enumerate(GRIDS)]
    _, [alone] = drain(m.encode_steps_many(images[:1], lambda: False))
    units, [stepped] = drain(m.encode_steps_many(images[:1], lambda: True))
    assert units and same(alone, stepped)
    _, grouped = drain(m.encode_steps_many(images, lambda: True))
    _, reordered = drain(m.encode_steps_many(images[::-1], lambda: False))
    for k, image in enumerate(images):
        _, [single] = drain(m.encode_steps_many([image], lambda: True))
        assert same(single, grouped[k])
        assert same(single, reordered[len(images) - 1 - k])
    assert same(alone, grouped[0])


@pytest.mark.parametrize("arch", ARCHS)
def test_pieces_equal_the_uncut_tower(arch: str) -> None:
    """Invariant: cutting the vision attention into pieces of query rows and the patch
    embedding into pieces of rows (CPU) changes no bit of the features, however fine."""
    m = model(arch)
    image = [(pixels(m, GRIDS[0], 5), GRIDS[0])]
    enc = m.vision
    saved = enc.pieces.work, enc.embed_rows
    try:
        enc.pieces.work, enc.embed_rows = None, None
        uncut_units, [uncut] = drain(m.encode_steps_many(image))
        enc.pieces.work, enc.embed_rows = 1, 48  # the finest attention cut (MIN_PIECE_ROWS)
        cut_units, [cut] = drain(m.encode_steps_many(image))
    finally:
        enc.pieces.work, enc.embed_rows = saved
    assert [u.kind for u in uncut_units].count("embed") == 1
    assert not any(u.kind == "attn" for u in uncut_units)
    assert [u.kind for u in cut_units].count("embed") == 6  # 256 rows in pieces of 48
    assert sum(u.kind == "attn" for u in cut_units) >= 2 * len(enc.tower.blocks)
    assert same(uncut, cut)


def test_units_are_announced_in_order_and_evaluated_on_the_next_call() -> None:
    """Invariant: the first `next()` yields the first patch-embedding unit; then per block
    its attention pieces and the block; the merger last. A unit's key is the same for the same
    image size (the cost model's key)."""
    m = model("qwen2_vl")
    grid = (1, 32, 32)  # 448x448: 1024 patches, cut into pieces on CPU
    image = [(pixels(m, grid, 9), grid)]
    units, _ = drain(m.encode_steps_many(image))
    kinds = [u.kind for u in units]
    blocks = len(m.vision.tower.blocks)
    embeds = kinds.count("embed")
    assert embeds >= 2 and kinds[:embeds] == ["embed"] * embeds  # EMBED_PIECE_WORK on CPU
    assert kinds[-1] == "merge"
    assert kinds.count("block") == blocks
    pieces = kinds.count("attn") // blocks
    assert pieces >= 2  # ATTENTION_PIECE_WORK on CPU
    assert kinds[embeds : embeds + pieces + 1] == ["attn"] * pieces + ["block"]
    assert all(u.patches == 1024 for u in units)
    again, _ = drain(m.encode_steps_many(image))
    assert again == units
