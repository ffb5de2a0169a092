"""Prompt forwards (gateway/engine/model/prompt_forward.py): the one-kernel rope for text ranges.

Pinned, for every architecture: `text_offset` finds text ranges (and their rope-delta-shifted
positions after an image) and refuses ranges with image tokens; a whole image prompt fed
block by block (the exact-reuse shapes, final block padded) with the fast text rope gives the
same hidden states and KV as with mlx-vlm's multimodal rope everywhere, bit for bit on CPU,
and the fast path is really taken for the text blocks and only for them.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from support import noise_image, tiny_model

import gateway.engine.model.prompt_forward as prompt_forward
from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.prompt_forward import text_offset

BLOCK = 32


def _prompt(model: QwenVL) -> tuple[list[int], list, list]:
    """Text, one 112x84 image, more text: (prompt ids, layouts, encoded images)."""
    before = model.tokenize("Look at this picture closely, please:")
    after = model.tokenize(" and now tell me, in many words, what you see there. " * 4)
    pixels, grid = model.preprocess(noise_image(5, 112, 84))
    ids, layouts = model.layout_prompt([*before, model.image_token_id, *after], [grid])
    return ids, layouts, [model.encode_image(pixels, grid)]


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_text_blocks_take_the_fast_rope_and_match_the_multimodal_rope(
    arch: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = QwenVL(str(tiny_model(arch)))
    assert model.text_core.fast_rope
    ids, layouts, encoded = _prompt(model)
    plan = model.prefill_plan(ids, layouts, encoded, 0, len(ids))
    image = layouts[0]
    assert text_offset(plan, 0, image.start) == 0
    assert text_offset(plan, image.start - 1, image.start + 1) is None  # crosses the image
    after = image.start + image.num_tokens
    # After the image, text positions run on from the image's largest position + 1.
    shifted = text_offset(plan, after, len(ids))
    assert shifted is not None and shifted == int(plan.host_positions.max(axis=0)[after - 1]) + 1
    assert shifted < after  # the image took fewer positions than tokens

    taken: list[object] = []
    real = prompt_forward.text_rope

    def spy(offsets):  # noqa: ANN001, ANN202
        taken.append(offsets)
        return real(offsets)

    monkeypatch.setattr(prompt_forward, "text_rope", spy)
    results = {}
    for fast in (True, False):
        cache = model.new_cache()
        hidden = []
        for lo in range(0, len(ids), BLOCK):
            hi = min(lo + BLOCK, len(ids))
            out = prompt_forward.forward(
                model.model.language_model.model, plan, cache, lo, hi, BLOCK, fast_text=fast
            )
            hidden.append(np.array(out[:, : hi - lo].astype(mx.float32)))
        kv = [np.array(c.keys[..., : c.offset, :].astype(mx.float32)) for c in cache]
        results[fast] = (np.concatenate(hidden, axis=1), kv)
        if fast:
            text_blocks = [
                lo for lo in range(0, len(ids), BLOCK) if not plan.visual[lo : lo + BLOCK].any()
            ]
            assert len(taken) == len(text_blocks) > 0  # every text block, nothing else
    (fast_hidden, fast_kv), (slow_hidden, slow_kv) = results[True], results[False]
    np.testing.assert_array_equal(fast_hidden, slow_hidden)
    for a, b in zip(fast_kv, slow_kv, strict=True):
        np.testing.assert_array_equal(a, b)
