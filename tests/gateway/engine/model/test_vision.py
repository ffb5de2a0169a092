"""Batched segment attention in the vision tower (gateway.engine.model.window_attention).

Pinned: the patched attention and the patched tower compute what mlx-vlm's per-window loop
computes (float32, up to rounding) for square, non-square and ragged-window grids and for two
images in one call; the plan reorders rows into whole equal-length segments and back; the
patch leaves parameter names and weights alone and can be undone.
"""

from __future__ import annotations

from functools import cache

import mlx.core as mx
import mlx.nn as nn
import numpy as np
import pytest
from mlx.utils import tree_flatten, tree_unflatten
from support import tiny_model

from docs.investigations.vision_tower import time_tower
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.window_attention import (
    SegmentPlan,
    batch_segment_attention,
    restore_per_segment_attention,
)

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
# (t, h, w) patch grids. With 14px patches: 56x84, 112x112, 140x196 and 280x420 pixels.
# Qwen2.5-VL windows are 4x4 merged units, so 10x14 and 20x30 give 4 window lengths each
# (full, short column, short row, corner) and 8x8 gives mlx-vlm's empty padding windows.
GRIDS = [(1, 4, 6), (1, 8, 8), (1, 10, 14), (1, 20, 30)]
REL_TOL = 1e-4


def amplify_attention(tower: nn.Module) -> None:
    """Give every attention layer large deterministic random weights (the same for every
    tower of one arch). The tiny checkpoints' attention barely moves the features (mixing
    the wrong rows changes them by ~3e-4 of their scale); this makes it dominate, so a
    wrong window shows up far above REL_TOL."""
    rng = np.random.default_rng(7)
    new = []
    for name, value in tree_flatten(tower.parameters()):
        if ".attn." in name and name.endswith("weight"):
            scale = 2.0 / np.sqrt(value.shape[-1])
            new.append((name, mx.array(rng.standard_normal(value.shape) * scale, value.dtype)))
    tower.update(tree_unflatten(new))


@cache
def towers(arch: str) -> tuple[nn.Module, nn.Module]:
    """(the gateway's patched tower, mlx-vlm's own tower) with identical weights."""
    from mlx_vlm import load

    path = str(tiny_model(arch))
    patched = QwenVL(path).model.vision_tower
    reference = load(path)[0].vision_tower
    for tower in (patched, reference):
        amplify_attention(tower)
    return patched, reference


def noise_pixels(tower: nn.Module, grids: list[tuple[int, int, int]], seed: int) -> np.ndarray:
    """Random patch rows, as the image processor would lay them out for `grids`."""
    channels = 3 * tower.patch_embed.temporal_patch_size * tower.patch_embed.patch_size**2
    rows = sum(t * h * w for t, h, w in grids)
    return np.random.default_rng(seed).standard_normal((rows, channels))


def run(
    tower: nn.Module, grids: list[tuple[int, int, int]], pixels: np.ndarray | None = None
) -> list[np.ndarray]:
    """Features (then Qwen3-VL's deepstack features) for `pixels` (default: noise) on `grids`."""
    pixels = noise_pixels(tower, grids, 0) if pixels is None else pixels
    out = tower(mx.array(pixels, mx.float32), mx.array(grids, mx.int32))
    parts = [out[0], *out[1]] if isinstance(out, tuple) else [out]
    return [np.array(p) for p in parts]


def assert_close(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    """Each array within REL_TOL of the reference's largest value; returns the worst diff."""
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        assert g.shape == w.shape
        diff = float(np.abs(g - w).max())
        assert diff <= REL_TOL * float(np.abs(w).max()), (diff, float(np.abs(w).max()))
        worst = max(worst, diff)
    return worst


def test_plan_groups_whole_segments_and_inverts() -> None:
    """Invariant: after `order`, each group is `count` whole input segments of `length` rows
    (empty segments dropped, longest first), and `inverse` restores the original order."""
    bounds = [0, 16, 16, 28, 44, 48, 60, 76]  # lengths 16, 0, 12, 16, 4, 12, 16
    plan = SegmentPlan.from_bounds(bounds)
    assert plan.groups == ((0, 3, 16), (48, 2, 12), (72, 1, 4))
    order = np.array(plan.order)
    segments = {tuple(range(a, b)) for a, b in zip(bounds, bounds[1:]) if b > a}
    got = set()
    for first, count, length in plan.groups:
        rows = order[first : first + count * length].reshape(count, length)
        got |= {tuple(r) for r in rows.tolist()}
    assert got == segments
    assert np.array_equal(order[np.array(plan.inverse)], np.arange(76))
    one = SegmentPlan.from_bounds([0, 40])
    assert one.groups == ((0, 1, 40),) and one.order is None
    with pytest.raises(ValueError):
        SegmentPlan.from_bounds([0, 8, 4])


@pytest.mark.parametrize("arch", ARCHS)
def test_attention_layer_matches_per_segment_loop(arch: str) -> None:
    """Invariant: one patched attention layer equals mlx-vlm's per-segment __call__ on the
    same module for ragged, interleaved and empty segments (no row attends across one)."""
    attn = towers(arch)[0].blocks[0].attn
    original = type(attn)._per_segment_base.__call__
    rows, dim = 76, attn.qkv.weight.shape[1]
    rng = np.random.default_rng(1)
    x = mx.array(rng.standard_normal((rows, dim)), mx.float32)
    freqs = mx.array(rng.standard_normal((rows, attn.head_dim // 2)), mx.float32)
    for bounds in ([0, 16, 16, 28, 44, 48, 60, 76], [0, 76], [0, 30, 76]):
        cu = mx.array(bounds, mx.int32)
        want = np.array(original(attn, x, cu, freqs))
        assert_close([np.array(attn(x, cu, freqs))], [want])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("grid", GRIDS)
def test_tower_matches_unpatched_mlx_vlm(arch: str, grid: tuple[int, int, int]) -> None:
    """Invariant: the patched tower's features equal mlx-vlm's unpatched tower's, square,
    non-square and ragged-window grids alike (max |diff| <= 1e-4 x feature scale)."""
    patched, reference = towers(arch)
    assert_close(run(patched, [grid]), run(reference, [grid]))


@pytest.mark.parametrize("arch", ARCHS)
def test_two_images_in_one_call_stay_separate(arch: str) -> None:
    """Invariant: two images of different sizes in one call give mlx-vlm's features, and
    each image's features equal those of that image encoded alone (no cross-image rows)."""
    patched, reference = towers(arch)
    grids = [(1, 10, 14), (1, 8, 8)]
    pixels = noise_pixels(patched, grids, seed=3)
    both = run(patched, grids, pixels)
    assert_close(both, run(reference, grids, pixels))
    first_rows = grids[0][1] * grids[0][2]
    first_tokens = first_rows // 4  # spatial_merge_size**2 patches per output token
    alone = [
        run(patched, [grid], part)[0] for grid, part in zip(grids, np.split(pixels, [first_rows]))
    ]
    assert_close([both[0][:first_tokens], both[0][first_tokens:]], alone)


def test_plans_are_built_once_per_forward(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: the row plan is built on the host once per distinct cu_seqlens array and
    forward, then shared by every layer that gets that array (not rebuilt per layer)."""
    patched, _ = towers("qwen2_vl")  # every block gets the same full-attention cu_seqlens
    assert len(patched.blocks) > 1
    built = []
    original = SegmentPlan.from_bounds.__func__
    monkeypatch.setattr(
        SegmentPlan, "from_bounds", classmethod(lambda cls, b: built.append(b) or original(cls, b))
    )
    run(patched, [(1, 8, 8)])
    run(patched, [(1, 8, 8)])
    assert built == [[0, 64], [0, 64]]


def test_patch_keeps_parameters_and_can_be_undone() -> None:
    """Invariant: installing swaps classes only (same parameter names and array objects, so
    checkpoints load the same); it is idempotent and `restore` brings mlx-vlm's classes back."""
    from mlx_vlm import load

    tower = load(str(tiny_model("qwen2_5_vl")))[0].vision_tower
    before = tree_flatten(tower.parameters())
    classes = [type(tower), type(tower.blocks[0].attn)]
    assert batch_segment_attention(tower) and batch_segment_attention(tower)
    assert type(tower.blocks[0].attn).__name__ == "BatchedAttention"
    after = tree_flatten(tower.parameters())
    assert [(k, id(v)) for k, v in before] == [(k, id(v)) for k, v in after]
    restore_per_segment_attention(tower)
    assert [type(tower), type(tower.blocks[0].attn)] == classes


def test_tower_bench_runs_and_agrees() -> None:
    """Invariant: the timing script (docs.investigations.vision_tower) runs on a tiny model and
    its batched and per-window towers agree; it is a smoke test, no timing is asserted."""
    report = time_tower(str(tiny_model("qwen2_5_vl")), [112], repeats=1)
    row = report["sizes"]["112"]
    assert row["grid"] == [1, 8, 8]
    assert {"batched_ms", "stepwise_ms", "per_window_ms"} <= row.keys()
    assert row["max_abs_diff"] <= REL_TOL * row["feature_scale"]
