"""The vision-feature cache: encoder outputs keyed by everything that changes them.

A key names the model, the processor settings that affect pixels (resize limits, patch and
merge size), the dtype and the decoded pixels. Two requests that agree on all four get the same
features, so the vision tower runs once per distinct image. Hashes are stored whole, never
truncated.

Values are opaque (MLX arrays in practice); this module never imports mlx, numpy or PIL. The byte
size of an entry is given by the caller (`VisionEntry.nbytes`, the used size of its arrays).

Scopes (caches/scope.py): the pixel hash of a scoped request is `<pixel hash>@<scope tag>`, so
two scopes never share an entry. Each tenant may hold at most `tenant_share` of the budget
(its own LRU entries go first when it is full); lookups, hits, entries and bytes are also
counted per tenant (`tenant_stats`).

Failure policy: any exception inside `lookup` or `store` is logged and becomes a miss or a
"not stored"; a cache fault never fails a request.

Thread safety: every public method is safe to call from any thread (one internal lock).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, fields
from typing import Any

from caches.entries import CacheEntryInfo
from caches.lru import ByteLRU, LRUStats
from caches.scope import scope_of_hash, tenant_of
from caches.tenants import TenantCounters

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VisionKey:
    """Identity of one image's encoder output.

    model_fingerprint: hash of the vision tower weights / model identity.
    processor_fingerprint: hash of processor settings that change pixels or token layout.
    dtype: dtype of the features (e.g. "bfloat16"); features of two dtypes differ.
    pixel_hash: `caches.hashing.pixel_hash` of the decoded pixels (full 32 hex chars), scoped
        with `caches.scope.scoped_hash` when the request has a scope.
    """

    model_fingerprint: str
    processor_fingerprint: str
    dtype: str
    pixel_hash: str

    def __post_init__(self) -> None:
        # An empty field would silently merge the cache lines of different models/settings.
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, str) or not value:
                raise ValueError(f"VisionKey.{f.name} must be a non-empty str, got {value!r}")

    @property
    def tenant(self) -> str:
        """The tenant whose scope this key is in ("" for the shared scope)."""
        return tenant_of(scope_of_hash(self.pixel_hash))


@dataclass(frozen=True)
class VisionEntry:
    """Cached encoder output for one image.

    features: opaque (an MLX array of shape [num_tokens, hidden] in practice); owned by the
        cache once stored and never mutated by it; callers must not mutate it either.
    num_tokens: number of placeholder tokens the features fill; checked on every hit.
    grid_thw: (t, h, w) patch grid the processor produced (needed for mRoPE positions).
    nbytes: used size of `features` plus `extras`, in bytes; counted against the budget.
    extras: opaque model-specific side outputs (e.g. Qwen3-VL deepstack features), or None.
    """

    features: Any
    num_tokens: int
    grid_thw: tuple[int, int, int]
    nbytes: int
    extras: Any = None


class VisionCache:
    """Byte-bounded LRU of `VisionEntry` by `VisionKey`.

    `capacity_bytes` of 0 disables the cache: lookups miss (and are counted), stores return
    False. `tenant_share` (0 < share <= 1): the part of the budget one tenant may hold.
    """

    def __init__(self, capacity_bytes: int, tenant_share: float = 1.0) -> None:
        self._lru: ByteLRU[VisionKey, VisionEntry] = ByteLRU(
            capacity_bytes, group=_tenant, group_share=tenant_share
        )
        self._tenants = TenantCounters()
        self._media = TenantCounters()  # the same counters, by medium instead of tenant
        # Own lock so that peek -> verify -> pop/touch -> record is one atomic step: without it a
        # concurrent store of a fresh entry could be dropped by a stale corruption check.
        self._lock = threading.Lock()

    @property
    def capacity_bytes(self) -> int:
        return self._lru.capacity_bytes

    def lookup(
        self, key: VisionKey, expected_tokens: int, media: str = "image"
    ) -> VisionEntry | None:
        """Return the cached entry for `key`, or None; counted under `media` ("image", or
        "audio" for an audio clip's features, which this cache holds too: `media_stats`).

        `expected_tokens` is the number of placeholder tokens the prompt holds for this image.
        A stored entry with a different `num_tokens` is treated as corrupt: it is dropped,
        logged, and the lookup counts as a miss (the caller then recomputes and stores).
        A hit marks the entry most recently used.
        """
        try:
            with self._lock:
                entry = self._lru.peek(key)
                if entry is None or entry.num_tokens != expected_tokens:
                    self._tenants.count(key.tenant, hit=False)
                    self._media.count(media, hit=False)
                if entry is None:
                    self._lru.record(False)
                    return None
                if entry.num_tokens != expected_tokens:
                    logger.warning(
                        "vision cache: dropping entry for pixel_hash=%s: %d tokens cached, "
                        "%d expected",
                        key.pixel_hash,
                        entry.num_tokens,
                        expected_tokens,
                    )
                    self._lru.pop(key)
                    self._lru.record(False)
                    return None
                self._lru.touch(key, hit=True)
                self._lru.record(True)
                self._tenants.count(key.tenant, hit=True)
                self._media.count(media, hit=True)
                return entry
        except Exception:
            logger.exception("vision cache lookup failed; treating as a miss")
            return None

    def store(self, key: VisionKey, entry: VisionEntry) -> bool:
        """Store `entry` under `key` (replacing any old entry), evicting LRU entries to fit.

        Returns False when nothing was stored: cache disabled, entry larger than the whole
        budget, invalid entry (logged), or an internal error (logged).
        """
        try:
            if self._lru.capacity_bytes == 0:
                return False
            if not isinstance(entry, VisionEntry):
                raise TypeError(f"expected VisionEntry, got {type(entry).__name__}")
            if entry.num_tokens <= 0 or entry.nbytes < 0:
                raise ValueError(
                    f"invalid entry: num_tokens={entry.num_tokens}, nbytes={entry.nbytes}"
                )
            with self._lock:
                return self._lru.put(key, entry, entry.nbytes)
        except Exception:
            logger.exception("vision cache store failed; not stored")
            return False

    def clear(self) -> None:
        """Drop every entry; counters are kept."""
        with self._lock:
            self._lru.clear()

    def entries(self) -> list[CacheEntryInfo]:
        """Every entry's pixel hash, tokens, bytes, hits served and age (no features)."""
        return [
            CacheEntryInfo(
                "vision",
                (e.key.pixel_hash,),
                e.value.num_tokens,
                e.nbytes,
                e.hits,
                e.age_s,
                e.key.tenant,
            )
            for e in self._lru.entries()
        ]

    def tenant_stats(self) -> dict[str, dict[str, int]]:
        """Per tenant that looked up or holds anything: queries, hits, entries, bytes."""
        return self._tenants.report(self._lru.groups())

    def media_stats(self) -> dict[str, dict[str, int]]:
        """Per medium looked up ("image", "audio"): queries and hits."""
        rows = self._media.report({})
        return {m: {"queries": r["queries"], "hits": r["hits"]} for m, r in rows.items()}

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, key: object) -> bool:
        return key in self._lru

    def stats(self) -> LRUStats:
        """A consistent snapshot of the counters (hits, misses, evictions, bytes, ...)."""
        return self._lru.stats()


def _tenant(key: VisionKey) -> str:
    return key.tenant
