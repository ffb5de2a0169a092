"""Fused rope for text positions (gateway/engine/model/text_rope.py) against mlx-vlm's mRoPE.

Pinned, for every architecture: TextCore's logits with the fast rope equal those of an
untouched mlx-vlm model (multimodal rope, explicit 3-section position ids) in decode steps
over rows with different offsets and rope deltas, and in multi-token text prefill (left
padded, chunked); the fast path really replaces the unfused rope; explicit image positions
still get the original mRoPE; no parameter changes; an arch whose rope is not plain rope at
text positions is left alone. Tiny float32 checkpoints: the equality is exact on CPU; 1e-5
allows other backends.
"""

from __future__ import annotations

from pathlib import Path

import mlx.core as mx
import numpy as np
import pytest
from mlx.utils import tree_flatten
from mlx_vlm.models.rope_utils import MRoPERotaryEmbedding
from mlx_vlm.utils import load_model
from support import tiny_model

from gateway.engine.model.kv import RowBatchKVCache, RowKVCache
from gateway.engine.model.text_core import TextCore
from gateway.engine.model.text_rope import install_text_rope

ARCHS = ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"]
ATOL = 1e-5
# (prompt length, rope delta): different offsets, text rows (0) and image-like rows (< 0).
ROWS = [(5, 0), (9, -4), (3, -30), (12, 7), (1, -1)]


def _cores(arch: str) -> tuple[TextCore, TextCore]:
    """(fast, reference): two loads of one checkpoint; the reference is never patched."""
    path = Path(tiny_model(arch))
    fast = TextCore(load_model(path).language_model)
    reference = TextCore(load_model(path).language_model, fast_rope=False)
    assert fast.fast_rope and not reference.fast_rope
    return fast, reference


@pytest.fixture(scope="module", params=ARCHS)
def cores(request: pytest.FixtureRequest) -> tuple[TextCore, TextCore]:
    return _cores(request.param)


def _tokens(rng: np.random.Generator, *shape: int) -> mx.array:
    return mx.array(rng.integers(100, 1000, size=shape), dtype=mx.int32)


def _prefilled_rows(core: TextCore, seed: int = 0) -> list[list[RowKVCache]]:
    """Each row of ROWS prefilled alone (per-layer caches), on the given core."""
    rng = np.random.default_rng(seed)
    rows = []
    for length, delta in ROWS:
        cache = [RowKVCache(delta) for _ in core.layers]
        core(_tokens(rng, 1, length), cache=cache)
        rows.append(cache)
    return rows


def _batch(rows: list[list[RowKVCache]], deltas: list[int] | None = None) -> list[RowBatchKVCache]:
    """Merge independent copies of `rows` into one batch cache per layer."""
    layers = []
    for layer in range(len(rows[0])):
        copies = [row[layer].snapshot() for row in rows]
        if deltas is not None:
            for copy, delta in zip(copies, deltas, strict=True):
                copy.rope_delta = delta
        layers.append(RowKVCache.merge(copies))
    return layers


def _decode(core: TextCore, cache: list[RowBatchKVCache], steps: int) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(steps):
        out.append(np.array(core(_tokens(rng, len(ROWS), 1), cache=cache)))
    return out


def test_decode_steps_match_mrope(cores: tuple[TextCore, TextCore]) -> None:
    """Invariant: in decode steps over a batch whose rows have different cache offsets and
    rope deltas (text 0, negative as after images, positive), fast-rope logits == mRoPE
    logits. The KV both start from is the reference's own prefill, so only the step differs."""
    fast, reference = cores
    rows = _prefilled_rows(reference)
    want = _decode(reference, _batch(rows), steps=3)
    got = _decode(fast, _batch(rows), steps=3)
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        assert np.abs(g - w).max() <= ATOL, f"step {step}: {np.abs(g - w).max()}"

    # The comparison can fail: one row's delta off by one moves that row's logits.
    shifted = [d + (i == 1) for i, (_, d) in enumerate(ROWS)]
    wrong = _decode(fast, _batch(rows, shifted), steps=1)[0]
    assert np.abs(wrong[1] - want[0][1]).max() > 1e-3
    assert np.abs(wrong[0] - want[0][0]).max() <= ATOL  # the other rows are untouched


def test_single_row_prefill_matches_mrope(cores: tuple[TextCore, TextCore]) -> None:
    """Invariant: multi-token prefill of one row (int offsets, nonzero deltas) gives fast-rope
    logits == mRoPE logits, from an empty cache and for a second chunk continuing KV that
    the mRoPE path wrote (so an absolute position error cannot hide behind rope's relativity).
    """
    fast, reference = cores
    for length, delta in ROWS:
        rng = np.random.default_rng(length)
        first, second = _tokens(rng, 1, length), _tokens(rng, 1, 4)
        mixed, pure = ([RowKVCache(delta) for _ in fast.layers] for _ in range(2))
        want = np.array(reference(first, cache=mixed))
        assert np.array_equal(want, np.array(reference(first, cache=pure)))
        got = np.array(fast(first, cache=[RowKVCache(delta) for _ in fast.layers]))
        assert np.abs(got - want).max() <= ATOL, (length, delta)
        got, want = np.array(fast(second, cache=mixed)), np.array(reference(second, cache=pure))
        assert np.abs(got - want).max() <= ATOL, (length, delta)


def test_batched_left_padded_prefill_matches_mrope(cores: tuple[TextCore, TextCore]) -> None:
    """Invariant: a left-padded batched text prefill (per-row offsets start negative, rows
    have different deltas) gives fast-rope logits == mRoPE logits on every real (non-padding)
    token, from empty caches and for a second chunk continuing KV the mRoPE path wrote."""
    fast, reference = cores
    padding, deltas = [0, 3, 5, 1], [0, -4, -20, 6]
    rng = np.random.default_rng(2)
    first, second = _tokens(rng, len(padding), 8), _tokens(rng, len(padding), 3)

    def fresh() -> list[RowBatchKVCache]:
        return [RowBatchKVCache(padding, deltas) for _ in fast.layers]

    mixed, pure = fresh(), fresh()
    want = np.array(reference(first, cache=mixed))
    reference(first, cache=pure)
    got = np.array(fast(first, cache=fresh()))
    for row, pad in enumerate(padding):
        assert np.abs(got[row, pad:] - want[row, pad:]).max() <= ATOL, row
    got, want = np.array(fast(second, cache=mixed)), np.array(reference(second, cache=pure))
    assert np.abs(got - want).max() <= ATOL

    # The comparison can fail: the second chunk placed one position off the first is seen.
    wrong = fresh()
    reference(first, cache=wrong)
    wrong[0].rope_deltas = wrong[0].rope_deltas + 1  # positions come from layer 0 only
    assert np.abs(np.array(fast(second, cache=wrong)) - want).max() > 1e-3


def test_fast_path_replaces_the_unfused_rope(
    cores: tuple[TextCore, TextCore], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: inside TextCore the unfused mRoPE (cos/sin tables, mlx-vlm's apply) never
    runs, and each layer rotates q and k with one mx.fast.rope each. Without this the
    equality tests above would pass with the optimisation silently disengaged."""
    fast, _ = cores

    def forbidden(*_: object, **__: object) -> None:
        raise AssertionError("unfused mRoPE used in TextCore")

    calls = []
    rope = mx.fast.rope

    def counting(*args: object, **kwargs: object) -> mx.array:
        calls.append(kwargs.get("offset"))
        return rope(*args, **kwargs)

    monkeypatch.setattr(MRoPERotaryEmbedding, "__call__", forbidden)
    monkeypatch.setattr(MRoPERotaryEmbedding, "apply_rotary", forbidden)
    monkeypatch.setattr(mx.fast, "rope", counting)
    rows = _prefilled_rows(fast)
    calls.clear()
    mx.eval(fast(mx.array([[3]] * len(ROWS)), cache=_batch(rows)))
    assert len(calls) == 2 * len(fast.layers)
    expected = [length + delta for length, delta in ROWS]
    assert all(np.array(c).tolist() == expected for c in calls)


def test_image_positions_keep_multimodal_rope(cores: tuple[TextCore, TextCore]) -> None:
    """Invariant: outside TextCore (image prefill calls the model with explicit 3-section
    position ids that differ per section) the patched model equals the untouched one."""
    fast, reference = cores
    rng = np.random.default_rng(3)
    tokens = _tokens(rng, 1, 6)
    positions = mx.array([[[4, 4, 4, 4, 8, 9]], [[4, 4, 5, 5, 8, 9]], [[4, 5, 4, 5, 8, 9]]])
    outputs = []
    for core in (fast, reference):
        cache = [RowKVCache() for _ in core.layers]
        outputs.append(np.array(core.lm.model(tokens, cache=cache, position_ids=positions)))
    assert np.abs(outputs[0] - outputs[1]).max() <= ATOL


def test_install_leaves_non_plain_rope_alone() -> None:
    """Invariant: if any layer's rope is not plain rope at text positions (here: attention
    scaling != 1), nothing is swapped and TextCore keeps the mRoPE path."""
    model = load_model(Path(tiny_model("qwen2_vl"))).language_model
    model.model.layers[-1].self_attn.rotary_emb.attention_scaling = 2.0
    before = [type(layer.self_attn.rotary_emb) for layer in model.model.layers]
    assert not install_text_rope(model)
    assert [type(layer.self_attn.rotary_emb) for layer in model.model.layers] == before
    assert not TextCore(model).fast_rope


def test_install_keeps_parameters_and_is_idempotent() -> None:
    """Invariant: installing touches no parameter (same names, same arrays), so checkpoints
    load identically; a second install is a no-op that still reports the fast path."""
    path = Path(tiny_model("qwen3_vl"))
    model = load_model(path).language_model
    before = dict(tree_flatten(model.parameters()))
    assert install_text_rope(model)
    classes = [type(layer.self_attn.rotary_emb) for layer in model.model.layers]
    assert install_text_rope(model)
    assert [type(layer.self_attn.rotary_emb) for layer in model.model.layers] == classes
    after = dict(tree_flatten(model.parameters()))
    assert before.keys() == after.keys()
    assert all(before[name] is after[name] for name in before)
    model.load_weights(list(after.items()))  # strict: every name still has a home
