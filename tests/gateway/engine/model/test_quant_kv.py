"""Quantized KV caches (`--kv-bits`): the single-row and the batch form.

Pinned: a position's quantized KV depends on that position alone (the premise of exact reuse:
a block quantized in any company is the same bits); rows and their rope deltas ride through
merge / extend / filter / extract bit for bit, and a decode step appends to each row what it
appends alone; a row attends in a left-padded batch exactly as alone (CPU); mlx-lm's
right-padded batch prefill (prepare / finalize) lands each row where a merge puts it; a
stored row is never written by the cache that was built from it; contiguous copies (what CUDA
needs) give the attention the same bits.
"""

from __future__ import annotations

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.base import quantized_scaled_dot_product_attention

from gateway.engine.model import quant_kv
from gateway.engine.model.kv import row_offsets
from gateway.engine.model.quant_kv import KVQuant, RowBatchQuantKVCache, RowQuantKVCache

HEADS, DIM = 2, 64


def _float(length: int, seed: int, batch: int = 1) -> mx.array:
    rng = np.random.default_rng(seed)
    return mx.array(rng.standard_normal((batch, HEADS, length, DIM)).astype(np.float32))


def _row(quant: KVQuant, length: int, delta: int, seed: int) -> RowQuantKVCache:
    cache = RowQuantKVCache(quant, delta)
    cache.update_and_fetch(_float(length, seed), _float(length, seed + 100))
    return cache


def _held(parts: tuple[mx.array, ...], end: int | None = None) -> list[np.ndarray]:
    return [np.array(p[..., :end, :]) for p in parts]


def _same(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.fixture(params=[KVQuant(8, 64), KVQuant(4, 32)], ids=lambda q: q.label)
def quant(request: pytest.FixtureRequest) -> KVQuant:
    return request.param


def test_a_position_quantizes_alone(quant: KVQuant) -> None:
    """Invariant: quantizing 40 positions at once or one at a time gives the same bits."""
    keys = _float(40, 1)
    together = mx.quantize(keys, group_size=quant.group_size, bits=quant.bits)
    cache = RowQuantKVCache(quant)
    for i in range(40):
        cache.update_and_fetch(keys[:, :, i : i + 1], keys[:, :, i : i + 1])
    assert _same(_held(together), _held(cache.keys, 40))


def test_rows_and_deltas_ride_through_batch_operations(quant: KVQuant) -> None:
    """Invariant: merge/extend/filter/extract keep each row's quantized KV (bit for bit) and
    its rope delta together."""
    a, b, c = _row(quant, 5, -3, 0), _row(quant, 2, 0, 1), _row(quant, 7, -10, 2)
    batch = RowQuantKVCache.merge([a, b])
    assert isinstance(batch, RowBatchQuantKVCache) and batch.bits == quant.bits
    batch.extend(RowQuantKVCache.merge([c]))
    assert batch.row_deltas == (-3, 0, -10)
    batch.filter([0, 2])
    assert batch.row_deltas == (-3, -10) and row_offsets(batch).tolist() == [5 - 3, 7 - 10]
    for i, row in enumerate((a, c)):
        out = batch.extract(i)
        assert isinstance(out, RowQuantKVCache) and out.rope_delta == row.rope_delta
        assert out.offset == row.offset and out.quant == quant
        assert _same(_held(out.keys), _held(row.keys, row.offset))
        assert _same(_held(out.values), _held(row.values, row.offset))


def test_a_decode_step_appends_what_each_row_appends_alone(quant: KVQuant) -> None:
    """Invariant: one token fed to the batch lands in every row as it lands in that row fed
    alone (same bits), however the rows are padded."""
    rows = [_row(quant, n, 0, seed) for seed, n in enumerate((3, 9, 1))]
    batch = RowQuantKVCache.merge(rows)
    step_k, step_v = _float(1, 50, batch=3), _float(1, 60, batch=3)
    batch.update_and_fetch(step_k, step_v)
    for i, row in enumerate(rows):
        row.update_and_fetch(step_k[i : i + 1], step_v[i : i + 1])
        out = batch.extract(i)
        assert _same(_held(out.keys), _held(row.keys, row.offset))
        assert _same(_held(out.values), _held(row.values, row.offset))


def _attend(cache: RowBatchQuantKVCache, step: tuple[mx.array, ...]) -> mx.array:
    """One decode step: the new token's keys and values appended, then its queries (two per
    KV head: grouped-query attention) attend over the cache as mlx-lm attends."""
    mask = cache.make_mask(1)  # (as a model builds it: before the layers update the cache)
    keys, values = cache.update_and_fetch(step[0], step[1])
    queries = step[2] + 0  # a copy: mlx-lm scales the queries in place
    return quantized_scaled_dot_product_attention(
        queries, keys, values, scale=DIM**-0.5, mask=mask,
        group_size=cache.group_size, bits=cache.bits,
    )  # fmt: skip


def test_a_row_attends_in_a_padded_batch_exactly_as_alone(quant: KVQuant) -> None:
    """Invariant (CPU): a decode step's quantized attention gives a row in a left-padded
    batch of longer rows the same output, bit for bit, as that row alone."""
    lengths = (4, 33, 70)
    queries = mx.array(np.random.default_rng(9).standard_normal((3, 2 * HEADS, 1, DIM)), mx.float32)
    step = (_float(1, 7, batch=3), _float(1, 8, batch=3), queries)
    together = _attend(RowQuantKVCache.merge([_row(quant, n, 0, n) for n in lengths]), step)
    for i, n in enumerate(lengths):
        alone = _attend(
            RowQuantKVCache.merge([_row(quant, n, 0, n)]), tuple(s[i : i + 1] for s in step)
        )
        assert np.array_equal(np.array(together[i : i + 1]), np.array(alone)), n


def test_right_padded_batch_prefill_lands_like_a_merge(quant: KVQuant) -> None:
    """Invariant: mlx-lm's own batch prefill (prompts right-padded, `prepare` / `finalize`
    rolling the padding to the left) leaves each row's KV where a merge of the rows puts it."""
    lengths = [3, 6]
    batch = RowBatchQuantKVCache([0, 0], quant)
    batch.prepare(lengths=lengths, right_padding=[3, 0])
    keys = mx.concatenate([_float(6, 20), _float(6, 21)])
    batch.update_and_fetch(keys, keys)
    batch.finalize()
    for i, n in enumerate(lengths):
        alone = RowQuantKVCache(quant)
        alone.update_and_fetch(keys[i : i + 1, :, :n], keys[i : i + 1, :, :n])
        assert _same(_held(batch.extract(i).keys), _held(alone.keys, n))


def test_a_cache_built_from_stored_arrays_never_writes_them(quant: KVQuant) -> None:
    """Invariant: `from_arrays` takes arrays with no spare room, so the next update
    reallocates and a stored block (another owner's arrays) keeps its bits."""
    stored = _row(quant, 8, 0, 3).snapshot()
    before = _held(stored.keys)
    cache = RowQuantKVCache.from_arrays(stored.keys, stored.values, 0, quant)
    cache.update_and_fetch(_float(4, 9), _float(4, 10))
    assert cache.offset == 12 and _same(_held(stored.keys), before)
    assert stored.used_nbytes() == sum(p.nbytes for p in (*stored.keys, *stored.values))


def test_contiguous_reads_give_the_same_attention(
    quant: KVQuant, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: where the quantized matmuls need whole contiguous operands (CUDA), the
    copies the caches hand out give the attention the bits the slices give."""
    lengths = (4, 33)
    queries = mx.array(np.random.default_rng(5).standard_normal((2, 2 * HEADS, 1, DIM)), mx.float32)
    step = (_float(1, 3, batch=2), _float(1, 4, batch=2), queries)
    outputs = []
    for contiguous in (False, True):
        monkeypatch.setattr(quant_kv, "CONTIGUOUS_READS", contiguous)
        rows = [_row(quant, n, 0, n) for n in lengths]
        outputs.append(np.array(_attend(RowQuantKVCache.merge(rows), step)))
        keys, _ = rows[0].keys_and_values()
        assert all(p.shape[2] == lengths[0] for p in keys)
    assert np.array_equal(outputs[0], outputs[1])
