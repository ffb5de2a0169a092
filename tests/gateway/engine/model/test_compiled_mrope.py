"""Compiled multimodal rope for image positions (gateway/engine/model/compiled_mrope.py).

Pinned: with image-like positions (the three mRoPE sections differ) the language model's
hidden states with the compiled apply are bit-identical to mlx-vlm's eager apply, in float32
and bfloat16 (CPU); every attention layer really calls the swapped function; the install is
idempotent and leaves architectures it does not know (Qwen3-VL, already compiled upstream)
alone; the model's own load installs it. The models here run with mlx-vlm's `fused_apply`
off (as on every non-Metal backend), so on a Mac the tests still exercise this function.
"""

from __future__ import annotations

import sys

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.utils import load_model
from support import tiny_model

from gateway.engine.families.qwen_vl import QwenVL
from gateway.engine.model.compiled_mrope import eager_mrope, install_compiled_mrope

FUNCTION = "apply_multimodal_rotary_pos_emb"


def _language(arch: str, weights: str = "float32"):  # noqa: ANN202 - an mlx-vlm module
    """A fresh language model whose layers call the module-level apply (Metal's fused
    kernel off)."""
    language = load_model(tiny_model(arch, weights)).language_model
    for layer in language.model.layers:
        layer.self_attn.rotary_emb.fused_apply = False
    return language


def _image_positions(length: int) -> mx.array:
    """(3, 2, length) position ids of two rows: 3 text tokens, a 4x4 image grid (t fixed,
    h and w varying), then text resuming after the grid's largest position, as mRoPE lays an
    image out."""
    rows = []
    for start in (0, 7):
        t, h, w = [], [], []
        for j in range(length):
            if 3 <= j < 19:  # the image: 16 tokens on a 4x4 grid
                g = j - 3
                t.append(start + 3), h.append(start + 3 + g // 4), w.append(start + 3 + g % 4)
            else:
                p = start + (j if j < 3 else j - 16 + 4)
                t.append(p), h.append(p), w.append(p)
        rows.append([t, h, w])
    return mx.array(np.array(rows).transpose(1, 0, 2), dtype=mx.int32)


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl"])
@pytest.mark.parametrize("weights", ["float32", "bfloat16"])
def test_compiled_apply_is_bit_identical(arch: str, weights: str) -> None:
    """Invariant: image-position prefill through the compiled apply == mlx-vlm's eager apply,
    exactly; and the comparison can fail (a one-step shift of the h section is seen)."""
    language = _language(arch, weights)
    assert install_compiled_mrope(language)
    rng = np.random.default_rng(0)
    tokens = mx.array(rng.integers(100, 1000, size=(2, 24)), dtype=mx.int32)
    positions = _image_positions(24)
    got = np.array(language.model(tokens, position_ids=positions).astype(mx.float32))
    with eager_mrope():
        want = np.array(language.model(tokens, position_ids=positions).astype(mx.float32))
    assert np.array_equal(got, want)

    shifted = positions + mx.array([0, 1, 0], dtype=mx.int32)[:, None, None]
    moved = np.array(language.model(tokens, position_ids=shifted).astype(mx.float32))
    assert not np.array_equal(moved[:, 3:], want[:, 3:])


def test_every_layer_calls_the_compiled_apply(monkeypatch: pytest.MonkeyPatch) -> None:
    """Invariant: the model looks the function up per call, so the swap reaches every layer."""
    language = _language("qwen2_5_vl")
    assert install_compiled_mrope(language)
    module = sys.modules[type(language).__module__]
    compiled, calls = getattr(module, FUNCTION), []
    assert compiled.__wrapped__ is not compiled

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(1)
        return compiled(*args, **kwargs)

    monkeypatch.setattr(module, FUNCTION, spy)
    tokens = mx.array([[5] * 24], dtype=mx.int32)
    mx.eval(language.model(tokens, position_ids=_image_positions(24)[:, :1]))
    assert len(calls) == len(language.model.layers)


def test_install_is_idempotent_and_selective() -> None:
    """Invariant: installing twice keeps one wrapper; Qwen3-VL (interleaved, compiled by
    mlx-vlm) is not touched; loading a QwenVL installs it."""
    language = _language("qwen2_vl")
    module = sys.modules[type(language).__module__]
    assert install_compiled_mrope(language)
    first = getattr(module, FUNCTION)
    assert install_compiled_mrope(language) and getattr(module, FUNCTION) is first
    with eager_mrope():
        assert getattr(module, FUNCTION) is first.__wrapped__
    assert getattr(module, FUNCTION) is first

    qwen3 = load_model(tiny_model("qwen3_vl")).language_model
    before = getattr(sys.modules[type(qwen3).__module__], FUNCTION)
    assert not install_compiled_mrope(qwen3)
    assert getattr(sys.modules[type(qwen3).__module__], FUNCTION) is before

    assert QwenVL(str(tiny_model("qwen2_5_vl"))).compiled_mrope
    assert not QwenVL(str(tiny_model("qwen2_5_vl")), lazy=True).compiled_mrope
