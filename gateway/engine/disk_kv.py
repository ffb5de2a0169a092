"""KV blocks of the prefix cache's radix tree in the disk tier (gateway/engine/disk_tier.py).

A block's file is named by `caches.prefix.block_keys`: a hash chained over every block's key
items from the prompt's start, so it names the whole prefix up to the block's end, as the
block's path in the tree does. Its metadata carries the block's index and size, the rope
delta after it, the content hashes of the images starting in it and its key items (`token
key`); a block read back must agree on all of them with the request that wants it, or it is
removed and the read stops there.

A lookup reads only blocks past those the memory tree already holds, consecutively, and puts
them into the tree (promotion), so the memory lookup that follows serves them. Engine thread
only.
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
from gateway.engine.disk_tier import DiskTier, raw_tensor, to_array

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
    made: Sequence[tuple[int, Block]],
) -> None:  # fmt: skip
    """Queue freshly computed blocks (index k, Block of evaluated (keys, values) per layer)
    of the prompt `tokens` for writing. Never raises (a failure is logged)."""
    try:
        items = key_items(tokens, spans)
        keys = block_keys(items, block, max(k for k, _ in made) + 1)
        for k, b in made:
            tensors: dict[str, RawTensor] = {}
            for layer, (kk, vv) in enumerate(b.value):
                tensors[f"k.{layer}"] = raw_tensor(kk)
                tensors[f"v.{layer}"] = raw_tensor(vv)
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


def extend_hit(
    disk: DiskTier,
    prefix: PrefixCache,
    prompt: Sequence[int],
    spans: Sequence[ImageSpan],
    delta_at: Callable[[int], int],
    align: int,
    layers: int,
    hit: PrefixHit | None,
) -> tuple[PrefixHit | None, int]:
    """`hit` (the memory lookup's, already counted) extended with the blocks the disk holds
    past those in memory, and the prompt tokens gained (0: `hit` unchanged). `delta_at(cut)`
    is the prompt's rope delta after token `cut`; `layers` the model's layer count."""
    block = prefix.block_tokens
    usable = (len(prompt) - 1) // block  # a hit leaves at least one token to feed
    stored = prefix.stored_blocks(prompt, spans)
    if stored >= usable:
        return hit, 0
    items = key_items(prompt, spans)
    keys = block_keys(items, block, usable)
    loaded = _load(disk, keys, items, block, stored, delta_at, layers)
    if not loaded:
        return hit, 0
    prefix.store(prompt, spans, lambda k: loaded[k - stored], (stored + len(loaded)) * block)
    extended = prefix.find(prompt, spans, align)
    before = hit.tokens if hit is not None else 0
    if extended is None or extended.tokens <= before:
        return hit, 0
    return extended, extended.tokens - before


def _load(
    disk: DiskTier, keys: Sequence[str], items: Sequence[int | str], block: int, first: int,
    delta_at: Callable[[int], int], layers: int,
) -> list[Block]:  # fmt: skip
    """Blocks first, first+1, ... until the first missing or unusable one."""
    started = time.perf_counter()
    out: list[Block] = []
    for k in range(first, len(keys)):
        found = disk.store.get("prefix", keys[k])
        if found is None:
            break
        try:
            want = list(items[k * block : (k + 1) * block])
            read = _block(found.metadata, found.tensors, k, want, block, delta_at, layers)
            read.value.disk_key = keys[k]
            out.append(read)
        except (ValueError, KeyError, TypeError, RecursionError) as exc:  # metadata unchecksummed
            disk.store.discard("prefix", keys[k], f"does not fit the request: {exc}")
            break
    if out:
        mx.eval([b.value for b in out])
        disk.prefix_hits += 1
        disk.prefix_tokens += len(out) * block
        disk.load_seconds["prefix"] += time.perf_counter() - started
    return out


def _block(
    meta: dict[str, str], tensors: dict[str, RawTensor], k: int, want: list[int | str],
    block: int, delta_at: Callable[[int], int], layers: int,
) -> Block:  # fmt: skip
    """Block k from its file, or ValueError/KeyError where it disagrees with the request.
    (Its dtype is fixed by the namespace: the model and its embeddings' dtype.)"""
    if int(meta["block_index"]) != k or int(meta["block_tokens"]) != block:
        raise ValueError(f"block {meta['block_index']} of {meta['block_tokens']}, expected {k}")
    if json.loads(meta["token_key"]) != want:
        raise ValueError("token key differs from the prompt's")
    delta = delta_at((k + 1) * block)
    if int(meta["rope_delta"]) != delta:
        raise ValueError(f"rope delta {meta['rope_delta']}, expected {delta}")
    if set(tensors) != {f"{kv}.{i}" for kv in "kv" for i in range(layers)}:
        raise ValueError(f"{len(tensors)} tensors for {layers} layers")
    pairs, nbytes = [], 0
    for i in range(layers):
        kk, vv = tensors[f"k.{i}"], tensors[f"v.{i}"]
        if len(kk.shape) != 4 or kk.shape[2] != block or vv.shape[2] != block:
            raise ValueError(f"layer {i}: shapes {kk.shape} {vv.shape}")
        pairs.append((to_array(kk, None), to_array(vv, None)))
        nbytes += kk.nbytes + vv.nbytes
    images = json.loads(meta["images"])
    if not isinstance(images, list) or not all(isinstance(i, str) for i in images):
        raise ValueError(f"images {meta['images'][:100]!r}: not a list of content hashes")
    return Block(BlockLayers(pairs), nbytes, delta, tuple(images))
