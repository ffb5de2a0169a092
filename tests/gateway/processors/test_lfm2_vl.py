"""LFM2-VL's prompt side (gateway/processors/lfm2_vl.py) restates mlx-vlm 0.7.10's tiling and
smart-resize arithmetic without MLX. Pinned: over a sweep of image sizes (1 px to 8000 px a
side, every aspect) and two settings (the tiny checkpoint's, and LFM2-VL-450M's real 16 px
patches, 512 px tiles, 64..256 tokens), the views the grid decodes to (tile grid, each view's
patch grid, the thumbnail) are exactly those mlx-vlm's NumPy image processor makes, found
without pixels (its own `_views_for_image` over a stand-in image that only has a size)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from mlx_vlm.models.lfm2_vl.processing_lfm2_vl import Lfm2VlNumpyImageProcessor

from gateway.processors.lfm2_vl import Lfm2VlProcessor, Lfm2VlSettings

TINY = Lfm2VlSettings(
    image_token_id=5,
    image_token="<image>",
    image_start_token="<|image_start|>",
    image_end_token="<|image_end|>",
    thumbnail_token="<|img_thumbnail|>",
    use_image_special_tokens=True,
    patch=8,
    factor=2,
    min_image_tokens=4,
    max_image_tokens=16,
    max_pixels_tolerance=2.0,
    do_image_splitting=True,
    tile_size=64,
    min_tiles=2,
    max_tiles=10,
    use_thumbnail=True,
)
REAL = replace(TINY, patch=16, min_image_tokens=64, max_image_tokens=256, tile_size=512)
SIDES = (1, 2, 7, 15, 16, 17, 31, 33, 48, 56, 63, 64, 65, 100, 127, 129, 200, 255, 300, 384)
SIDES += (448, 500, 511, 512, 513, 640, 700, 768, 1000, 1023, 1025, 1500, 2000, 3000, 5000, 8000)


class _Sized:
    """A stand-in PIL image: a size, and the resize / crop that change it."""

    def __init__(self, size: tuple[int, int]) -> None:
        self.size = size

    def resize(self, size: tuple[int, int], resample: object = None) -> _Sized:
        return _Sized(size)

    def crop(self, box: tuple[int, int, int, int]) -> _Sized:
        return _Sized((box[2] - box[0], box[3] - box[1]))


def _mlx_vlm_views(s: Lfm2VlSettings, width: int, height: int) -> tuple[int, int, list]:
    """(rows, cols, each view's (h, w) patches) as mlx-vlm's image processor makes them;
    rows = cols = 0 for one view, as the prompt side says it."""
    ip = Lfm2VlNumpyImageProcessor(
        encoder_patch_size=s.patch,
        downsample_factor=s.factor,
        min_image_tokens=s.min_image_tokens,
        max_image_tokens=s.max_image_tokens,
        max_pixels_tolerance=s.max_pixels_tolerance,
        tile_size=s.tile_size,
        do_image_splitting=s.do_image_splitting,
        min_tiles=s.min_tiles,
        max_tiles=s.max_tiles,
        use_thumbnail=s.use_thumbnail,
    )
    views, rows, cols, _ = ip._views_for_image(
        _Sized((width, height)), s.do_image_splitting, s.min_tiles, s.max_tiles, s.use_thumbnail
    )
    shapes = [(v.size[1] // s.patch, v.size[0] // s.patch) for v in views]
    return (0, 0, shapes) if (rows, cols) == (1, 1) else (rows, cols, shapes)


@pytest.mark.parametrize(
    "settings",
    [TINY, REAL, replace(REAL, use_thumbnail=False), replace(TINY, do_image_splitting=False)],
    ids=["tiny", "real", "real-no-thumbnail", "tiny-no-tiling"],
)
def test_views_from_the_size_alone_are_mlx_vlms(settings: Lfm2VlSettings) -> None:
    """Invariant: the grid from the size decodes to mlx-vlm's views, for every size."""
    prompt = Lfm2VlProcessor("x", "lfm2_vl", None, settings)
    tiled = 0
    for width in SIDES:
        for height in SIDES:
            grid = prompt.image_grid(width, height)
            want = _mlx_vlm_views(settings, width, height)
            assert prompt.views(grid) == want, (width, height, grid)
            tiled += want[0] > 0
    assert tiled > 0 or not settings.do_image_splitting  # the sweep reaches both forms
