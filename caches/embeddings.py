"""The embedding cache: finished vectors keyed by everything that changes them.

A key names the model (its fingerprint: config, weights, pooling), the input's content (a
hash of its text, token ids, or parts with images by pixel hash, so the same pixels in any
delivery share an entry), the options that change the vector (`dimensions`) and the
request's cache scope (caches/scope.py: two scopes never share an entry). An identical input
is then answered without a forward. Values are opaque (numpy float32 rows in practice) with
the byte size the caller gives; no MLX, numpy or PIL here.

Failure policy: as the vision cache's, a cache fault is a miss or a "not stored", never a
failed request. Thread-safe (the LRU's lock).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from caches.lru import ByteLRU, LRUStats
from caches.scope import tenant_of
from caches.tenants import TenantCounters

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddingKey:
    """Identity of one vector: the model's fingerprint, the input's content hash, the
    options (`dimensions`, 0: all) and the scope tag ("" shared)."""

    model_fingerprint: str
    content_hash: str
    dimensions: int = 0
    scope: str = ""

    def __post_init__(self) -> None:
        # An empty identity would merge the entries of different models or inputs.
        if not self.model_fingerprint or not self.content_hash:
            raise ValueError("EmbeddingKey needs a model fingerprint and a content hash")

    @property
    def tenant(self) -> str:
        return tenant_of(self.scope)


@dataclass(frozen=True)
class EmbeddingEntry:
    """A cached vector and the tokens its input took (reported again as usage on a hit)."""

    vector: Any
    tokens: int


class EmbeddingCache:
    """Byte-bounded LRU of `EmbeddingEntry` by `EmbeddingKey`; `capacity_bytes` 0 disables it
    (lookups miss and are counted, stores return False)."""

    def __init__(self, capacity_bytes: int, tenant_share: float = 1.0) -> None:
        self._lru: ByteLRU[EmbeddingKey, EmbeddingEntry] = ByteLRU(
            capacity_bytes, group=_tenant, group_share=tenant_share
        )
        self._tenants = TenantCounters()

    @property
    def capacity_bytes(self) -> int:
        return self._lru.capacity_bytes

    def lookup(self, key: EmbeddingKey) -> EmbeddingEntry | None:
        """The entry for `key` (marked most recently used), or None; counted either way."""
        try:
            entry = self._lru.get(key)
            self._tenants.count(key.tenant, hit=entry is not None)
            return entry
        except Exception:
            logger.exception("embedding cache lookup failed; treating as a miss")
            return None

    def store(self, key: EmbeddingKey, entry: EmbeddingEntry, nbytes: int) -> bool:
        """Store `entry` (`nbytes`: the vector's size) under `key`, evicting LRU entries to fit;
        False when nothing was stored (disabled, too large for the budget, a fault)."""
        try:
            return self._lru.put(key, entry, nbytes)
        except Exception:
            logger.exception("embedding cache store failed; not stored")
            return False

    def clear(self) -> None:
        """Drop every entry; counters are kept."""
        self._lru.clear()

    def tenant_stats(self) -> dict[str, dict[str, int]]:
        return self._tenants.report(self._lru.groups())

    def __len__(self) -> int:
        return len(self._lru)

    def stats(self) -> LRUStats:
        return self._lru.stats()


def _tenant(key: EmbeddingKey) -> str:
    return key.tenant
