"""Invariants of the recurrent-state row caches (engine/model/state_cache.py) and the block
values built over them (engine/model/snapshots.py, kv.assemble), on small random arrays:
a state is never trimmed; a mark shares the state it names; a prefix hit restores its last
block's snapshot and joins the KV blocks; the batch's merge, filter, extend and extract keep
every row's state, offset and rope delta row for row; a block is stored only where every
recurrent layer has a mark at its end."""

from __future__ import annotations

import mlx.core as mx
import pytest

from caches.prefix import PrefixHit
from gateway.engine.model.kv import RowKVCache, assemble
from gateway.engine.model.snapshots import (
    drop_marks,
    layer_block,
    snapshot_nbytes,
    state_layers,
    storable,
)
from gateway.engine.model.state_cache import BatchStateCache, RowStateCache

B = 4  # block tokens


def _state(seed: int, offset: int, delta: int = 0) -> RowStateCache:
    mx.random.seed(seed)
    c = RowStateCache(2, delta)
    c.cache = [mx.random.normal((1, 3, 8)), mx.random.normal((1, 2, 4, 4))]
    c.offset = offset
    return c


def _kv(seed: int, tokens: int) -> RowKVCache:
    mx.random.seed(seed)
    shape = (1, 2, tokens, 4)
    return RowKVCache.from_arrays(mx.random.normal(shape), mx.random.normal(shape), 0)


def _equal(a: mx.array, b: mx.array) -> bool:
    return a.shape == b.shape and bool(mx.array_equal(a, b).item())


def test_a_state_cannot_be_trimmed() -> None:
    c = _state(0, 8)
    assert c.trim(0) == 0 and not c.is_trimmable()
    with pytest.raises(ValueError):
        c.trim(1)


def test_a_mark_shares_the_state_at_its_offset_and_advance_moves_the_offset() -> None:
    c = _state(0, 8)
    c.mark()
    assert c.marks[8][0] is c.cache[0] and c.marks[8][1] is c.cache[1]
    c.advance(3)
    assert c.offset == 11 and set(c.marks) == {8}
    assert RowStateCache().marks == {} and (RowStateCache().mark() is None)


def test_a_hit_restores_its_last_blocks_snapshot_and_joins_the_kv() -> None:
    """Invariant: `assemble` over a hybrid hit gives the KV layer the blocks' rows in order
    and the state layer its last block's snapshot (shared), marking every block end."""
    states = [_state(k, (k + 1) * B) for k in range(2)]
    kvs = [_kv(10 + k, B) for k in range(2)]
    snaps = [(s.cache[0], s.cache[1]) for s in states]
    values = tuple(((kv.keys, kv.values), snap) for kv, snap in zip(kvs, snaps))
    hit = PrefixHit(values, 2 * B, 0, True)
    kv_layer, state_layer = assemble(hit, 0, 2, [RowKVCache(), RowStateCache()])
    assert kv_layer.offset == 2 * B and state_layer.offset == 2 * B
    assert _equal(kv_layer.keys[..., :B, :], kvs[0].keys)
    assert _equal(kv_layer.keys[..., B : 2 * B, :], kvs[1].keys)
    assert state_layer.cache[1] is states[1].cache[1]
    assert set(state_layer.marks) == {B, 2 * B}
    with pytest.raises(ValueError):
        RowStateCache().restore_blocks(snaps, 2 * B + 1)  # not at a block end


def test_the_batch_keeps_every_row_row_for_row() -> None:
    """Invariant: merge stacks rows in order; filter, extend and extract keep each row's
    arrays, offset and rope delta (a row's state never mixes with its neighbours')."""
    rows = [_state(k, 10 + k, delta=-k) for k in range(3)]
    batch = RowStateCache.merge(rows)
    assert isinstance(batch, BatchStateCache) and batch.cache[1].shape[0] == 3
    batch.advance(1)
    batch.filter([2, 0])
    batch.extend(RowStateCache.merge([rows[1]]))
    order = [2, 0, 1]
    for i, k in enumerate(order):
        row = batch.extract(i)
        assert all(_equal(a, b) for a, b in zip(row.cache, rows[k].cache))
        assert (row.offset, row.rope_delta) == (10 + k + (k != 1), -k)
    with pytest.raises(ValueError):
        RowStateCache.merge([RowStateCache()])  # joined before its prompt set a state


def test_a_block_is_stored_only_where_every_state_layer_has_a_mark() -> None:
    kv, first, second = _kv(0, 3 * B), _state(1, B), _state(2, B)
    for c in (first, second):
        c.mark()
        c.offset = 2 * B
        c.mark()
    first.offset = 3 * B
    first.mark()  # the second layer has no mark at 3 * B
    layers = [kv, first, second]
    assert state_layers(layers) == (1, 2)
    assert storable(layers, B, 3 * B) == 2 * B
    assert storable([kv], B, 3 * B) == 3 * B  # KV only: the caller's length
    value = [layer_block(c, B, 2 * B) for c in layers]
    assert _equal(value[0][0], kv.keys[..., B : 2 * B, :])
    assert value[1][1] is first.marks[2 * B][1]
    assert snapshot_nbytes(value, layers) == 2 * sum(a.nbytes for a in first.marks[2 * B])
    drop_marks(layers)
    assert first.marks == {} and storable(layers, B, 3 * B) == 0


def test_a_snapshot_is_the_state_for_another_row_without_marks() -> None:
    """Invariant: a forked row (n > 1 choices) starts from the same state, offset and rope
    delta, keeps its class, carries no marks, and a forward replacing its arrays leaves the
    source untouched; a copy at a shorter prefix is refused."""
    c = _state(1, 7, delta=-3)
    c.mark()
    copy = c.snapshot()
    assert type(copy) is RowStateCache and (copy.offset, copy.rope_delta) == (7, -3)
    assert all(a is b for a, b in zip(copy.cache, c.cache, strict=True))
    assert copy.marks == {} and 7 in c.marks
    copy[0] = mx.zeros((1, 3, 8))
    assert not mx.array_equal(c.cache[0], copy.cache[0]).item()
    assert c.snapshot(7).offset == 7
    with pytest.raises(ValueError):
        c.snapshot(6)
