"""Quantized KV caches (--kv-bits 8 | 4): keys and values held as `bits`-bit integers with a
scale and a bias per `group_size` channels of each position's head vector (`mx.quantize`),
read by attention through quantized matmuls (mlx-lm's and mlx-vlm's
`quantized_scaled_dot_product_attention`, chosen by the cache's `bits` attribute).

Why a hit stays exact: `mx.quantize` groups channels of one position only, so a position's
quantized KV depends on its float KV alone, never on how many positions were quantized
together. A block's float KV is computed by the same forward whether the request is cached
or not (the exact-reuse rule), over the same quantized earlier blocks; so the stored block is
the block an uncached request quantizes, bit for bit, and everything after it follows.

`RowQuantKVCache` is mlx-lm's single-sequence `QuantizedKVCache` plus the row's rope delta
(as `kv.RowKVCache`); `RowBatchQuantKVCache` is the decode batch's left-padded form (mlx-lm
0.32 has none; mlx-vlm's updates its offsets in place, which `kv.share_row_state` forbids),
with `kv.RowBatchKVCache`'s per-row deltas and bookkeeping. Each part of a triple keeps
positions on axis 2, so padding, filtering and extracting rows is `BatchKVCache`'s logic
applied to each array. Padded positions hold zeros: scale and bias 0 dequantize to exactly 0,
and the mask gives them zero weight.

Engine thread only, like every cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import mlx.core as mx
from mlx_lm.models.cache import QuantizedKVCache, dynamic_roll

from gateway.engine.model.kv import RowBatchKVCache, concat_parts, map_parts, parts_nbytes

Triple = tuple[mx.array, mx.array, mx.array]  # packed integers, scales, biases


def _on_cuda() -> bool:
    return mx.default_device().type == mx.DeviceType.gpu and not mx.metal.is_available()


# MLX's CUDA quantized matmuls (0.32) take only a whole-array row-contiguous quantized operand
# (`is_last_2_dims_row_contiguous` checks the array's `contiguous` flag): the cache's slice of
# its buffer (positions [0, offset) of a 256-step buffer) is not one, and the matmul raises
# "No implementation for problem shape". There the held positions are copied into one
# contiguous array per read (bytes read and written again each step: the price of the
# format on CUDA until MLX reads strided operands); Metal and CPU read the slice in place.
CONTIGUOUS_READS = _on_cuda()


def readable(parts: Triple) -> Triple:
    """`parts` as the quantized matmuls on this device can read them (module constant)."""
    if not CONTIGUOUS_READS:
        return parts
    return tuple(mx.contiguous(p) for p in parts)  # type: ignore[return-value]


@dataclass(frozen=True)
class KVQuant:
    """How KV is quantized: `bits` per value, one scale and bias per `group_size` channels."""

    bits: int
    group_size: int

    @property
    def label(self) -> str:
        """Short name (disk namespaces, log lines): `q8g64`."""
        return f"q{self.bits}g{self.group_size}"


class RowQuantKVCache(QuantizedKVCache):
    """A single-sequence quantized KV cache plus the sequence's rope delta (an int)."""

    def __init__(self, quant: KVQuant, rope_delta: int = 0) -> None:
        super().__init__(group_size=quant.group_size, bits=quant.bits)
        self.rope_delta = rope_delta

    @property
    def quant(self) -> KVQuant:
        return KVQuant(self.bits, self.group_size)

    @classmethod
    def merge(cls, caches: list[RowQuantKVCache]) -> RowBatchQuantKVCache:  # type: ignore[override]
        return RowBatchQuantKVCache.merge(caches)

    @classmethod
    def from_arrays(
        cls, keys: Triple, values: Triple, rope_delta: int, quant: KVQuant
    ) -> RowQuantKVCache:
        """Wrap triples of (1, heads, length, ...) arrays with no spare capacity, so the next
        update reallocates and never writes into arrays another owner reads (as
        `RowKVCache.from_arrays`)."""
        cache = cls(quant, rope_delta)
        cache.keys, cache.values = tuple(keys), tuple(values)
        cache.offset = keys[0].shape[2]
        return cache

    def size(self) -> int:
        return self.offset

    def keys_and_values(self) -> tuple[Triple, Triple]:
        keys, values = super().keys_and_values()
        return readable(keys), readable(values)

    def empty_like(self) -> RowQuantKVCache:
        return RowQuantKVCache(self.quant)

    def snapshot(self, length: int | None = None) -> RowQuantKVCache:
        """An independent copy of the first `length` positions (default: all)."""
        n = self.offset if length is None else length
        keys = map_parts(lambda p: mx.contiguous(p[..., :n, :]), self.keys)
        values = map_parts(lambda p: mx.contiguous(p[..., :n, :]), self.values)
        return RowQuantKVCache.from_arrays(keys, values, self.rope_delta, self.quant)  # type: ignore[arg-type]

    def used_nbytes(self) -> int:
        """Bytes of the used positions (not the 256-slot buffer capacity)."""
        if self.keys is None:
            return 0
        per_token = sum(p.nbytes // p.shape[2] for p in (*self.keys, *self.values))
        return per_token * self.offset


def _blank(like: mx.array, batch: int, length: int) -> mx.array:
    """Zeros shaped like `like` with `batch` rows and `length` positions."""
    return mx.zeros((batch, like.shape[1], length, like.shape[3]), dtype=like.dtype)


class RowBatchQuantKVCache(RowBatchKVCache):
    """The left-padded batch form of `RowQuantKVCache` (module doc); `bits` and `group_size`
    select the quantized attention. Offsets are rebound, never updated in place."""

    def __init__(
        self, left_padding: list[int], quant: KVQuant, rope_deltas: list[int] | None = None
    ) -> None:
        super().__init__(left_padding, rope_deltas)
        self.bits, self.group_size = quant.bits, quant.group_size

    @property
    def quant(self) -> KVQuant:
        return KVQuant(self.bits, self.group_size)

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[Triple, Triple]:
        prev, n = self._idx, keys.shape[2]
        if self.keys is None or prev + n > self.keys[0].shape[2]:
            self._grow(keys, values, n)
        self.offset = self.offset + n
        self._idx += n
        for held, new in ((self.keys, keys), (self.values, values)):
            quantized = mx.quantize(new, group_size=self.group_size, bits=self.bits)
            for part, rows in zip(held, quantized, strict=True):
                part[..., prev : self._idx, :] = rows
        return self.keys_and_values()

    def _grow(self, keys: mx.array, values: mx.array, n: int) -> None:
        """Room for `n` more positions, in whole steps (as BatchKVCache)."""
        batch, heads = keys.shape[:2]
        steps = (self.step + n - 1) // self.step * self.step

        def fresh(dim: int, dtype: mx.Dtype) -> Triple:
            shape = (batch, heads, steps)
            return (
                mx.zeros((*shape, dim * self.bits // 32), dtype=mx.uint32),
                mx.zeros((*shape, dim // self.group_size), dtype=dtype),
                mx.zeros((*shape, dim // self.group_size), dtype=dtype),
            )

        new_k, new_v = fresh(keys.shape[3], keys.dtype), fresh(values.shape[3], values.dtype)
        if self.keys is None:
            self.keys, self.values = new_k, new_v
            return
        prev = self._idx
        if prev % self.step != 0:
            self.keys = map_parts(lambda p: p[..., :prev, :], self.keys)
            self.values = map_parts(lambda p: p[..., :prev, :], self.values)
        self.keys = concat_parts([self.keys, new_k], axis=2)
        self.values = concat_parts([self.values, new_v], axis=2)

    def keys_and_values(self) -> tuple[Triple, Triple]:
        idx = self._idx
        return (
            readable(map_parts(lambda p: p[..., :idx, :], self.keys)),  # type: ignore[arg-type]
            readable(map_parts(lambda p: p[..., :idx, :], self.values)),  # type: ignore[arg-type]
        )

    def finalize(self) -> None:
        if self._right_padding is not None:
            shift = self._right_padding[:, None]
            self.keys = map_parts(lambda p: dynamic_roll(p, shift, axis=2), self.keys)
            self.values = map_parts(lambda p: dynamic_roll(p, shift, axis=2), self.values)
            self.offset = self.offset - self._right_padding
            self.left_padding = self.left_padding + self._right_padding
            self._right_padding = None

    def filter(self, batch_indices: list[int]) -> None:
        """Keep the given rows; drop the left padding they all share (BatchKVCache.filter)."""
        if self.keys is not None:
            self.keys = map_parts(lambda p: p[batch_indices], self.keys)
            self.values = map_parts(lambda p: p[batch_indices], self.values)
        self.offset = self.offset[batch_indices]
        self.left_padding = self.left_padding[batch_indices]
        shared = min(self.left_padding.tolist())
        if shared > 0:
            if self.keys is not None:
                self.keys = map_parts(lambda p: p[..., shared:, :], self.keys)
                self.values = map_parts(lambda p: p[..., shared:, :], self.values)
            self._idx -= shared
            self.left_padding = self.left_padding - shared
        self._set_deltas([self.row_deltas[i] for i in batch_indices])

    def extend(self, other: RowBatchQuantKVCache) -> None:  # type: ignore[override]
        """Append `other`'s rows, both right-aligned at the longer one's index."""
        deltas = self.row_deltas + other.row_deltas
        if self.keys is None and other.keys is None:
            self.left_padding = mx.concatenate([self.left_padding, other.left_padding])
            self.offset = mx.concatenate([self.offset, other.offset])
            self._set_deltas(deltas)
            return
        idx = max(self._idx, other._idx)
        size = max(c.keys[0].shape[2] for c in (self, other) if c.keys is not None)
        ref = self if self.keys is not None else other
        padded = [self._aligned(c, ref, idx, size) for c in (self, other)]
        self.keys = concat_parts([p[0] for p in padded], axis=0)
        self.values = concat_parts([p[1] for p in padded], axis=0)
        self.left_padding = mx.concatenate([p[2] for p in padded])
        self.offset = mx.concatenate([self.offset, other.offset])
        self._idx = idx
        self._set_deltas(deltas)

    @staticmethod
    def _aligned(
        c: RowBatchQuantKVCache, ref: RowBatchQuantKVCache, idx: int, size: int
    ) -> tuple[Triple, Triple, mx.array]:
        """`c`'s parts padded so its index sits at `idx` in `size` positions, and its left
        padding after that (BatchKVCache.extend's `pad`)."""
        rows = c.offset.shape[0]
        keys = c.keys if c.keys is not None else map_parts(lambda p: _blank(p, rows, 0), ref.keys)
        values = c.values if c.values is not None else map_parts(
            lambda p: _blank(p, rows, 0), ref.values
        )  # fmt: skip
        left = idx - c._idx
        right = size - keys[0].shape[2] - left
        if right < 0:
            keys = map_parts(lambda p: p[..., :right, :], keys)
            values = map_parts(lambda p: p[..., :right, :], values)
            right = 0
        if left or right:
            pad = [(0, 0), (0, 0), (left, right), (0, 0)]
            keys = map_parts(lambda p: mx.pad(p, pad), keys)
            values = map_parts(lambda p: mx.pad(p, pad), values)
        return keys, values, c.left_padding + left  # type: ignore[return-value]

    def extract(self, idx: int) -> RowQuantKVCache:  # type: ignore[override]
        mx.eval(self.left_padding)
        pad, end = self.left_padding.tolist()[idx], self._idx
        keys = map_parts(lambda p: mx.contiguous(p[idx : idx + 1, :, pad:end]), self.keys)
        values = map_parts(lambda p: mx.contiguous(p[idx : idx + 1, :, pad:end]), self.values)
        return RowQuantKVCache.from_arrays(keys, values, self.row_deltas[idx], self.quant)  # type: ignore[arg-type]

    @classmethod
    def merge(cls, caches: Sequence[RowQuantKVCache]) -> RowBatchQuantKVCache:  # type: ignore[override]
        """Rows right-aligned at the longest one, left padding zeros (BatchKVCache.merge)."""
        quant = caches[0].quant
        lengths = [c.offset for c in caches]
        longest = max(lengths)
        deltas = [c.rope_delta for c in caches]
        if longest == 0:
            return cls([0] * len(caches), quant, deltas)
        padding = [longest - n for n in lengths]
        ref = next(c for c in caches if c.keys is not None)

        def stacked(side: str) -> Triple:
            out = []
            for j, like in enumerate(getattr(ref, side)):
                buffer = _blank(like, len(caches), longest)
                for i, (pad, c) in enumerate(zip(padding, caches, strict=True)):
                    if c.offset:
                        buffer[i : i + 1, :, pad:] = getattr(c, side)[j][..., : c.offset, :]
                out.append(buffer)
            return tuple(out)  # type: ignore[return-value]

        merged = cls(padding, quant, deltas)
        merged.keys, merged.values = stacked("keys"), stacked("values")
        merged.offset = merged.offset + longest
        merged._idx = longest
        return merged

    @property
    def nbytes(self) -> int:
        if self.keys is None:
            return 0
        return parts_nbytes(self.keys) + parts_nbytes(self.values)
