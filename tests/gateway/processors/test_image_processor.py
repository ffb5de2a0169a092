"""Invariant: our preprocessing == the checkpoint's processor, bit for bit.

References: the processor `mlx_vlm.load` gives our tiny checkpoints (mlx-vlm's numpy port, the
one serving uses) and transformers' PIL processor built from the same preprocessor_config.json.
Equal means same dtype, shape, grid and `np.array_equal` values, or the same ValueError.
"""

from __future__ import annotations

import logging
from functools import cache
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image
from support import noise_image, tiny_model
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from gateway.engine.families.qwen_vl import QwenVL
from gateway.processors import image_processor
from gateway.processors.image_processor import (
    QwenImageProcessor,
    fast_image_processor,
    spec_from_processor,
)

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
SIZES = [(1, 1), (28, 28), (56, 84), (100, 37), (448, 448), (1024, 1024), (300, 17), (1000, 10)]
ODD_SIZES = [(999, 7), (641, 479), (17, 300), (3, 600), (2000, 1500), (1, 500)]  # (1, 500): > 200:1
QWEN25_7B = dict(min_pixels=3136, max_pixels=12845056)  # the 7B's limits: 1024x1024 -> 1036x1036


@cache
def model(arch: str) -> QwenVL:
    return QwenVL(str(tiny_model(arch)))


def mlx_vlm_processor(arch: str, **overrides: Any) -> Any:
    """A fresh copy of the processor mlx_vlm.load gave the checkpoint, with overrides."""
    loaded = model(arch).image_processor
    return type(loaded)(**{**vars(loaded), **overrides})


def hf_processor(arch: str, **overrides: Any) -> Qwen2VLImageProcessorPil:
    return Qwen2VLImageProcessorPil.from_pretrained(str(tiny_model(arch)), **overrides)


def run_reference(processor: Any, image: Image.Image) -> tuple[Any, Any]:
    try:
        out = processor(images=[image], return_tensors="np")
    except ValueError as exc:
        return None, str(exc)
    grid = tuple(int(v) for v in np.asarray(out["image_grid_thw"])[0])
    return np.asarray(out["pixel_values"]), grid


def run_ours(ours: QwenImageProcessor, image: Image.Image) -> tuple[Any, Any]:
    try:
        return ours(image)
    except ValueError as exc:
        return None, str(exc)


def assert_same(processor: Any, image: Image.Image, parallel: bool = True) -> None:
    spec = spec_from_processor(processor)
    expected, expected_grid = run_reference(processor, image)
    got, grid = run_ours(QwenImageProcessor(spec, parallel=parallel), image)
    assert grid == expected_grid, image.size
    if expected is None:
        assert got is None, image.size
        return
    assert got.dtype == expected.dtype and got.shape == expected.shape, image.size
    assert np.array_equal(got, expected), (image.size, np.abs(got - expected).max())


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("reference", ["mlx_vlm", "transformers"])
def test_matches_the_checkpoint_processors(arch: str, reference: str) -> None:
    make = mlx_vlm_processor if reference == "mlx_vlm" else hf_processor
    for config in ({}, QWEN25_7B):
        processor = make(arch, **config)
        if config:  # the override took: 1024x1024 is upscaled, not shrunk to the tiny cap
            assert spec_from_processor(processor).max_pixels == QWEN25_7B["max_pixels"]
        for i, (width, height) in enumerate(SIZES + ODD_SIZES):
            assert_same(processor, noise_image(i, width, height))


@pytest.mark.parametrize("arch", ARCHS)
def test_model_preprocess_takes_the_fast_path_and_agrees(arch: str) -> None:
    vlm = model(arch)
    image = noise_image(7, 333, 222)
    expected = run_reference(vlm.image_processor, image)
    ours = vlm.preprocess(image)
    assert ours[1] == expected[1] and np.array_equal(ours[0], expected[0])
    assert fast_image_processor(vlm.image_processor) is not None
    assert model(arch).image_grid(333, 222) == ours[1]


def test_rescale_and_normalise_switches_and_serial_mode() -> None:
    image = noise_image(3, 150, 90)
    for make in (mlx_vlm_processor, hf_processor):
        for flags in (dict(do_rescale=False), dict(do_normalize=False), dict(image_mean=[0.1] * 3)):
            assert_same(make("qwen2_vl", **flags), image)
        assert_same(make("qwen3_vl", **QWEN25_7B), noise_image(4, 1024, 768), parallel=False)


@settings(max_examples=40, deadline=None)
@given(
    width=st.integers(1, 640),
    height=st.integers(1, 640),
    patch=st.sampled_from([14, 16]),
    min_side=st.integers(1, 120),
    max_side=st.integers(120, 900),
)
def test_any_size_and_pixel_limits_match_mlx_vlm(
    width: int, height: int, patch: int, min_side: int, max_side: int
) -> None:
    processor = mlx_vlm_processor(
        "qwen2_vl", patch_size=patch, min_pixels=min_side**2, max_pixels=max_side**2
    )
    assert_same(processor, noise_image(width * 7 + height, width, height))


def test_unsupported_configs_fall_back_to_the_processor(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(image_processor, "_logged", set())  # "once" per process: start afresh
    bilinear = hf_processor("qwen2_vl", resample=Image.Resampling.BILINEAR)
    with caplog.at_level(logging.WARNING, logger="gateway.processors.image_processor"):
        assert fast_image_processor(bilinear) is None
        assert fast_image_processor(bilinear) is None
    assert len([r for r in caplog.records if "resample=" in r.getMessage()]) == 1  # once

    class Custom(type(model("qwen2_vl").image_processor)):  # a subclass may change any step
        pass

    assert fast_image_processor(Custom(**vars(model("qwen2_vl").image_processor))) is None
    vlm = QwenVL.__new__(QwenVL)  # preprocess needs this one field
    vlm.image_processor = bilinear
    image = noise_image(2, 90, 60)
    pixels, grid = vlm.preprocess(image)
    expected, expected_grid = run_reference(bilinear, image)
    assert grid == expected_grid and np.array_equal(pixels, expected)


def test_non_rgb_input_uses_the_processor() -> None:
    vlm = model("qwen2_vl")
    image = noise_image(5, 64, 64).convert("L")
    pixels, grid = vlm.preprocess(image)
    expected, expected_grid = run_reference(vlm.image_processor, image)
    assert grid == expected_grid and np.array_equal(pixels, expected)
    with pytest.raises(ValueError, match="RGB"):
        fast_image_processor(vlm.image_processor)(image)  # type: ignore[misc]
