"""One prefix-cache block's value per layer, whatever the layer keeps: a KV layer's keys and
values of the block's positions, or a recurrent layer's state snapshot at the block's end
(docs/caching.md, "Hybrid models: state snapshots").

A block of a hybrid model is stored only where every recurrent layer has a snapshot taken at
the block's end by the prefill forward that ended there (`RowStateCache.mark`): the same
computation an uncached request does at that boundary, so a hit that restores it and
prefills the rest computes what no cache computes, bit for bit. A hit restores the deepest
snapshot on its path (its last block's: the exact-reuse rule ends hits at block ends) and the
KV of every block (`kv.assemble`). The prompt's blocks are stored when its prefill ends
(`Prefiller`), and the marks dropped then: a decoding row holds no snapshot.

Engine thread only.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from gateway.engine.model.kv import Parts, block_nbytes, map_parts
from gateway.engine.model.state_cache import RowStateCache


def layer_block(cache: Any, lo: int, hi: int) -> tuple[Parts, Parts]:
    """Layer `cache`'s share of the block [lo, hi): contiguous copies of its KV rows (a lazy
    slice would keep the whole source buffer alive; quantized KV: each array of the triple),
    or the recurrent state marked at `hi` (shared, never written: `RowStateCache.mark`).
    KeyError when no forward ended at `hi`."""
    if isinstance(cache, RowStateCache):
        conv, state = cache.marks[hi]
        return conv, state

    def rows(p: mx.array) -> mx.array:
        return mx.contiguous(p[..., lo:hi, :])

    return map_parts(rows, cache.keys), map_parts(rows, cache.values)


def snapshot_nbytes(value: Sequence[tuple[Parts, Parts]], kv: Sequence[Any]) -> int:
    """Bytes of a block's recurrent-state snapshots (the layers of `kv` that keep states)."""
    return block_nbytes(
        [pair for pair, c in zip(value, kv, strict=True) if isinstance(c, RowStateCache)]
    )


def storable(kv: Sequence[Any], block: int, length: int) -> int:
    """The longest prefix of `length` tokens whose whole blocks can be stored: each needs a
    snapshot at its end in every recurrent layer (a forward that ended there; a restored hit
    marks each of its blocks' ends). `length` itself when `kv` has no recurrent layer."""
    states = [c for c in kv if isinstance(c, RowStateCache)]
    if not states:
        return length
    end = 0
    while end + block <= length and all(end + block in c.marks for c in states):
        end += block
    return end


def state_layers(kv: Sequence[Any]) -> tuple[int, ...]:
    """Indices of the layers of `kv` (a family's `new_cache()`) that keep recurrent states:
    their blocks are snapshots, on disk too (`disk/plan.check_block`)."""
    return tuple(i for i, c in enumerate(kv) if isinstance(c, RowStateCache))


def drop_marks(kv: Sequence[Any]) -> None:
    """Forget every recurrent layer's marks (once the prompt's blocks are stored, before the
    row joins the decode batch: a mark holds a whole state, ~49 MiB at real shapes)."""
    for c in kv:
        if isinstance(c, RowStateCache):
            c.marks = {}
