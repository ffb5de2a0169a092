"""Mistral 3's prompt side (families/mistral3.py), against mlx-vlm's own processor.

Pinned: for images of many shapes the grid predicted from the size alone is the processor's
(`preprocess`, whose pixels are the processor's), and the expanded prompt ids are the ones
mlx-vlm's processor writes (`[IMG]` rows, `[IMG_BREAK]`, `[IMG_END]`; one flat span per image
covering all of them); too-elongated images are refused before any pixel work; every setting
that changes pixels or the token count is in the cache key; a plain-string system message
renders; text models other than `mistral` are refused at load.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support import noise_image, tiny_model

from gateway.engine.families.mistral3 import Mistral3


@pytest.fixture(scope="module")
def family() -> Mistral3:
    return Mistral3(str(tiny_model("mistral3")), lazy=True)


SIZES = [(448, 448), (56, 56), (640, 360), (360, 640), (1, 1), (300, 17), (225, 224), (29, 500)]


@pytest.mark.parametrize(("width", "height"), SIZES)
def test_grid_and_ids_are_the_processors(family: Mistral3, width: int, height: int) -> None:
    """Invariant: image_grid(size) == the processor's grid, preprocess == the processor's
    pixels, and the expanded ids == the processor's expansion (less its duplicated BOS)."""
    image = noise_image(1, width, height)
    grid = family.image_grid(width, height)
    pixels, processed = family.preprocess(image)
    assert processed == grid
    prompt = family.render([{"role": "user", "content": [{"type": "image"}]}])
    out = family.processor(text=prompt, images=[image])
    want = np.asarray(out["pixel_values"])[0]
    assert pixels.shape == want.shape and np.array_equal(pixels, want)
    ids, layouts = family.layout_prompt(family.tokenize(prompt), [grid])
    reference = np.asarray(out["input_ids"])[0].tolist()
    assert reference[:2] == [family.tokenizer.bos_token_id] * 2
    assert ids == reference[1:]
    [span] = layouts
    rows, cols = grid[1] // 2, grid[2] // 2
    assert span.num_tokens == rows * cols + rows and span.rope_shift == 0
    run = ids[span.start : span.end]
    assert run.count(family.image_token_id) == rows * cols
    assert run.count(family.break_id) == rows - 1 and run[-1] == family.end_id


def test_two_images_two_spans_in_order(family: Mistral3) -> None:
    """Invariant: each `[IMG]` the template writes becomes its own image's span, in order."""
    prompt = family.render([{"role": "user", "content": [{"type": "image"}] * 2}])
    ids, layouts = family.layout_prompt(family.tokenize(prompt), [(1, 16, 16), (1, 4, 6)])
    assert [s.num_tokens for s in layouts] == [8 * 8 + 8, 2 * 3 + 2]
    assert layouts[0].end <= layouts[1].start
    with pytest.raises(ValueError, match="2 image placeholders for 1 images"):
        family.layout_prompt(family.tokenize(prompt), [(1, 16, 16)])


def test_too_elongated_is_refused_from_the_size(family: Mistral3) -> None:
    """Invariant: a side that would scale to nothing is a ValueError before pixels (the
    prompt builder's 400), not an error inside the processor."""
    with pytest.raises(ValueError, match="below 1 px"):
        family.image_grid(10_000, 3)
    with pytest.raises(ValueError, match="takes no video"):
        family.video_grid(4, 64, 64)
    assert family.media == frozenset({"image"})


def _variant(tmp: Path, config: dict | None = None, preprocessor: dict | None = None) -> str:
    """The tiny checkpoint with some of its json files changed (the rest linked)."""
    src = tiny_model("mistral3")
    for f in src.iterdir():
        (tmp / f.name).symlink_to(f)
    for name, change in (("config.json", config), ("preprocessor_config.json", preprocessor)):
        if change:
            data = json.loads((src / name).read_text())
            for key, value in change.items():
                if isinstance(value, dict) and isinstance(data.get(key), dict):
                    data[key] = {**data[key], **value}
                else:
                    data[key] = value
            (tmp / name).unlink()
            (tmp / name).write_text(json.dumps(data))
    return str(tmp)


def test_processor_settings_are_in_the_cache_key(family: Mistral3, tmp_path: Path) -> None:
    """Invariant: a longest edge that changes the token count, or a normalisation that
    changes the pixels, gives another processor fingerprint."""
    (tmp_path / "edge").mkdir()
    (tmp_path / "mean").mkdir()
    edge = Mistral3(_variant(tmp_path / "edge", preprocessor={"size": {"longest_edge": 112}}), True)
    mean = Mistral3(_variant(tmp_path / "mean", preprocessor={"image_mean": [0.5] * 3}), True)
    assert family.image_grid(448, 448) == (1, 16, 16)
    assert edge.image_grid(448, 448) == (1, 8, 8)
    assert mean.image_grid(448, 448) == (1, 16, 16)
    prints = {family.processor_fingerprint, edge.processor_fingerprint, mean.processor_fingerprint}
    assert len(prints) == 3
    again = Mistral3(str(tiny_model("mistral3")), lazy=True)
    assert again.processor_fingerprint == family.processor_fingerprint


def test_an_edge_past_the_towers_position_table_is_refused(tmp_path: Path) -> None:
    """Invariant: with a processor edge (448 px) past the tower's `image_size` (224 px) an
    image the processor would leave larger than 224 px is refused from its size (mlx-vlm
    would index past the 2D RoPE table and answer from garbage); smaller ones are served."""
    wide = Mistral3(_variant(tmp_path, preprocessor={"size": {"longest_edge": 448}}), True)
    assert wide.image_grid(224, 100) == (1, 8, 16)
    with pytest.raises(ValueError, match="over the vision tower's 224 px"):
        wide.image_grid(448, 448)


def test_plain_string_system_message_renders_as_its_text(family: Mistral3) -> None:
    """Invariant: Mistral Small 3.1's template reads a first system message as a list of
    parts; the family passes an OpenAI-style string as one part, with the same text."""
    user = {"role": "user", "content": "Hi"}
    plain = family.render([{"role": "system", "content": "Be brief."}, user])
    parts = [{"type": "text", "text": "Be brief."}]
    assert plain == family.render([{"role": "system", "content": parts}, user])
    assert plain == "<s>[SYSTEM_PROMPT]Be brief.[/SYSTEM_PROMPT][INST]Hi[/INST]"


def test_other_text_models_are_refused(tmp_path: Path) -> None:
    """Invariant: mlx-vlm's `ministral3` text model (attention scaled by row 0's position in
    a batch) is refused at load, naming what is served."""
    rope = {
        "rope_theta": 1e9,
        "rope_type": "default",
        "llama_4_scaling_beta": 0.1,
        "original_max_position_embeddings": 8192,
    }
    text = {"model_type": "ministral3", "rope_parameters": rope}
    path = _variant(tmp_path, config={"text_config": text})
    with pytest.raises(ValueError, match="'ministral3' text model is not served"):
        Mistral3(path, lazy=True)


def test_rgb_conversion_is_the_processors(family: Mistral3) -> None:
    """Invariant: a non-RGB image is converted as the processor converts it."""
    gray = Image.fromarray((np.arange(56 * 80) % 256).astype("uint8").reshape(56, 80), "L")
    pixels, grid = family.preprocess(gray)
    want, want_grid = family.preprocess(gray.convert("RGB"))
    assert grid == want_grid and np.array_equal(pixels, want)


def test_a_conversation_the_template_refuses_is_a_value_error(family: Mistral3) -> None:
    """Invariant: a chat template's own `raise_exception` (Mistral's refuses roles other than
    user/system/assistant) reaches the prompt builder as a ValueError (a 400 for the client),
    never as a template exception (a 500)."""
    with pytest.raises(ValueError, match="chat template refused the conversation"):
        family.render([{"role": "tool", "content": "42"}])
