"""The prompt side the engine process ships (`ModelFamily.shipped_prompt`, pickled through
`wire.Ready`) is the family's own: after the round trip it renders, tokenizes, lays out images
and video clips exactly as the engine-side family does, and the package imports no MLX."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from support import tiny_model

from gateway.engine.families import load_model
from gateway.processors.processor import PromptProcessor

SPLIT = ("qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3", "llama")
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]},
]


@pytest.fixture(scope="module", params=SPLIT)
def pair(request: pytest.FixtureRequest) -> tuple:
    family = load_model(str(tiny_model(request.param)), lazy=True)
    shipped = family.shipped_prompt()
    assert isinstance(shipped, PromptProcessor)
    return family, pickle.loads(pickle.dumps(shipped))


def test_the_shipped_prompt_side_builds_the_familys_prompt(pair: tuple) -> None:
    """Invariant: template text, token ids, image grids and layouts are the family's."""
    family, shipped = pair
    assert (shipped.family, shipped.media, shipped.model_type) == (
        family.family,
        family.media,
        family.model_type,
    )
    assert shipped.describe() == family.describe()
    assert shipped.embed_bytes == family.embed_bytes
    messages = MESSAGES if family.media else [{"role": "user", "content": "what is this?"}]
    text = family.render(messages)
    assert shipped.render(messages) == text
    ids = family.tokenize(text)
    assert shipped.tokenize(text) == ids
    if not family.media:
        with pytest.raises(ValueError):
            shipped.image_grid(56, 56)
        return
    for size in ((56, 56), (84, 56), (448, 140)):
        assert shipped.image_grid(*size) == family.image_grid(*size)
    grids = [family.image_grid(84, 56)]
    assert shipped.layout_prompt(ids, grids) == family.layout_prompt(ids, grids)


def test_the_shipped_prompt_side_lays_out_video_as_the_family(pair: tuple) -> None:
    """Invariant: a clip's grid, layout, expanded ids and per-block frames are the family's."""
    family, shipped = pair
    if "video" not in family.media:
        pytest.skip("no video")
    times = [0.0, 0.5, 1.0, 1.5]
    grid = family.video_grid(4, 84, 56)
    assert shipped.video_grid(4, 84, 56) == grid
    layout = family.video_layout(grid, times)
    assert shipped.video_layout(grid, times) == layout
    text = family.render(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "what?"}]}]
    )
    ids = family.tokenize(text)
    assert shipped.layout_prompt(ids, [layout]) == family.layout_prompt(ids, [layout])
    frames = np.zeros((4, 56, 84, 3), dtype=np.uint8)
    for block in (None, 0):
        mine = shipped.video_clip(frames, times, grid, block)
        theirs = family.video_clip(frames, times, grid, block)
        assert (mine.times, mine.resize_to) == (theirs.times, theirs.resize_to)
        assert np.array_equal(mine.frames, theirs.frames)


def test_the_prompt_side_package_imports_no_mlx() -> None:
    """Invariant: importing every module of `gateway.processors` loads no MLX library."""
    code = (
        "import sys, pkgutil, importlib, gateway.processors as p\n"
        "for m in pkgutil.iter_modules(p.__path__):\n"
        "    importlib.import_module(p.__name__ + '.' + m.name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('mlx', 'mlx_lm', 'mlx_vlm')))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
