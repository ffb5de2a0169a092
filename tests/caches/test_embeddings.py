"""The embedding cache (caches/embeddings.py): a key is (model, content, dimensions,
scope), and any one of them differing is another entry; the byte budget evicts the least
recently used; a zero budget stores nothing; lookups are counted per tenant."""

from __future__ import annotations

import pytest

from caches.embeddings import EmbeddingCache, EmbeddingEntry, EmbeddingKey


def _key(**changes: object) -> EmbeddingKey:
    fields = {"model_fingerprint": "m", "content_hash": "c", "dimensions": 0, "scope": ""}
    return EmbeddingKey(**{**fields, **changes})  # type: ignore[arg-type]


def test_each_part_of_the_key_separates_entries() -> None:
    cache = EmbeddingCache(1000)
    cache.store(_key(), EmbeddingEntry("v", 3), 10)
    assert cache.lookup(_key()) == EmbeddingEntry("v", 3)
    for other in (
        _key(model_fingerprint="m2"),
        _key(content_hash="c2"),
        _key(dimensions=8),
        _key(scope="alice"),
    ):
        assert cache.lookup(other) is None
    stats = cache.stats()
    assert (stats.hits, stats.misses) == (1, 4)


def test_budget_evicts_least_recently_used() -> None:
    cache = EmbeddingCache(25)
    for name in "abc":
        cache.store(_key(content_hash=name), EmbeddingEntry(name, 1), 10)
    assert cache.lookup(_key(content_hash="a")) is None  # evicted for "c"
    assert cache.lookup(_key(content_hash="c")) is not None
    assert not cache.store(_key(content_hash="big"), EmbeddingEntry("x", 1), 26)


def test_zero_budget_stores_nothing() -> None:
    cache = EmbeddingCache(0)
    assert not cache.store(_key(), EmbeddingEntry("v", 1), 1)
    assert cache.lookup(_key()) is None and len(cache) == 0


def test_lookups_are_counted_per_tenant() -> None:
    cache = EmbeddingCache(1000)
    cache.store(_key(scope="alice"), EmbeddingEntry("v", 1), 4)
    cache.lookup(_key(scope="alice"))
    cache.lookup(_key(scope="bob"))
    report = cache.tenant_stats()
    assert report["alice"] == {"queries": 1, "hits": 1, "entries": 1, "bytes": 4}
    assert report["bob"]["hits"] == 0


def test_an_empty_identity_is_refused() -> None:
    with pytest.raises(ValueError):
        _key(content_hash="")
