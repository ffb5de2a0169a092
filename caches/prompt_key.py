"""A prompt as the prefix cache keys it: one key item per token (text token ids, each image
token as its image's tag, the first item carrying the scope), and the chained content keys of
its whole blocks (what names them on disk). Pure functions; no MLX.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from caches.scope import scope_of_item, scoped_item, tenant_of

Edge = tuple[Any, ...]


@dataclass(frozen=True)
class ImageSpan:
    """One image's placeholder run: prompt token indices [start, end), and its content hash
    (the pixel hash of the image as processed)."""

    start: int
    end: int
    content_hash: str


def _validate(n_tokens: int, spans: Sequence[ImageSpan]) -> None:
    prev_end = 0
    for sp in spans:
        if not (prev_end <= sp.start < sp.end <= n_tokens) or not isinstance(sp.content_hash, str):
            raise ValueError(f"{sp}: spans must be sorted, disjoint, non-empty, in [0, {n_tokens}]")
        if not sp.content_hash:
            raise ValueError(f"{sp}: empty content_hash")
        prev_end = sp.end


def key_items(
    token_ids: Sequence[int], spans: Sequence[ImageSpan], scope: str = ""
) -> list[int | str]:
    """One key item per prompt token: the id for text, the image's tag for its run; the first
    carries the `scope` tag (`caches.scope.scoped_item`; unchanged for ""). Tags are str, ids
    int: they never compare equal. ValueError for bad spans."""
    items: list[int | str] = list(token_ids)
    _validate(len(items), spans)
    for sp in spans:
        items[sp.start : sp.end] = [f"{sp.content_hash}:{sp.end - sp.start}"] * (sp.end - sp.start)
    if items and scope:
        items[0] = scoped_item(items[0], scope)
    return items


def edge_tenant(edge: Edge) -> str:
    """The tenant owning a branch, from its first block's first item."""
    return tenant_of(scope_of_item(edge[0])) if edge else ""


def block_keys(items: Sequence[int | str], block_tokens: int, count: int) -> list[str]:
    """A content key (32 hex chars) for each of the first `count` whole blocks of `items`
    (from `key_items`): block k's key hashes block k-1's key and block k's items, so it names
    the whole prefix up to the block's end, as the block's path in the tree does. Used to
    name blocks outside the tree (the disk tier). ValueError if there are fewer blocks."""
    if count * block_tokens > len(items):
        raise ValueError(f"{count} blocks of {block_tokens} exceed {len(items)} items")
    keys, previous = [], ""
    for k in range(count):
        edge = tuple(items[k * block_tokens : (k + 1) * block_tokens])
        previous = xxhash.xxh3_128_hexdigest(f"{previous}|{edge!r}".encode())
        keys.append(previous)
    return keys
