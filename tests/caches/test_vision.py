"""Invariants of caches.vision.VisionCache: the key holds everything that changes features,
a token-count mismatch is a miss that drops the entry, the byte budget holds, and internal
errors degrade to a miss / not stored."""

from __future__ import annotations

import dataclasses
import logging

import pytest

from caches.hashing import pixel_hash
from caches.vision import VisionCache, VisionEntry, VisionKey


def key(i: int = 0, **overrides: str) -> VisionKey:
    k = VisionKey("model-fp", "proc-fp", "bfloat16", pixel_hash("RGB", 2, 2, bytes([i]) * 12))
    return dataclasses.replace(k, **overrides)


def entry(tokens: int = 4, nbytes: int = 100, extras: object = None) -> VisionEntry:
    return VisionEntry(
        features=object(), num_tokens=tokens, grid_thw=(1, 4, 4), nbytes=nbytes, extras=extras
    )


def test_hit_returns_same_entry_and_counts() -> None:
    """Invariant: a stored entry is returned as is (identity, extras included) on a hit."""
    cache = VisionCache(1000)
    e = entry(extras={"deepstack": [1, 2]})
    assert cache.store(key(), e) is True
    assert cache.lookup(key(), 4) is e
    s = cache.stats()
    assert (s.hits, s.misses, s.entries, s.bytes) == (1, 0, 1, 100)


@pytest.mark.parametrize(
    "field", ["model_fingerprint", "processor_fingerprint", "dtype", "pixel_hash"]
)
def test_key_includes_every_field(field: str) -> None:
    """Invariant: changing any one key field (model, processor, dtype, pixels) misses."""
    cache = VisionCache(1000)
    cache.store(key(), entry())
    other = dataclasses.replace(key(), **{field: getattr(key(), field) + "x"})
    assert cache.lookup(other, 4) is None
    assert cache.lookup(key(), 4) is not None
    assert cache.stats().misses == 1


def test_empty_key_field_rejected() -> None:
    """Invariant: an empty fingerprint would merge models' cache lines, so it is refused."""
    with pytest.raises(ValueError):
        key(dtype="")


def test_token_count_mismatch_is_miss_and_drops_entry(caplog: pytest.LogCaptureFixture) -> None:
    """Invariant: a hit whose num_tokens != expected is corrupt: dropped, a miss, logged."""
    cache = VisionCache(1000)
    cache.store(key(), entry(tokens=4))
    with caplog.at_level(logging.WARNING, logger="caches.vision"):
        assert cache.lookup(key(), 5) is None
    assert any("expected" in r.getMessage() for r in caplog.records)
    s = cache.stats()
    assert (s.hits, s.misses, s.entries, s.bytes, s.evictions) == (0, 1, 0, 0, 0)
    assert key() not in cache
    assert cache.lookup(key(), 4) is None  # really gone


def test_budget_holds_while_images_stream() -> None:
    """Invariant: 50 distinct images through a 10-entry budget: bytes never exceed the
    budget, evictions are counted, the most recent images stay."""
    cache = VisionCache(1000)
    for i in range(50):
        assert cache.lookup(key(i), 4) is None
        assert cache.store(key(i), entry(nbytes=100)) is True
        assert cache.stats().bytes <= 1000
    s = cache.stats()
    assert (s.entries, s.bytes, s.evictions, s.insertions, s.misses) == (10, 1000, 40, 50, 50)
    assert all(cache.lookup(key(i), 4) is not None for i in range(40, 50))
    assert all(cache.lookup(key(i), 4) is None for i in range(40))


def test_lru_order_respects_hits() -> None:
    """Invariant: a hit makes the entry most recently used, so it survives the next eviction."""
    cache = VisionCache(200)
    cache.store(key(0), entry())
    cache.store(key(1), entry())
    assert cache.lookup(key(0), 4) is not None
    cache.store(key(2), entry())
    assert key(0) in cache and key(1) not in cache


def test_oversize_and_disabled_not_stored() -> None:
    """Invariant: an entry over the whole budget, or any entry with capacity 0, is not stored;
    a disabled cache still counts misses."""
    cache = VisionCache(100)
    assert cache.store(key(), entry(nbytes=101)) is False
    assert cache.stats().rejected == 1
    off = VisionCache(0)
    assert off.store(key(), entry(nbytes=0)) is False
    assert off.lookup(key(), 4) is None
    assert off.stats().misses == 1


def test_errors_degrade(caplog: pytest.LogCaptureFixture) -> None:
    """Invariant: failures inside store/lookup never propagate: logged, not stored / miss."""
    cache = VisionCache(1000)
    with caplog.at_level(logging.ERROR, logger="caches.vision"):
        assert cache.store(key(), entry(nbytes=-1)) is False
        assert cache.store(key(), "not an entry") is False  # type: ignore[arg-type]
        assert cache.lookup(["unhashable"], 4) is None  # type: ignore[arg-type]
    assert len(caplog.records) == 3
    assert cache.stats().entries == 0


def test_clear_keeps_counters() -> None:
    """Invariant: clear() drops entries and bytes but keeps counters."""
    cache = VisionCache(1000)
    cache.store(key(), entry())
    cache.lookup(key(), 4)
    cache.clear()
    s = cache.stats()
    assert (s.entries, s.bytes, s.hits) == (0, 0, 1)
    assert len(cache) == 0


def test_scoped_keys_are_apart_and_a_tenant_keeps_to_its_share() -> None:
    """Invariant: the same pixels in two scopes are two entries (a lookup in one scope never
    finds the other's), and a tenant at its share evicts its own oldest entry only."""
    from caches.scope import scope_tag, scoped_hash
    from caches.vision import VisionCache, VisionEntry, VisionKey

    def key(tenant: str, pixels: str) -> VisionKey:
        return VisionKey("m", "p", "float32", scoped_hash(pixels, scope_tag(tenant, "")))

    cache = VisionCache(400, tenant_share=0.5)
    entry = VisionEntry("features", 4, (1, 4, 4), 100)
    assert cache.store(key("alice", "a" * 32), entry)
    assert cache.lookup(key("bob", "a" * 32), 4) is None
    assert cache.lookup(key("", "a" * 32), 4) is None
    assert cache.lookup(key("alice", "a" * 32), 4) is entry
    cache.store(key("bob", "b" * 32), entry)
    cache.store(key("alice", "c" * 32), entry)
    cache.store(key("alice", "d" * 32), entry)  # alice at 200 of 400: her oldest goes
    assert key("alice", "a" * 32) not in cache and key("bob", "b" * 32) in cache
    tenants = cache.tenant_stats()
    assert tenants["alice"] == {"queries": 1, "hits": 1, "entries": 2, "bytes": 200}
    assert tenants["bob"]["queries"] == 1 and tenants["bob"]["hits"] == 0
    assert {e.tenant for e in cache.entries()} == {"alice", "bob"}
