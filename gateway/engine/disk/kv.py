"""KV blocks of the prefix cache's radix tree in the disk tier (gateway/engine/disk/tier.py).

A block's file is named by `caches.prefix.block_keys`: a hash chained over every block's key
items from the prompt's start, so it names the whole prefix up to the block's end, as the
block's path in the tree does. Its metadata carries the block's index and size, the rope
delta after it, the content hashes of the images starting in it and its key items (`token
key`); a block read back must agree on all of them with the request that wants it, or it is
removed and the read stops there (gateway/engine/disk/plan.py checks, on the reader thread).

A request's read covers only blocks past those the memory tree holds when it arrives,
consecutively (`block_wants`); at admission the blocks read past those memory holds then are
copied into MLX arrays and put into the tree (promotion), so the memory lookup that follows
serves them (`extend_hit`). Engine thread only.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence

import mlx.core as mx

from caches.disk_format import RawTensor
from caches.prefix import ImageSpan, PrefixCache, PrefixHit, block_keys, key_items
from caches.radix import Block
from gateway.engine.disk.plan import QUANT_PARTS, BlockWant, ReadBlock
from gateway.engine.disk.reader import Prefetched
from gateway.engine.disk.tier import DiskTier, raw_tensors, to_array
from gateway.engine.model.kv import Parts

log = logging.getLogger(__name__)


class BlockLayers(tuple):
    """A KV block's value as the prefix cache holds it: ((keys, values) per layer), plus the
    key of its file (`disk_key`, None until known), so a memory hit can mark the file used
    without hashing the prompt again."""

    disk_key: str | None = None


def touch_blocks(disk: DiskTier, hit: PrefixHit | None) -> None:
    """Mark the files of a memory hit's blocks used (last use is the disk tier's LRU order;
    throttled, written in the background)."""
    for value in hit.blocks if hit is not None else ():
        key = getattr(value, "disk_key", None)
        if key is not None:
            disk.touch("prefix", key)


def queue_blocks(
    disk: DiskTier, tokens: list[int], spans: list[ImageSpan], block: int,
    made: Sequence[tuple[int, Block]], scope: str = "",
) -> None:  # fmt: skip
    """Queue freshly computed blocks (index k, Block of evaluated (keys, values) per layer)
    of the prompt `tokens` (in cache scope `scope`) for writing. Never raises (a failure is
    logged)."""
    try:
        items = key_items(tokens, spans, scope)
        keys = block_keys(items, block, max(k for k, _ in made) + 1)
        for k, b in made:
            tensors = raw_tensors(block_tensors(b.value))
            starts = [s.content_hash for s in spans if k * block <= s.start < (k + 1) * block]
            meta = {
                "block_index": str(k),
                "block_tokens": str(block),
                "rope_delta": str(b.rope_delta),
                "images": json.dumps(starts),
                "token_key": json.dumps(list(items[k * block : (k + 1) * block])),
            }
            disk.writer.submit("prefix", keys[k], tensors, meta)
            if isinstance(b.value, BlockLayers):
                b.value.disk_key = keys[k]
    except Exception:
        log.exception("queueing KV blocks for the disk cache failed")


def block_tensors(value: Sequence[tuple[Parts, Parts]]) -> list[tuple[str, mx.array]]:
    """A block's arrays by file tensor name: `k.L` / `v.L` per layer, or for quantized KV
    `k.L.q`, `k.L.scales`, `k.L.biases` (and `v.L.*`): see `plan.tensor_names`."""
    named = []
    for layer, pair in enumerate(value):
        for kind, parts in zip("kv", pair, strict=True):
            if isinstance(parts, tuple):
                named += [
                    (f"{kind}.{layer}.{p}", a) for p, a in zip(QUANT_PARTS, parts, strict=True)
                ]
            else:
                named.append((f"{kind}.{layer}", parts))
    return named


def block_wants(
    prefix: PrefixCache, prompt: Sequence[int], spans: Sequence[ImageSpan],
    delta_at: Callable[[int], int], scope: str = "",
) -> tuple[BlockWant, ...]:  # fmt: skip
    """The blocks a request could read from disk: those past the ones the memory tree holds
    now, up to the last one a hit may use (it leaves at least one token to feed), each with
    its file key, key items and rope delta after it (`delta_at(cut)`: the prompt's rope delta
    after token `cut`). Cheap: key items are built in C, one hash per block."""
    block = prefix.block_tokens
    usable = (len(prompt) - 1) // block
    stored = prefix.stored_blocks(prompt, spans, scope)
    if stored >= usable:
        return ()
    items = key_items(prompt, spans, scope)
    keys = block_keys(items, block, usable)
    return tuple(
        BlockWant(k, keys[k], tuple(items[k * block : (k + 1) * block]), delta_at((k + 1) * block))
        for k in range(stored, usable)
    )


def extend_hit(
    disk: DiskTier,
    prefix: PrefixCache,
    prompt: Sequence[int],
    spans: Sequence[ImageSpan],
    align: int,
    hit: PrefixHit | None,
    found: Prefetched,
    scope: str = "",
) -> tuple[PrefixHit | None, int]:
    """`hit` (the memory lookup's, already counted) extended with the blocks the reader found
    (`found`) past those in memory now, and the prompt tokens gained (0: `hit` unchanged).
    Blocks memory gained since the read was planned are served from memory; a read that
    starts past what memory holds now (evicted meanwhile) is not used."""
    stored = prefix.stored_blocks(prompt, spans, scope)
    ready = found.blocks_from(stored)
    if not ready:
        return hit, 0
    started = time.perf_counter()
    loaded = [to_block(read) for read in ready]
    mx.eval([b.value for b in loaded])
    block = prefix.block_tokens
    cut = (stored + len(loaded)) * block
    prefix.store(prompt, spans, lambda k: loaded[k - stored], cut, scope)
    extended = prefix.find(prompt, spans, align, scope)
    disk.prefix_hits += 1
    disk.prefix_tokens += len(loaded) * block
    disk.load_seconds["prefix"] += time.perf_counter() - started
    before = hit.tokens if hit is not None else 0
    if extended is None or extended.tokens <= before:
        return hit, 0
    return extended, extended.tokens - before


def to_block(read: ReadBlock) -> Block:
    """A checked block's tensors copied into new MLX arrays (engine thread; a quantized
    layer's keys and values are triples)."""

    def arrays(tensors: RawTensor | tuple[RawTensor, ...]) -> Parts:
        if isinstance(tensors, tuple):
            return tuple(to_array(t, None) for t in tensors)
        return to_array(tensors, None)

    value = BlockLayers((arrays(k), arrays(v)) for k, v in read.layers)
    value.disk_key = read.key
    return Block(value, read.nbytes, read.rope_delta, read.images, read.snapshot_nbytes)
