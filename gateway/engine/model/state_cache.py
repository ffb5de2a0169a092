"""Recurrent-state layer caches (hybrid models' linear-attention layers), as the engine's
rows carry them: one fixed-size state per sequence, plus the bookkeeping a `RowKVCache`
carries (tokens seen, the row's rope delta) so code that reads a cache's `offset` or sets its
`rope_delta` treats every layer alike.

A recurrent layer's cache is a list of arrays (mlx-vlm's `ArraysCache`: for Qwen3.5's
gated-delta layers the convolution window (B, kernel - 1, channels) and the recurrent state
(B, heads, value dim, key dim), float32). Unlike KV it cannot be cut back to a shorter prefix
(`trim` refuses), so prefix reuse stores *snapshots*: a copy of every state array taken at a
block boundary (`snapshot`), restored whole (`restore`). The decode batch merges, filters,
extends and extracts these like mlx-lm's batch KV caches; every operation is row-wise, so a
row's state never depends on the rows beside it.

All owned by the engine thread; nothing here is thread-safe.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import mlx.core as mx
from mlx_vlm.models.cache import ArraysCache

StateArrays = tuple[mx.array, ...]  # one snapshot: a layer's state arrays, (1, ...) each


class _StateArraysCache(ArraysCache):
    """mlx-vlm's `ArraysCache` whose `state` (what the engine evaluates and what
    `mx.eval([c.state ...])` waits for) leaves out the arrays not set yet."""

    @property
    def state(self) -> list[mx.array]:  # type: ignore[override]
        """The arrays to evaluate (the unset ones left out)."""
        return [c for c in self.cache if c is not None]

    @state.setter
    def state(self, value: list[mx.array]) -> None:
        self.cache = list(value)


class RowStateCache(_StateArraysCache):
    """One sequence's recurrent state: `size` arrays (None until the first forward), the
    number of tokens it has absorbed (`offset`) and the row's rope delta (unused by the
    recurrence; carried so the batch can hand it back on `extract`)."""

    def __init__(self, size: int = 2, rope_delta: int = 0) -> None:
        super().__init__(size)
        self.offset = 0
        self.rope_delta = rope_delta
        # offset -> the state arrays right after a prompt forward that ended there: the
        # snapshots a prefix-cache store takes for the blocks ending at those offsets.
        self.marks: dict[int, StateArrays] = {}

    def advance(self, n: int) -> None:
        """Called by the layer after absorbing `n` tokens."""
        super().advance(n)
        self.offset += n

    def mark(self) -> None:
        """Remember the state as it is now, at `offset` (call after a prompt forward). Free:
        a forward replaces the state arrays and never writes into them, so the mark shares
        them; they live as long as the row (or a prefix-cache block that keeps them)."""
        if all(c is not None for c in self.cache):
            self.marks[self.offset] = tuple(self.cache)

    def restore_blocks(self, snapshots: Sequence[StateArrays], tokens: int) -> None:
        """Become the state after `tokens` tokens from a prefix hit's blocks' snapshots (one
        per block, block k's taken at its end; the hit ends at the last block's end, which
        the exact-reuse rule guarantees). Every snapshot is kept as a mark."""
        block = tokens // len(snapshots)
        if block * len(snapshots) != tokens:
            raise ValueError(f"a {tokens}-token hit does not end at a block boundary")
        self.marks = {(k + 1) * block: s for k, s in enumerate(snapshots)}
        self.restore(snapshots[-1], tokens)

    def snapshot(self, length: int | None = None) -> RowStateCache:
        """A copy for another row from here on (a forked choice, `scheduler/choices.fork`):
        the same state arrays (shared: a forward replaces them, never writes into them), the
        offset and rope delta; no marks. `length` must be None or `offset` (a state holds
        no shorter prefix)."""
        if length is not None and length != self.offset:
            raise ValueError("a recurrent state cannot be copied at a shorter prefix")
        out = copy.copy(self)  # the subclass and its bookkeeping (ArraysCache's padding too)
        out.cache = list(self.cache)
        out.marks = {}
        return out

    def trim(self, n: int) -> int:
        """A recurrent state cannot forget tokens: only `trim(0)` is allowed."""
        if n:
            raise ValueError("a recurrent state cannot be trimmed back to a shorter prefix")
        return 0

    def is_trimmable(self) -> bool:
        return False

    def restore(self, arrays: StateArrays, tokens: int) -> None:
        """Become the state after `tokens` tokens, from a snapshot (arrays shared: a forward
        replaces them, never writes into them)."""
        self.cache = list(arrays)
        self.offset = tokens

    def used_nbytes(self) -> int:
        return sum(c.nbytes for c in self.cache if c is not None)

    @classmethod
    def merge(cls, caches: Sequence[ArraysCache]) -> BatchStateCache:  # type: ignore[override]
        return BatchStateCache.merge(caches)


class BatchStateCache(_StateArraysCache):
    """Several rows' states stacked on axis 0, with each row's `offset` and rope delta as
    Python ints (no device read on `extract`). No left padding: a state has no time axis, so
    rows of different lengths line up as they are. Rows carry no marks (their prompt's
    blocks were stored before they joined)."""

    def __init__(self, size: int = 2) -> None:
        super().__init__(size)
        self.offsets: list[int] = []
        self.row_deltas: list[int] = []

    @classmethod
    def merge(cls, caches: Sequence[ArraysCache]) -> BatchStateCache:  # type: ignore[override]
        n = len(caches[0].cache)
        out = cls(n)
        out.offsets = [int(getattr(c, "offset", 0)) for c in caches]
        out.row_deltas = [int(getattr(c, "rope_delta", 0)) for c in caches]
        if any(x is None for c in caches for x in c.cache):
            raise ValueError("a row joined the batch before its prompt filled its state")
        out.cache = [mx.concatenate([c.cache[e] for c in caches]) for e in range(n)]
        return out

    def advance(self, n: int) -> None:
        super().advance(n)
        self.offsets = [o + n for o in self.offsets]

    def filter(self, batch_indices: Sequence[int]) -> None:
        keep = list(batch_indices)
        super().filter(mx.array(keep, dtype=mx.int32))
        self.offsets = [self.offsets[i] for i in keep]
        self.row_deltas = [self.row_deltas[i] for i in keep]

    def extend(self, other: BatchStateCache) -> None:  # type: ignore[override]
        super().extend(other)
        self.offsets = self.offsets + other.offsets
        self.row_deltas = self.row_deltas + other.row_deltas

    def extract(self, idx: int) -> RowStateCache:
        row = RowStateCache(len(self.cache), self.row_deltas[idx])
        row.cache = [mx.contiguous(c[idx : idx + 1]) for c in self.cache]
        row.offset = self.offsets[idx]
        return row

    def trim(self, n: int) -> int:
        if n:
            raise ValueError("a recurrent state cannot be trimmed back to a shorter prefix")
        return 0

    def is_trimmable(self) -> bool:
        return False


def settle_block_end(cache: Sequence[object]) -> None:
    """Evaluate every layer cache's state after a prompt forward that ended at a block end,
    then mark each `RowStateCache`'s state there (its snapshot for exact prefix reuse).
    Engine thread only."""
    mx.eval([c.state for c in cache])  # type: ignore[attr-defined]
    for c in cache:
        if isinstance(c, RowStateCache):
            c.mark()
