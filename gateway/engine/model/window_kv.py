"""KV caches for sliding-window attention layers that stay trimmable and exact.

A sliding-window layer attends to the last `window` positions. mlx-vlm keeps such a layer in a
`RotatingKVCache`: a ring buffer of `window` slots that, once it wraps, cannot be cut back
to an earlier length (the overwritten keys are gone), so a prefix cache could only restore it
from snapshots. Here the layer keeps every position's KV instead (a plain, trimmable
`RowKVCache`: blocks are stored, restored, merged and filtered exactly like a full-attention
layer's) and attention reads the window out of it:

- a forward of several rows (a prefill block) sees all cached keys in temporal order under a
  causal window mask: what mlx-vlm's `RotatingKVCache` gives a prompt chunk (it too keeps
  every key of the chunk, in temporal order, under the same mask); masked keys contribute
  exact zeros, so the extra ones change no bit (CPU: tested);
- a one-row forward (the prompt's last token, every decode step) sees the window's `window`
  keys in the order of mlx-vlm's ring buffer, because the order of the terms of the
  attention's sums changes the last bits. After a prompt whose last token sits at position P,
  the ring's slot s holds the position x with `(x - phase) % window == s`, `phase` = P if
  P >= window else 0 (the buffer rotates to slot 0 on the first one-row update after it is
  full). Each row carries its phase, set by the family when it feeds the prompt's last token.

Memory: every position's KV is kept (as for a full-attention layer) rather than `window` of
them; the price of exact, trimmable reuse. Engine thread only; nothing here is thread-safe.

Speed: every sliding layer of a batch reads the same ring slots (the rows' offsets, left
padding and phases are the same in all of them), so a decode step computes the gather index
once (`shared_ring`) rather than once per layer: on a GPU each of those dozen small ops per
layer is a kernel launch (Gemma 3 4B has 29 sliding layers).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import mlx.core as mx
from mlx_lm.models.cache import KVCache, create_causal_mask

from gateway.engine.model.kv import RowBatchKVCache, RowKVCache


def ring_phase(last_position: int, window: int) -> int:
    """The phase of mlx-vlm's ring buffer after a prompt whose last token sits at
    `last_position` (module doc)."""
    return last_position % window if last_position >= window else 0


def ring_positions(query: mx.array, phase: mx.array, window: int) -> mx.array:
    """(B, window) positions in ring-slot order for one query per row at positions
    `query` (B,) with ring phases `phase` (B,): slot s holds `query - ((query - phase - s) %
    window)`; negative where the row has fewer than `window` positions (masked)."""
    slots = mx.arange(window, dtype=mx.int32)[None, :]
    q, p = query.astype(mx.int32)[:, None], phase.astype(mx.int32)[:, None]
    return q - mx.remainder(q - p - slots, window)


def _gather(buffer: mx.array, index: mx.array) -> mx.array:
    """Slots `index` (B, W) of each row of a (B, heads, S, dim) KV buffer (a cache's whole,
    contiguous allocation), as (B, heads, W, dim)."""
    return _take(buffer, _flat_rows(index, buffer))


def _flat_rows(index: mx.array, buffer: mx.array) -> mx.array:
    """`index` (B, W) as row numbers of `buffer` viewed as (B * heads * S, dim)."""
    b, heads, size, _ = buffer.shape
    base = (mx.arange(b * heads, dtype=mx.int32) * size).reshape(b, heads, 1)
    return (base + index[:, None, :]).reshape(-1)


def _take(buffer: mx.array, rows: mx.array) -> mx.array:
    """Whole `dim`-long rows of `buffer` (B, heads, S, dim), by flat row number: one gather of
    contiguous rows (an element-wise `take_along_axis` over a broadcast index cost the H200
    17 ms a step at 16 rows, Gemma 3 4B shapes: docs/investigations/window_step.py)."""
    b, heads, size, dim = buffer.shape
    flat = mx.take(buffer.reshape(b * heads * size, dim), rows, axis=0)
    return flat.reshape(b, heads, -1, dim)


class WindowKVCache(RowKVCache):
    """One sequence's sliding-window layer: all of its KV, read as mlx-vlm's ring (module doc).
    `phase` is set when the prompt's last token is fed (`ring_phase`)."""

    def __init__(self, window: int, rope_delta: int = 0, phase: int = 0) -> None:
        super().__init__(rope_delta)
        self.window = window
        self.phase = phase

    @classmethod
    def merge(cls, caches: list[KVCache]) -> WindowBatchKVCache:  # type: ignore[override]
        return WindowBatchKVCache.merge(caches)

    def snapshot(self, length: int | None = None) -> WindowKVCache:
        plain = super().snapshot(length)
        out = WindowKVCache(self.window, self.rope_delta, self.phase)
        out.keys, out.values, out.offset = plain.keys, plain.values, plain.offset
        return out

    ring: _Ring | None = None  # as `WindowBatchKVCache.ring`

    def _ring_index(self, query: int) -> tuple[mx.array, mx.array]:
        """The ring slots for a query at position `query`: buffer indices and validity."""
        positions = ring_positions(mx.array([query]), mx.array([self.phase]), self.window)
        return mx.maximum(positions, 0), positions >= 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        all_keys, all_values = super().update_and_fetch(keys, values)
        if keys.shape[2] != 1:
            return all_keys, all_values
        if self.ring is not None:
            return self.ring.gather(self.keys), self.ring.gather(self.values)
        index, _ = self._ring_index(self.offset - 1)
        return _gather(self.keys, index), _gather(self.values, index)

    def make_mask(self, N: int, window_size: int | None = None, **_: Any) -> Any:  # noqa: N803
        """Rows >1: causal window mask over all cached keys; one row: which ring slots hold a
        position (None when all do, as mlx-vlm's full ring needs none)."""
        if N > 1:
            return create_causal_mask(N, self.offset, window_size=self.window)
        if self.offset + 1 >= self.window:
            return None
        valid = self.ring.valid if self.ring is not None else self._ring_index(self.offset)[1]
        return valid[:, None, None, :]


class WindowBatchKVCache(RowBatchKVCache):
    """mlx-lm's left-padded batch cache for a sliding-window layer: per-row phases, and
    one-row updates read each row's window in its ring order (module doc)."""

    window: int = 0
    # The gather index of the one-row forward running now, shared by the batch's sliding
    # layers (`shared_ring`); None: each layer computes its own.
    ring: _Ring | None = None

    def __init__(
        self,
        left_padding: list[int],
        rope_deltas: list[int] | None = None,
        phases: list[int] | None = None,
    ) -> None:
        super().__init__(left_padding, rope_deltas)
        self._set_phases(phases if phases is not None else [0] * len(left_padding))

    def _set_phases(self, phases: list[int] | tuple[int, ...]) -> None:
        self.row_phases = tuple(phases)
        self.phases = mx.array(self.row_phases, dtype=mx.int32)

    @classmethod
    def merge(cls, caches: list[KVCache]) -> WindowBatchKVCache:  # type: ignore[override]
        merged = super().merge(caches)
        if not isinstance(merged, WindowBatchKVCache):
            merged = cls([0] * len(caches), [getattr(c, "rope_delta", 0) for c in caches])
        merged.window = caches[0].window  # type: ignore[attr-defined]
        merged._set_phases([c.phase for c in caches])  # type: ignore[attr-defined]
        return merged

    def filter(self, batch_indices: list[int]) -> None:
        super().filter(batch_indices)
        self._set_phases([self.row_phases[i] for i in batch_indices])

    def extend(self, other: RowBatchKVCache) -> None:  # type: ignore[override]
        phases = self.row_phases + other.row_phases  # type: ignore[attr-defined]
        super().extend(other)
        self._set_phases(phases)

    def extract(self, idx: int) -> WindowKVCache:
        plain = super().extract(idx)
        out = WindowKVCache(self.window, plain.rope_delta, self.row_phases[idx])
        out.keys, out.values, out.offset = plain.keys, plain.values, plain.offset
        return out

    def _ring_index(self, query: mx.array) -> tuple[mx.array, mx.array]:
        """Each row's ring positions for queries at `query` (B,), as buffer indices (clamped
        into the row) and whether each slot holds a position."""
        positions = ring_positions(query, self.phases, self.window)
        valid = positions >= 0
        index = self.left_padding.astype(mx.int32)[:, None] + mx.maximum(positions, 0)
        return index, valid

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        all_keys, all_values = super().update_and_fetch(keys, values)
        if keys.shape[2] != 1:
            return all_keys, all_values
        if self.ring is not None:
            return self.ring.gather(self.keys), self.ring.gather(self.values)
        index, _ = self._ring_index(self.offset - 1)
        return _gather(self.keys, index), _gather(self.values, index)

    def make_mask(self, N: int, window_size: int | None = None, **kwargs: Any) -> Any:  # noqa: N803
        if N == 1 and self.ring is not None:
            return self.ring.valid[:, None, None, :]
        if N > 1:
            return super().make_mask(N, window_size=self.window, **kwargs)
        _, valid = self._ring_index(self.offset)
        return valid[:, None, None, :]

    def bookkeeping(self) -> list[mx.array]:
        return [*super().bookkeeping(), self.phases]


class _Ring:
    """One one-row forward's ring slots for a batch: the gather index (B, W) into each
    sliding layer's buffer, whether each slot holds a position, and the index as flat row
    numbers of each buffer shape the layers gather from (made once per shape)."""

    def __init__(self, index: mx.array, valid: mx.array) -> None:
        self.index, self.valid = index, valid
        self._rows: dict[tuple[int, ...], mx.array] = {}

    def gather(self, buffer: mx.array) -> mx.array:
        shape = tuple(buffer.shape[:3])
        rows = self._rows.get(shape)
        if rows is None:
            rows = self._rows[shape] = _flat_rows(self.index, buffer)
        return _take(buffer, rows)


@contextmanager
def shared_ring(layers: Sequence[Any], rows: int) -> Iterator[None]:
    """Around a forward of `rows` query rows over one sequence's or one batch's caches: when
    it is a one-row step, its sliding layers share one gather index and mask (module doc:
    computed once from the first sliding layer, whose offsets, left padding and phases all
    of them share)."""
    sliding = [c for c in layers if isinstance(c, (WindowKVCache, WindowBatchKVCache))]
    if rows != 1 or not sliding:
        yield
        return
    # The query sits at the offset before the step's update (`update_and_fetch` reads it
    # after, as offset - 1).
    ring = _Ring(*sliding[0]._ring_index(sliding[0].offset))
    for layer in sliding:
        layer.ring = ring
    try:
        yield
    finally:
        for layer in sliding:
            layer.ring = None


def layer_caches(sliding: list[bool], window: int, rope_delta: int = 0) -> list[RowKVCache]:
    """One empty cache per KV-owning layer of a model with sliding and global layers: a
    `WindowKVCache` of `window` for each sliding one, a plain `RowKVCache` for each global."""
    return [
        WindowKVCache(window, rope_delta) if slides else RowKVCache(rope_delta)
        for slides in sliding
    ]
