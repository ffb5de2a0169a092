"""WindowKVCache (engine/model/window_kv.py): a sliding-window layer kept whole, read as
mlx-vlm's RotatingKVCache reads it.

Pinned: after a prompt chunk and its last token fed alone (as mlx-vlm's generate feeds
them), every one-row step sees exactly the keys and values of mlx-vlm's ring, in its slot
order, for prompts shorter and longer than the window; a batch of rows with different
phases and left padding gives each row's attention bit for bit, and so does the gather
index computed once for all sliding layers of a step (`shared_ring`); the ring order matters
(temporal order changes the attention's last bits, which is why it is kept).
"""

from __future__ import annotations

import mlx.core as mx
import pytest
from mlx_vlm.models.cache import RotatingKVCache

from gateway.engine.model.window_kv import (
    WindowBatchKVCache,
    WindowKVCache,
    ring_phase,
    shared_ring,
)

WINDOW, HEADS, DIM = 8, 2, 4


def _kv(n: int, seed: int) -> tuple[mx.array, mx.array]:
    key = mx.random.key(seed)
    k1, k2 = mx.random.split(key)
    return mx.random.normal((1, HEADS, n, DIM), key=k1), mx.random.normal(
        (1, HEADS, n, DIM), key=k2
    )


def _fill(prompt: int, steps: int, seed: int = 0) -> tuple[WindowKVCache, list, list]:
    """Feed a prompt (chunk + last token alone) and `steps` one-row steps into both caches;
    returns ours and, per one-row step, (ours, mlx-vlm's) fetched keys/values."""
    ours, ring = WindowKVCache(WINDOW), RotatingKVCache(max_size=WINDOW)
    keys, values = _kv(prompt + steps, seed)
    ours.update_and_fetch(keys[:, :, : prompt - 1], values[:, :, : prompt - 1])
    ring.update_and_fetch(keys[:, :, : prompt - 1], values[:, :, : prompt - 1])
    ours.phase = ring_phase(ours.offset, WINDOW)
    fetched_ours, fetched_ring = [], []
    for i in range(prompt - 1, prompt + steps):
        one = (keys[:, :, i : i + 1], values[:, :, i : i + 1])
        # (copies: mlx-vlm's ring writes the next step into the arrays it returned)
        fetched_ours.append(tuple(mx.array(a) for a in ours.update_and_fetch(*one)))
        fetched_ring.append(tuple(mx.array(a) for a in ring.update_and_fetch(*one)))
        mx.eval(fetched_ours[-1], fetched_ring[-1])
    return ours, fetched_ours, fetched_ring


@pytest.mark.parametrize("prompt", [3, WINDOW - 1, WINDOW, WINDOW + 1, 3 * WINDOW + 5])
def test_one_row_steps_read_mlx_vlms_ring_in_its_order(prompt: int) -> None:
    """Invariant: each one-row fetch equals mlx-vlm's ring (same keys, same order) whenever the
    ring is full; before that, the valid slots are the ring's keys in order."""
    _, ours, ring = _fill(prompt, steps=2 * WINDOW + 3)
    for (k, v), (rk, rv) in zip(ours, ring, strict=True):
        n = rk.shape[2]
        assert mx.array_equal(k[:, :, :n], rk).item() and mx.array_equal(v[:, :, :n], rv).item()


def test_batch_rows_attend_as_alone() -> None:
    """Invariant: merged rows (different lengths, phases, left padding) give each row the
    attention output it has alone, bit for bit."""
    rows = [_fill(p, steps=1, seed=p)[0] for p in (5, 20, 31)]
    q = mx.random.normal((len(rows), 4, 1, DIM), key=mx.random.key(9))
    k_new, v_new = _kv(1, 7)
    alone = []
    for i, row in enumerate(rows):
        single = row.snapshot()
        mask = single.make_mask(1)
        k, v = single.update_and_fetch(k_new, v_new)
        alone.append(mx.fast.scaled_dot_product_attention(q[i : i + 1], k, v, scale=0.5, mask=mask))
    batch = WindowKVCache.merge(rows)
    assert isinstance(batch, WindowBatchKVCache)
    mask = batch.make_mask(1)
    k, v = batch.update_and_fetch(mx.concatenate([k_new] * 3), mx.concatenate([v_new] * 3))
    together = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5, mask=mask)
    for i, out in enumerate(alone):
        assert mx.array_equal(together[i : i + 1], out).item()
    extracted = batch.extract(1)
    assert isinstance(extracted, WindowKVCache) and extracted.phase == rows[1].phase


def test_a_shared_ring_index_reads_what_each_layer_reads_alone() -> None:
    """Invariant: one step's gather index and mask computed once (`shared_ring`, from the
    first sliding layer) give every sliding layer of the batch the keys, values and mask it
    computes alone, bit for bit; outside the context each layer computes its own again."""

    def batch() -> list[WindowBatchKVCache]:
        layers = []
        for layer in range(3):
            rows = [_fill(p, steps=1, seed=p + 100 * layer)[0] for p in (5, 20, 31)]
            layers.append(WindowKVCache.merge(rows))
        return layers

    k_new, v_new = _kv(1, 7)
    k_new, v_new = mx.concatenate([k_new] * 3), mx.concatenate([v_new] * 3)
    alone = [(c.make_mask(1), *c.update_and_fetch(k_new, v_new)) for c in batch()]
    shared_layers = batch()
    with shared_ring(shared_layers, rows=1):
        assert shared_layers[0].ring is not None
        shared = [(c.make_mask(1), *c.update_and_fetch(k_new, v_new)) for c in shared_layers]
    assert all(c.ring is None for c in shared_layers)
    for mine, theirs in zip(shared, alone, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert mx.array_equal(a, b).item()


@pytest.mark.parametrize("prompt", [5, WINDOW + 3])
def test_a_shared_ring_index_serves_one_sequence_too(prompt: int) -> None:
    """Invariant: the same for one sequence's layers (a prompt's last token fed alone)."""
    layers = [_fill(prompt, steps=0, seed=s)[0] for s in range(3)]
    twins = [c.snapshot() for c in layers]
    k_new, v_new = _kv(1, 7)

    def read(c: WindowKVCache) -> list:
        mask = c.make_mask(1)
        return [mask, *c.update_and_fetch(k_new, v_new)]

    alone = [read(c) for c in layers]
    with shared_ring(twins, rows=1):
        shared = [read(c) for c in twins]
    for mine, theirs in zip(shared, alone, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert (a is None and b is None) or mx.array_equal(a, b).item()


def test_ring_order_is_part_of_the_numerics() -> None:
    """Invariant (why the order is kept): the same window in another order gives another
    attention output in the last bits for some query (CPU sums in slot order)."""
    differs = False
    for seed in range(20):
        ours = _fill(3 * WINDOW + 5, steps=1, seed=seed)[1][-1]
        k, v = ours
        q = mx.random.normal((1, 4, 1, DIM), key=mx.random.key(seed))
        order = mx.argsort(mx.random.uniform(shape=(WINDOW,), key=mx.random.key(seed + 1)))
        ring = mx.fast.scaled_dot_product_attention(q, k, v, scale=0.5)
        shuffled = mx.fast.scaled_dot_product_attention(
            q, k[:, :, order], v[:, :, order], scale=0.5
        )
        differs |= not mx.array_equal(ring, shuffled).item()
    assert differs
