"""What an operator may see of the caches' entries: which images they hold, how big, how used.

`CacheEntryInfo` is what `VisionCache.entries()` and `PrefixCache.entries()` return (full
hashes, no features, no KV, no token ids). `entries_report` turns both lists into the JSON
body of `GET /v1/cache/entries`: the largest and the most-hit entries, hashes cut to a
prefix. The prefix identifies an image to whoever already has it (hash it and compare) and
says nothing about its pixels; no image content, text or token ids leave the caches.

Each entry names its tenant (caches/scope.py); `entries_report(..., tenant=name)` reports only
that tenant's entries (what a non-admin caller may see of the caches: its own).

No MLX here; thread safety is the caches' (each `entries()` is one consistent snapshot).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from caches.tenants import SHARED

HASH_PREFIX_CHARS = 12  # 48 bits: unique among any realistic number of cached images
KINDS = ("vision", "prefix")
MAX_LIMIT = 100


@dataclass(frozen=True)
class CacheEntryInfo:
    """One cache entry, described.

    kind: "vision" (one image's encoder output) or "prefix" (a KV snapshot of a prompt prefix).
    pixel_hashes: full pixel hashes of the images it covers, in prompt order (a vision entry has
        one; a prefix entry has one per image occurrence, none for a text-only prefix).
    tokens: placeholder tokens (vision) or prompt tokens (prefix) the entry stands for.
    nbytes: bytes counted against the cache's budget. hits: lookups it served since stored.
    age_s: seconds since it was stored. tenant: whose scope it is in ("" for the shared one).
    """

    kind: str
    pixel_hashes: tuple[str, ...]
    tokens: int
    nbytes: int
    hits: int
    age_s: float
    tenant: str = ""


class _HasEntries(Protocol):
    def entries(self) -> list[CacheEntryInfo]: ...


def entries_report(
    vision: _HasEntries,
    prefix: _HasEntries,
    limit: int = 10,
    kind: str | None = None,
    tenant: str | None = None,
) -> dict[str, Any]:
    """The largest and the most-hit entries (up to `limit` each, 1..MAX_LIMIT) of both caches,
    or of one `kind`, as a JSON-able dict; only `tenant`'s entries unless it is None (counts
    and bytes then cover that tenant's too). Ties: larger first in `most_hit`, more hits first
    in `largest`, then the younger entry. Raises ValueError for a bad `limit` or `kind`."""
    check_query(limit, kind)
    lists = {"vision": vision.entries(), "prefix": prefix.entries()}
    if tenant is not None:
        lists = {name: [e for e in es if e.tenant == tenant] for name, es in lists.items()}
    chosen = [e for name in KINDS if kind in (None, name) for e in lists[name]]
    largest = sorted(chosen, key=lambda e: (-e.nbytes, -e.hits, e.age_s))[:limit]
    most_hit = sorted(chosen, key=lambda e: (-e.hits, -e.nbytes, e.age_s))[:limit]
    return {
        "object": "cache.entries",
        "limit": limit,
        "counts": {name: len(entries) for name, entries in lists.items()},
        "bytes": {name: sum(e.nbytes for e in entries) for name, entries in lists.items()},
        "largest": [_public(e) for e in largest],
        "most_hit": [_public(e) for e in most_hit],
    }


def check_query(limit: int, kind: str | None) -> None:
    """ValueError, worded for the client, unless 1 <= limit <= MAX_LIMIT and kind is None or
    one of KINDS."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"`limit` must be an integer from 1 to {MAX_LIMIT}")
    if kind is not None and kind not in KINDS:
        raise ValueError(f"`kind` must be one of: {', '.join(KINDS)}")


def _public(entry: CacheEntryInfo) -> dict[str, Any]:
    hashes = [h[:HASH_PREFIX_CHARS] for h in entry.pixel_hashes]
    return {
        "kind": entry.kind,
        "hash": hashes[0] if hashes else None,  # the first image; None: text only
        "hashes": hashes,
        "images": len(hashes),
        "tokens": entry.tokens,
        "bytes": entry.nbytes,
        "hits": entry.hits,
        "age_s": round(entry.age_s, 3),
        "tenant": entry.tenant or SHARED,
    }
