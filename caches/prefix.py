"""The image-aware prefix (KV) cache.

An image's placeholder run says nothing about *which* image it is, so the key replaces each
run by one item, the image's content hash; text tokens stay ints, order is kept. Different
images never share KV past the text before them; the same image in the same place does.
Values are opaque (`PrefixEntry.kv` is an MLX KV snapshot; no mlx/numpy/PIL here), never
sliced or mutated: the caller uses the first `PrefixHit.tokens` tokens of `entry.kv`. Budgets
are bytes given by the caller. Any exception inside `lookup`/`store` is logged and becomes a
miss / "not stored". Thread safety: one lock guards every public method, taken before the
inner ByteLRU's own lock, never the other way round.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

from caches.entries import CacheEntryInfo
from caches.lru import ByteLRU, LRUStats

logger = logging.getLogger(__name__)

_Image = tuple[str, int]  # (content_hash, n_tokens): what an internal image id stands for
_Key = tuple[int, ...]  # internal key: token ids >= 0, images as negative interned ids


@dataclass(frozen=True)
class ImageSpan:
    """One image's placeholder run: prompt token indices [start, end), and its content hash
    (the pixel hash of the image as processed)."""

    start: int
    end: int
    content_hash: str


@dataclass(frozen=True)
class PrefixEntry:
    """KV of the first `length` tokens of the prompt it was stored with (== its length).

    kv is opaque, owned by the cache once stored, never mutated or sliced by it. rope_delta is
    that of the whole entry (a caller using fewer tokens recomputes positions for its prompt).
    nbytes is the used size of the KV arrays, counted against the budget.
    """

    kv: Any
    length: int
    rope_delta: int
    nbytes: int


@dataclass(frozen=True)
class PrefixHit:
    """Use the first `tokens` of `entry.kv`: 0 < tokens <= entry.length, < the prompt's length."""

    entry: PrefixEntry
    tokens: int


@dataclass(frozen=True)
class PrefixStats(LRUStats):
    """LRU counters plus prompt tokens looked up (`tokens_queried`) and served (`tokens_hit`)."""

    tokens_queried: int
    tokens_hit: int


@dataclass(frozen=True)
class _Stored:
    entry: PrefixEntry
    images: tuple[_Image, ...]  # one per image occurrence, to release interned ids


def _validate(n_tokens: int, spans: Sequence[ImageSpan]) -> None:
    prev_end = 0
    for sp in spans:
        if not (prev_end <= sp.start < sp.end <= n_tokens) or not isinstance(sp.content_hash, str):
            raise ValueError(f"{sp}: spans must be sorted, disjoint, non-empty, in [0, {n_tokens}]")
        if not sp.content_hash:
            raise ValueError(f"{sp}: empty content_hash")
        prev_end = sp.end


def _splice(ids: tuple[int, ...], spans: Sequence[ImageSpan], items: Sequence[Any]) -> tuple:
    """ids with each span's run replaced by its item; per-token copying happens in C."""
    parts: list[tuple] = []
    pos = 0
    for sp, item in zip(spans, items):
        parts += (ids[pos : sp.start], (item,))
        pos = sp.end
    parts.append(ids[pos:])
    return tuple(itertools.chain.from_iterable(parts))


def make_key(token_ids: Sequence[int], spans: Sequence[ImageSpan]) -> tuple[int | str, ...]:
    """The prompt's key: text tokens as ints, each image's run replaced by its content hash.
    `spans` must be sorted, non-overlapping, non-empty and inside the prompt (ValueError)."""
    ids = tuple(token_ids)
    _validate(len(ids), spans)
    return _splice(ids, spans, [sp.content_hash for sp in spans])


def _common_prefix_len(a: _Key, b: _Key) -> int:
    """Longest common prefix length. Binary search over tuple-slice equality: O(log L) Python
    steps; only the unresolved window is compared, so the C-level work is O(L)."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:  # common case: a stored turn is a prefix of the next one
        return limit
    lo, hi = 0, limit  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _items_to_tokens(m: int, spans: Sequence[ImageSpan]) -> int:
    """Prompt tokens covered by the first `m` key items (an image item counts its run)."""
    extra = 0
    for sp in spans:
        if sp.start - extra >= m:  # sp.start - extra is this image's key index
            break
        extra += sp.end - sp.start - 1
    return m + extra


def _leave_one(tokens: int, n: int, spans: Sequence[ImageSpan]) -> int:
    """Cap a hit so at least one token is left to prefill (the model needs logits for the last
    position), without cutting an image in half: an image is encoded as a whole."""
    if tokens < n:
        return tokens
    tokens = n - 1
    for sp in spans:
        if sp.start < tokens < sp.end:
            return sp.start
    return tokens


def _align_down(tokens: int, n: int, align: int) -> int:
    """Cap a hit at n - 1 tokens and round it down to a multiple of `align` (the exact-reuse
    rule: reuse whole blocks only). It may end inside an image: that rule's prefill starts
    mid-image from the image's cached features."""
    return min(tokens, n - 1) // align * align


class PrefixCache:
    """Byte-bounded LRU of KV snapshots, looked up by longest common key prefix.

    Internal keys are int tuples: each distinct image `(content_hash, n_tokens)` is interned to
    a negative id (tokens are >= 0), never reused, so different images never collide and a hash
    seen with another run length can't get misaligned KV. Keys are kept sorted; the stored key
    sharing the longest prefix with a query is one of its two sorted neighbours, so lookup is a
    bisect plus two C-speed prefix comparisons, no per-entry or per-token Python loop. (A linear
    scan took ~1 s for 500 entries x 30k tokens sharing a long prefix; a token trie costs O(L)
    Python steps per call.) Stored keys stay prefix-free, so a stored prefix of a key is its
    sorted predecessor and its stored extensions follow it.
    `capacity_bytes` of 0 disables: lookups miss (and are counted), stores return False.
    """

    def __init__(self, capacity_bytes: int) -> None:
        # on_evict runs inside ByteLRU.put, which we only call under self._lock.
        self._lru: ByteLRU[_Key, _Stored] = ByteLRU(capacity_bytes, on_evict=self._release)
        self._lock = threading.Lock()
        self._sorted: list[_Key] = []  # exactly the LRU's keys, sorted
        self._images: dict[_Image, list[int]] = {}  # image -> [id, references from stored keys]
        self._fresh = itertools.count(-1, -1)
        self._tokens_queried = self._tokens_hit = 0

    @property
    def capacity_bytes(self) -> int:
        return self._lru.capacity_bytes

    def _key(self, ids: tuple[int, ...], spans: Sequence[ImageSpan]) -> tuple[_Key, list]:
        """Internal key and its [(image, id)]; unknown images get fresh (unregistered) ids."""
        _validate(len(ids), spans)
        if ids and min(ids) < 0:
            raise ValueError("token ids must be >= 0 (negative ids are reserved for images)")
        local: dict[_Image, int] = {}
        images = []
        for sp in spans:
            img = (sp.content_hash, sp.end - sp.start)
            slot = self._images.get(img)
            iid = slot[0] if slot is not None else local.setdefault(img, next(self._fresh))
            images.append((img, iid))
        return _splice(ids, spans, [iid for _, iid in images]), images

    def _release(self, key: _Key, stored: _Stored) -> None:
        """Forget a key that left the LRU: sorted list and image references."""
        i = bisect.bisect_left(self._sorted, key)
        if i < len(self._sorted) and self._sorted[i] == key:
            del self._sorted[i]
        for img in stored.images:
            slot = self._images[img]
            slot[1] -= 1
            if slot[1] == 0:
                del self._images[img]

    def _remove(self, key: _Key) -> None:
        if (stored := self._lru.pop(key)) is not None:  # a removal, not an eviction
            self._release(key, stored)

    def lookup(
        self, token_ids: Sequence[int], spans: Sequence[ImageSpan], align: int = 1
    ) -> PrefixHit | None:
        """Longest usable cached prefix of the prompt, or None (also for 0 usable tokens).

        Always leaves >= 1 token to prefill. With `align` 1 it never ends inside an image;
        with `align` > 1 it is a multiple of `align` (and may end inside an image). Counts one
        hit/miss, tokens_queried += len(token_ids), tokens_hit += hit tokens; touches the
        entry used.
        """
        with self._lock:
            hit, n = None, 0
            try:
                ids = tuple(token_ids)
                n = len(ids)
                hit = self._find(ids, spans, align=align)
            except Exception:
                logger.exception("prefix cache lookup failed; treating as a miss")
            self._tokens_queried += n
            self._tokens_hit += hit.tokens if hit is not None else 0
            self._lru.record(hit is not None)
            return hit

    def peek(self, token_ids: Sequence[int], spans: Sequence[ImageSpan], align: int = 1) -> int:
        """How many prompt tokens `lookup` would serve now (0 for none), without counting a
        query or touching recency. Advisory: entries may be evicted before the real lookup."""
        with self._lock:
            try:
                hit = self._find(tuple(token_ids), spans, touch=False, align=align)
            except Exception:
                logger.exception("prefix cache peek failed; treating as a miss")
                return 0
            return hit.tokens if hit is not None else 0

    def _find(
        self, ids: tuple[int, ...], spans: Sequence[ImageSpan], touch: bool = True, align: int = 1
    ) -> PrefixHit | None:
        if align < 1:
            raise ValueError(f"align must be >= 1, got {align}")
        key, _ = self._key(ids, spans)
        i = bisect.bisect_left(self._sorted, key)
        best_m, best_key = 0, None
        for k in self._sorted[max(i - 1, 0) : i + 1]:  # the two lexicographic neighbours
            m = _common_prefix_len(key, k)
            if m > best_m:
                best_m, best_key = m, k
        stored = self._lru.peek(best_key) if best_key is not None else None
        covered = _items_to_tokens(best_m, spans)
        if align > 1:
            tokens = _align_down(covered, len(ids), align)
        else:
            tokens = _leave_one(covered, len(ids), spans)
        if stored is None or tokens <= 0:
            return None
        if touch:
            self._lru.touch(best_key, hit=True)
        return PrefixHit(entry=stored.entry, tokens=tokens)

    def store(
        self, token_ids: Sequence[int], spans: Sequence[ImageSpan], entry: PrefixEntry
    ) -> bool:
        """Store `entry`, the KV of the whole prompt (entry.length == len(token_ids)).

        True when the prompt is now served: stored, or covered by stored entries extending it
        (touched instead). A stored prefix or equal key is removed (not an eviction). False
        when disabled, over the whole budget, or on invalid input / internal error (logged).
        """
        try:
            if self._lru.capacity_bytes == 0:
                return False
            ids = tuple(token_ids)
            if entry.length != len(ids) or not ids:
                raise ValueError(f"entry.length={entry.length}: must equal {len(ids)} tokens, > 0")
            with self._lock:
                return self._store(ids, spans, entry)
        except Exception:
            logger.exception("prefix cache store failed; not stored")
            return False

    def _store(self, ids: tuple[int, ...], spans: Sequence[ImageSpan], entry: PrefixEntry) -> bool:
        key, images = self._key(ids, spans)
        if entry.nbytes > self._lru.capacity_bytes:
            return self._lru.put(key, _Stored(entry, ()), entry.nbytes)  # counted as rejected
        n = len(key)
        i = bisect.bisect_left(self._sorted, key)
        tail = itertools.islice(self._sorted, i, None)  # extensions of key follow it contiguously
        longer = list(itertools.takewhile(lambda k: len(k) > n and k[:n] == key, tail))
        if longer:
            for k in longer:
                self._lru.touch(k)
            return True
        if i < len(self._sorted) and self._sorted[i] == key:
            self._remove(key)  # replaced by the new entry
        elif i > 0 and key[: len(self._sorted[i - 1])] == self._sorted[i - 1]:
            self._remove(self._sorted[i - 1])  # the only stored prefix is the predecessor
        # Register images before put: an eviction inside put may drop another reference.
        for img, iid in images:
            self._images.setdefault(img, [iid, 0])[1] += 1
        stored = _Stored(entry, tuple(img for img, _ in images))
        if not self._lru.put(key, stored, entry.nbytes):
            self._release(key, stored)
            return False
        bisect.insort(self._sorted, key)
        return True

    def clear(self) -> None:
        """Drop every entry; counters are kept."""
        with self._lock:
            self._lru.clear()
            self._sorted.clear()
            self._images.clear()

    def entries(self) -> list[CacheEntryInfo]:
        """Every entry's image hashes (in prompt order; none for a text-only prefix), tokens,
        bytes, hits served and age. No KV, no token ids."""
        with self._lock:
            return [
                CacheEntryInfo(
                    "prefix",
                    tuple(h for h, _ in e.value.images),
                    e.value.entry.length,
                    e.nbytes,
                    e.hits,
                    e.age_s,
                )
                for e in self._lru.entries()
            ]

    def __len__(self) -> int:
        return len(self._lru)

    def stats(self) -> PrefixStats:
        """A consistent snapshot of LRU counters and token accounting."""
        with self._lock:
            base = self._lru.stats()
            return PrefixStats(
                **{f.name: getattr(base, f.name) for f in fields(base)},
                tokens_queried=self._tokens_queried,
                tokens_hit=self._tokens_hit,
            )
