"""Invariants of per-entry bookkeeping and caches.entries.entries_report: each entry counts the
hits it served (not stores, not peeks), ages from when it was stored, is forgotten with its
entry; the report ranks by size and by hits, cuts hashes to a prefix and exposes nothing else
of an entry."""

from __future__ import annotations

import json

import pytest

from caches.entries import HASH_PREFIX_CHARS, CacheEntryInfo, entries_report
from caches.lru import ByteLRU
from caches.prefix import ImageSpan, PrefixCache
from caches.radix import Block
from caches.vision import VisionCache, VisionEntry, VisionKey

H1, H2 = "a" * 32, "b" * 32
PAD = 151655


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_lru_entries_count_hits_and_age_from_store() -> None:
    """Invariant: get and touch(hit=True) credit the entry; touch(), peek and record do not;
    age is seconds since the (latest) put; replacing a value restarts both."""
    clock = Clock()
    lru: ByteLRU[str, str] = ByteLRU(100, clock=clock)
    lru.put("a", "A", 10)
    clock.now += 5
    lru.put("b", "B", 20)
    lru.get("a")
    lru.touch("a", hit=True)
    lru.touch("b")
    lru.peek("b")
    lru.record(True)
    clock.now += 1
    seen = {e.key: (e.value, e.nbytes, e.hits, e.age_s) for e in lru.entries()}
    assert seen == {"a": ("A", 10, 2, 6.0), "b": ("B", 20, 0, 1.0)}
    lru.put("a", "A2", 10)
    seen = {e.key: (e.hits, e.age_s) for e in lru.entries()}
    assert seen["a"] == (0, 0.0)


def test_lru_entries_forget_evicted_popped_and_cleared() -> None:
    """Invariant: entries() lists exactly the stored keys, LRU first, after evictions, pops
    and clear (no bookkeeping outlives its entry)."""
    lru: ByteLRU[str, int] = ByteLRU(30)
    for k in "abcd":
        lru.put(k, 0, 10)  # "a" evicted
    lru.pop("c")
    assert [e.key for e in lru.entries()] == ["b", "d"]
    lru.put("e", 0, 10)
    lru.put("f", 0, 10)  # "b" evicted
    assert [e.key for e in lru.entries()] == lru.keys() == ["d", "e", "f"]
    lru.clear()
    assert lru.entries() == []
    lru.put("d", 0, 10)
    assert lru.entries()[0].hits == 0


def _vkey(h: str) -> VisionKey:
    return VisionKey("model", "proc", "float32", h)


def test_vision_entries_report_hits_of_lookups_only() -> None:
    """Invariant: a vision lookup hit credits its entry; a miss, a token-count mismatch and a
    re-store do not; entries() carries the full pixel hash and no features."""
    cache = VisionCache(1000)
    cache.store(_vkey(H1), VisionEntry("features", 4, (1, 4, 4), 100))
    cache.store(_vkey(H2), VisionEntry("features", 9, (1, 6, 6), 300))
    for _ in range(3):
        assert cache.lookup(_vkey(H1), 4) is not None
    assert cache.lookup(_vkey("c" * 32), 4) is None
    info = {e.pixel_hashes: e for e in cache.entries()}
    assert info[(H1,)].hits == 3 and info[(H1,)].tokens == 4 and info[(H1,)].nbytes == 100
    assert info[(H2,)].hits == 0 and info[(H2,)].kind == "vision"
    assert "features" not in repr(cache.entries())


def _prompt(*segs: int | tuple[str, int]) -> tuple[list[int], list[ImageSpan]]:
    ids: list[int] = []
    spans: list[ImageSpan] = []
    for s in segs:
        if isinstance(s, tuple):
            spans.append(ImageSpan(len(ids), len(ids) + s[1], s[0]))
            ids.extend([PAD] * s[1])
        else:
            ids.append(s)
    return ids, spans


def test_prefix_entries_list_images_in_order_and_credit_lookup_hits() -> None:
    """Invariant: a prefix entry (a leaf of the block tree) lists its images' hashes in
    prompt order (none for text); lookups served along its path count as its hits, a peek
    and a covered re-store do not."""
    cache = PrefixCache(10_000, block_tokens=2)
    two = _prompt(1, (H1, 4), 2, (H2, 4), 3, 4)  # 12 tokens: 6 blocks
    text = _prompt(7, 8, 9, 10)

    def make(k: int) -> Block:
        return Block("kv", 50)

    for p in (two, text):
        cache.store(*p, make)
    longer = (two[0] + [5, 6], two[1])
    assert cache.lookup(*longer) is not None
    assert cache.lookup(*longer) is not None
    cache.peek(*longer)
    cache.store(*two, make, length=4)  # covered: touches only
    info = {e.pixel_hashes: e for e in cache.entries()}
    assert set(info) == {(H1, H2), ()}
    assert info[(H1, H2)].hits == 2 and info[(H1, H2)].tokens == len(two[0])
    assert info[()].hits == 0 and info[()].kind == "prefix" and info[()].tokens == 4


def _info(kind: str, h: str | None, nbytes: int, hits: int, age: float = 1.0) -> CacheEntryInfo:
    return CacheEntryInfo(kind, (h,) if h else (), 4, nbytes, hits, age)


class _Fixed:
    def __init__(self, entries: list[CacheEntryInfo]) -> None:
        self._entries = entries

    def entries(self) -> list[CacheEntryInfo]:
        return self._entries


def test_report_ranks_by_size_and_hits_with_a_limit() -> None:
    """Invariant: `largest` is by bytes, `most_hit` by hits (ties: the other key, then the
    younger), each cut at `limit`; counts and bytes cover every entry of both caches."""
    vision = _Fixed([_info("vision", "1" * 32, 100, 5), _info("vision", "2" * 32, 300, 0)])
    prefix = _Fixed([_info("prefix", None, 200, 5, 0.5), _info("prefix", "3" * 32, 50, 9)])
    report = entries_report(vision, prefix, limit=3)
    assert [e["bytes"] for e in report["largest"]] == [300, 200, 100]
    assert [(e["hits"], e["bytes"]) for e in report["most_hit"]] == [(9, 50), (5, 200), (5, 100)]
    assert report["counts"] == {"vision": 2, "prefix": 2}
    assert report["bytes"] == {"vision": 400, "prefix": 250}
    only = entries_report(vision, prefix, limit=10, kind="prefix")
    assert {e["kind"] for e in only["largest"]} == {"prefix"} and len(only["largest"]) == 2


def test_report_exposes_hash_prefixes_and_numbers_only() -> None:
    """Invariant: each reported entry has exactly kind, hash prefixes, counts, bytes, hits,
    age and tenant: hashes are cut to HASH_PREFIX_CHARS and nothing else of the entry leaves."""
    full = "0123456789abcdef" * 2
    vision = VisionCache(1000)
    vision.store(_vkey(full), VisionEntry("SECRET-FEATURES", 4, (1, 4, 4), 100))
    report = entries_report(vision, PrefixCache(1000))
    (entry,) = report["largest"]
    assert set(entry) == {
        "kind", "hash", "hashes", "images", "tokens", "bytes", "hits", "age_s", "tenant"
    }  # fmt: skip
    assert entry["hash"] == full[:HASH_PREFIX_CHARS] and entry["images"] == 1
    body = json.dumps(report)
    assert full not in body and "SECRET" not in body


@pytest.mark.parametrize("limit, kind", [(0, None), (101, None), (5, "kv")])
def test_report_refuses_bad_limit_or_kind(limit: int, kind: str | None) -> None:
    """Invariant: a limit outside 1..100 or an unknown kind is a ValueError (a 400 upstream)."""
    with pytest.raises(ValueError):
        entries_report(_Fixed([]), _Fixed([]), limit=limit, kind=kind)
