"""The prompt side the engine process ships (`ModelFamily.shipped_prompt`, pickled through
`wire.Ready`) is the family's own: after the round trip it renders, tokenizes, lays out images
and video clips exactly as the engine-side family does, for every family's tiny checkpoint;
every family ships one; it unpickles and builds prompts in a process without MLX; and the
package imports no MLX."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support import tiny_model

from gateway.engine.families import load_model
from gateway.engine.families.registry import FAMILIES
from gateway.engine.families.text import TextModel
from gateway.offline_model import ARCHS
from gateway.offline_model.embedders import (
    RERANKER_FAMILY,
    TEXT_FAMILY,
    VL_FAMILY,
    VL_RERANKER_FAMILY,
)
from gateway.processors.processor import PromptProcessor

# Every chat family's tiny checkpoint (the Qwen-VL ones, Gemma 3/4, text models, ...); the
# embedders and rerankers are served by the embedding engine, which ships no prompt side.
EMBEDDER_ARCHS = {f.arch for f in (TEXT_FAMILY, VL_FAMILY, RERANKER_FAMILY, VL_RERANKER_FAMILY)}
SPLIT = tuple(a for a in ARCHS if a not in EMBEDDER_ARCHS)
MESSAGES = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "what is this?"}]},
]
PLAIN = [{"role": "user", "content": "what is this?"}]
SIZES = ((56, 56), (84, 56), (448, 140), (640, 360), (30, 1000), (5000, 40), (1, 1))
_MLX = ("mlx", "mlx_lm", "mlx_vlm")


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
    assert shipped.render(PLAIN) == family.render(PLAIN)
    messages = MESSAGES if family.media else PLAIN
    text = family.render(messages)
    assert shipped.render(messages) == text
    ids = family.tokenize(text)
    assert shipped.tokenize(text) == ids
    if not family.media:
        with pytest.raises(ValueError):
            shipped.image_grid(56, 56)
        return
    for size in SIZES:
        assert _outcome(shipped.image_grid, *size) == _outcome(family.image_grid, *size)
    grids = [family.image_grid(84, 56)]
    assert shipped.layout_prompt(ids, grids) == family.layout_prompt(ids, grids)
    assert _outcome(shipped.layout_prompt, ids, grids * 2) == _outcome(
        family.layout_prompt, ids, grids * 2
    )


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


def test_the_shipped_prompt_side_needs_no_mlx(tmp_path: Path) -> None:
    """Invariant: every family's shipped prompt side unpickles, renders, tokenizes and lays
    out an image in a process that has loaded no MLX library (the HTTP process)."""
    shipped = {}
    for arch in SPLIT:
        family = load_model(str(tiny_model(arch)), lazy=True)
        shipped[arch] = family.shipped_prompt()
    blob = tmp_path / "shipped.pickle"
    blob.write_bytes(pickle.dumps(shipped))
    code = (
        "import pickle, sys\n"
        f"shipped = pickle.loads(open({str(blob)!r}, 'rb').read())\n"
        f"image = {MESSAGES!r}\n"
        "for p in shipped.values():\n"
        "    ids = p.tokenize(p.render(image if p.media else image[:1]))\n"
        "    p.layout_prompt(ids, [p.image_grid(84, 56)] if p.media else [])\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {_MLX!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_every_family_ships_its_prompt_side() -> None:
    """Invariant: every family the registry serves, and the text family, is split
    (`prompt_split`): the HTTP process never loads a family (or MLX) to build prompts."""
    classes = {*FAMILIES.values(), TextModel}
    assert sorted(c.__name__ for c in classes if not c.prompt_split) == []


def test_the_prompt_side_package_imports_no_mlx() -> None:
    """Invariant: importing every module of `gateway.processors` loads no MLX library."""
    code = (
        "import sys, pkgutil, importlib, gateway.processors as p\n"
        "for m in pkgutil.iter_modules(p.__path__):\n"
        "    importlib.import_module(p.__name__ + '.' + m.name)\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {_MLX!r}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _outcome(call: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    """What a call gives: ("ok", its value) or ("error", its exception's type and text)."""
    try:
        return "ok", call(*args)
    except Exception as exc:  # noqa: BLE001 - the comparison is the point
        return "error", (type(exc).__name__, str(exc))
