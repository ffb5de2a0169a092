"""KV caches whose rows carry their own mRoPE delta.

Qwen-VL models place text after an image at `position = index + rope_delta` (the delta is
negative and fixed by every image before that text). mlx-lm's BatchGenerator calls the model
with tokens only, so the delta must ride with each row's cache through every batch operation
(merge, extend, filter, extract). Text rows have delta 0.

These subclasses change nothing else about mlx-lm's caches. `assemble` builds a request's
private cache from a prefix-cache hit's stored blocks. All owned by the engine thread; none
of their methods is thread-safe.

A layer's keys (and values) are one array, or under --kv-bits the three arrays of
`mx.quantize` (packed integers, scales, biases; `quant_kv.py`), every one laid out
(batch, heads, positions, ...): `Parts`. The helpers below slice, join and count either form
along the positions axis, so storing and restoring blocks is the same code for both.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import mlx.core as mx
from mlx_lm.models.cache import BatchKVCache, KVCache

from caches.prefix import PrefixHit

Parts = mx.array | tuple[mx.array, ...]


def map_parts(fn: Callable[[mx.array], mx.array], parts: Parts) -> Parts:
    """`fn` applied to the array, or to each array of a quantized triple."""
    return tuple(fn(p) for p in parts) if isinstance(parts, tuple) else fn(parts)


def parts_nbytes(parts: Parts) -> int:
    return sum(p.nbytes for p in parts) if isinstance(parts, tuple) else parts.nbytes


def block_nbytes(value: Sequence[tuple[Parts, Parts]]) -> int:
    """Bytes of a stored block's value: every layer's keys and values (or state snapshot)."""
    return sum(parts_nbytes(k) + parts_nbytes(v) for k, v in value)


def concat_parts(pieces: Sequence[Parts], axis: int) -> Parts:
    """Pieces of one form concatenated along `axis`, array by array."""
    if isinstance(pieces[0], tuple):
        return tuple(mx.concatenate(list(group), axis=axis) for group in zip(*pieces))
    return mx.concatenate(list(pieces), axis=axis)  # type: ignore[arg-type]


class RowKVCache(KVCache):
    """A single-sequence KV cache plus the sequence's rope delta (an int)."""

    def __init__(self, rope_delta: int = 0) -> None:
        super().__init__()
        self.rope_delta = rope_delta

    @classmethod
    def merge(cls, caches: list[KVCache]) -> RowBatchKVCache:  # type: ignore[override]
        return RowBatchKVCache.merge(caches)

    @classmethod
    def from_arrays(cls, keys: mx.array, values: mx.array, rope_delta: int) -> RowKVCache:
        """Wrap (1, heads, length, dim) arrays. They become this cache's buffer: callers pass
        arrays with no spare capacity (shape == length), so the next update reallocates and
        never writes into memory that another owner (a cache entry) still reads."""
        cache = cls(rope_delta)
        cache.keys, cache.values = keys, values
        cache.offset = keys.shape[2]
        return cache

    def empty_like(self) -> RowKVCache:
        """An empty cache of this form (no rope delta), e.g. a grouped forward's joint one."""
        return RowKVCache()

    def snapshot(self, length: int | None = None) -> RowKVCache:
        """An independent copy of the first `length` tokens (default: all), with no spare
        capacity. Used to store KV in the prefix cache."""
        n = self.offset if length is None else length
        keys = mx.contiguous(self.keys[..., :n, :])
        values = mx.contiguous(self.values[..., :n, :])
        return RowKVCache.from_arrays(keys, values, self.rope_delta)

    def used_nbytes(self) -> int:
        """Bytes of the used part (not the 256-slot buffer capacity)."""
        if self.keys is None:
            return 0
        k, v = self.keys, self.values
        per_token = (k.nbytes // k.shape[2]) + (v.nbytes // v.shape[2])
        return per_token * self.offset


class RowBatchKVCache(BatchKVCache):
    """mlx-lm's left-padded batch cache plus per-row rope deltas: a (B,) int32 array for the
    forward and the same values as a Python tuple, so reading one row's delta (`extract`, at
    every finish) never waits for the GPU: `.item()` on a lazy slice would sync the stream and
    stall behind the decode step already queued (once per layer per finished row)."""

    def __init__(self, left_padding: list[int], rope_deltas: list[int] | None = None) -> None:
        super().__init__(left_padding)
        self._set_deltas(rope_deltas if rope_deltas is not None else [0] * len(left_padding))

    def _set_deltas(self, deltas: list[int] | tuple[int, ...]) -> None:
        self.row_deltas = tuple(deltas)
        self.rope_deltas = mx.array(self.row_deltas, dtype=mx.int32)

    @classmethod
    def merge(cls, caches: list[KVCache]) -> RowBatchKVCache:  # type: ignore[override]
        merged = super().merge(caches)
        if not isinstance(merged, RowBatchKVCache):  # mlx-lm returns a plain one when all empty
            merged = cls([0] * len(caches))
        merged._set_deltas([getattr(c, "rope_delta", 0) for c in caches])
        return merged

    def filter(self, batch_indices: list[int]) -> None:
        super().filter(batch_indices)
        self._set_deltas([self.row_deltas[i] for i in batch_indices])

    def extend(self, other: RowBatchKVCache) -> None:  # type: ignore[override]
        deltas = self.row_deltas + other.row_deltas
        super().extend(other)
        self._set_deltas(deltas)

    def extract(self, idx: int) -> RowKVCache:
        plain = super().extract(idx)
        return RowKVCache.from_arrays(plain.keys, plain.values, self.row_deltas[idx])

    def bookkeeping(self) -> list[mx.array]:
        """The small per-row arrays (offsets, left padding, rope deltas) that every update,
        filter and extend rebuilds lazily from their previous value (see share_row_state)."""
        return [self.offset, self.left_padding, self.rope_deltas]


def share_row_state(layers: list[RowBatchKVCache]) -> None:
    """Point every layer's per-row offsets and rope deltas at layer 0's. Call after each
    forward pass over `layers` (one batch's caches, layer 0 first).

    Why: only layer 0's offsets feed the forward (through the positions), so only they are
    ever evaluated. mlx-lm rebuilds every layer's offsets lazily from their previous value on
    each update, filter and extend (and we do the same for rope deltas), so the other layers'
    copies grow an unevaluated graph that lives as long as the batch; under continuous load
    that is forever: a native leak that `mx.get_active_memory()` does not see (about
    0.2 MB/s on the tiny model) and a slowly decaying throughput. All layers see the same
    updates, so the values are equal; sharing them cuts the chains at no kernel cost (an
    `async_eval` of them would add launches to the GPU's per-token path). Safe because these
    two arrays are only ever rebound, never modified in place (left padding is: `+=` in
    mlx-lm's `finalize`, so it is not shared; `filter` and `extract` evaluate it anyway).
    """
    head = layers[0]
    for layer in layers[1:]:
        layer.offset = head.offset
        layer.rope_deltas = head.rope_deltas
        layer.row_deltas = head.row_deltas


def row_offsets(cache: KVCache | BatchKVCache) -> mx.array | int:
    """Rope position of every row's next token: `tokens already in its cache + rope_delta`.

    A (B,) int32 array for a batch cache (`offset` is per row and already excludes left
    padding, so a padded row's offset is negative during prefill), an int for a single cache.
    Reads only the cache it is given: pass layer 0's (see share_row_state).
    """
    if isinstance(cache, RowBatchKVCache):
        return cache.offset.astype(mx.int32) + cache.rope_deltas
    return cache.offset + getattr(cache, "rope_delta", 0)


def row_positions(cache: KVCache | BatchKVCache, length: int) -> mx.array:
    """Text positions for the next `length` tokens of every row: (B, length) int32
    (B = 1 for a single cache): `row_offsets(cache)[b] + j`."""
    return offset_positions(row_offsets(cache), length)


def offset_positions(offsets: mx.array | int, length: int) -> mx.array:
    """(B, length) int32 positions `offsets[b] + j` from per-row offsets ((B,) array or int;
    an int gives B = 1)."""
    steps = mx.arange(length, dtype=mx.int32)[None, :]
    if isinstance(offsets, mx.array):
        return offsets.astype(mx.int32).reshape(-1, 1) + steps
    return steps + offsets


def assemble(
    hit: PrefixHit, rope_delta: int, room: int = 0, empty: list[RowKVCache] | None = None
) -> list[RowKVCache]:
    """A private cache over the hit's first `hit.tokens` tokens: each layer's blocks copied
    into one new buffer with `room` free rows after them, so the prefill of the rest writes in
    place (one copy of the prefix, as the old snapshot fork's first update made) and never
    into a stored block. The batch's merge copies again anyway. `empty`: the family's own
    empty per-layer caches (`new_cache()`, which may be `RowKVCache` subclasses) to fill;
    default plain `RowKVCache`s."""
    out = []
    layers = empty if empty is not None else [RowKVCache(rope_delta) for _ in hit.blocks[0]]
    for layer, cache in zip(zip(*hit.blocks), layers, strict=True):
        restore = getattr(cache, "restore_blocks", None)  # a recurrent layer's snapshots
        if restore is not None:
            restore(layer, hit.tokens)
            out.append(cache)
            continue
        cache.keys = _join_parts([k for k, _ in layer], hit.tokens, room)
        cache.values = _join_parts([v for _, v in layer], hit.tokens, room)
        cache.rope_delta = rope_delta
        cache.offset = hit.tokens
        out.append(cache)
    mx.eval([c.state for c in out])
    return out


def _join_parts(blocks: list[Parts], tokens: int, room: int) -> Parts:
    """`_join` of each array of the blocks' form (one array, or a quantized triple)."""
    if isinstance(blocks[0], tuple):
        return tuple(_join(list(arrays), tokens, room) for arrays in zip(*blocks))
    return _join(blocks, tokens, room)  # type: ignore[arg-type]


def _join(blocks: list[mx.array], tokens: int, room: int) -> mx.array:
    """(1, heads, tokens + room, dim): the blocks cut to `tokens` rows, then `room` zeros.
    With no room and one block this is the stored array itself (or a view of it): its shape
    equals the cache's length, so the next update reallocates instead of writing into it."""
    extra = sum(b.shape[2] for b in blocks) - tokens
    parts = [*blocks[:-1], blocks[-1][..., : blocks[-1].shape[2] - extra, :]]
    if room > 0:
        head = parts[0]
        parts.append(mx.zeros((*head.shape[:2], room, head.shape[3]), dtype=head.dtype))
    return parts[0] if len(parts) == 1 else mx.concatenate(parts, axis=2)
