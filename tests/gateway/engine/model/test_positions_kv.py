"""mRoPE positions and row-delta KV caches.

Pinned: our positions equal mlx-vlm's `get_rope_index` for every architecture and image layout;
rope deltas ride with each row through merge / extend / filter / extract; a merge of empty
caches keeps the row-delta class (mlx-lm returns a plain BatchKVCache there).
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from support import tiny_model

from gateway.engine.model.kv import RowBatchKVCache, RowKVCache, row_offsets, row_positions
from gateway.processors.positions import ImageLayout, mrope_positions, rope_delta_at


@pytest.mark.parametrize("arch", ["qwen2_vl", "qwen2_5_vl", "qwen3_vl"])
def test_positions_match_mlx_vlm(arch: str) -> None:
    """Invariant: mrope_positions == mlx-vlm get_rope_index (positions and final delta)."""
    from gateway.engine.families.qwen_vl import QwenVL

    model = QwenVL(str(tiny_model(arch)))
    patch = int(model.image_processor.patch_size)
    m = model.merge_size
    for grids in ([], [(1, 2 * m, 3 * m)], [(1, 4 * m, 2 * m), (1, 2 * m, 2 * m)]):
        messages = [
            {
                "role": "user",
                "content": [{"type": "image"} for _ in grids] + [{"type": "text", "text": "hi"}],
            }
        ]
        ids = model.tokenize(model.render(messages))
        prompt, layouts = model.layout_prompt(ids, grids)
        args = (mx.array([prompt]), mx.array(grids)) if grids else (mx.array([prompt]),)
        ref, ref_delta = model.model.language_model.get_rope_index(*args)
        mine = mrope_positions(len(prompt), layouts)
        if ref.ndim == 2:  # text only: mlx-vlm returns (B, L)
            ref = mx.broadcast_to(ref[None], (3, *ref.shape))
        assert np.array_equal(np.array(ref)[:, 0, :], mine), (arch, grids)
        assert rope_delta_at(layouts, len(prompt)) == int(np.array(ref_delta).reshape(-1)[0])
        assert patch > 0


def test_rope_delta_at_refuses_cuts_inside_images() -> None:
    """Invariant: a cut inside an image span is an error, never a silent wrong delta."""
    layouts = [ImageLayout(start=3, t=1, h=2, w=3)]
    assert rope_delta_at(layouts, 3) == 0
    assert rope_delta_at(layouts, 9) == 3 - 6
    with pytest.raises(ValueError):
        rope_delta_at(layouts, 5)
    assert mrope_positions(12, layouts, start=9).shape == (3, 3)


def _cache(length: int, delta: int, seed: int) -> RowKVCache:
    rng = np.random.default_rng(seed)
    keys = mx.array(rng.standard_normal((1, 2, length, 4)).astype(np.float32))
    values = mx.array(rng.standard_normal((1, 2, length, 4)).astype(np.float32))
    return RowKVCache.from_arrays(keys, values, delta)


def test_deltas_ride_through_batch_operations() -> None:
    """Invariant: merge/extend/filter/extract keep each row's delta and KV together."""
    a, b, c = _cache(5, -3, 0), _cache(2, 0, 1), _cache(7, -10, 2)
    batch = RowKVCache.merge([a, b])
    assert isinstance(batch, RowBatchKVCache)
    assert batch.rope_deltas.tolist() == [-3, 0]
    batch.extend(RowKVCache.merge([c]))
    assert batch.rope_deltas.tolist() == [-3, 0, -10]
    batch.filter([0, 2])
    assert batch.rope_deltas.tolist() == [-3, -10]
    row = batch.extract(1)
    assert row.rope_delta == -10 and row.offset == 7
    assert np.array_equal(np.array(row.keys), np.array(c.keys))
    assert row_positions(batch, 2).tolist() == [[5 - 3, 6 - 3], [7 - 10, 8 - 10]]
    assert row_offsets(batch).tolist() == [5 - 3, 7 - 10] and row_offsets(row) == 7 - 10


def test_merge_of_empty_caches_keeps_row_class() -> None:
    """Invariant: fresh text rows merge into a RowBatchKVCache with delta 0."""
    batch = RowKVCache.merge([RowKVCache(), RowKVCache()])
    assert isinstance(batch, RowBatchKVCache)
    assert batch.rope_deltas.tolist() == [0, 0]


def test_snapshot_is_independent_and_exactly_sized() -> None:
    """Invariant: a stored snapshot has no spare capacity and later writes never reach it."""
    live = RowKVCache(-2)
    k = mx.ones((1, 2, 3, 4))
    live.update_and_fetch(k, k)
    snap = live.snapshot()
    assert snap.keys.shape[2] == 3 and snap.used_nbytes() == 2 * 3 * 2 * 4 * 4
    live.update_and_fetch(k * 5, k * 5)
    fork = RowKVCache.from_arrays(snap.keys, snap.values, -2)
    fork.update_and_fetch(k * 7, k * 7)
    assert float(mx.max(snap.keys).item()) == 1.0 and snap.offset == 3


def test_a_flat_span_shifts_nothing() -> None:
    """Invariant: a 1D family's span (ImageLayout.flat) covers its tokens and leaves the
    text after it at index positions (rope delta 0), wherever the cut."""
    from gateway.processors.positions import ImageLayout, rope_delta_at

    span = ImageLayout.flat(5, 64)
    assert (span.start, span.end, span.num_tokens, span.rope_shift) == (5, 69, 64, 0)
    assert rope_delta_at([span, ImageLayout.flat(80, 7)], 100) == 0
