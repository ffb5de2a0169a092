"""Invariants of caches.lru.ByteLRU: the byte budget always holds, eviction is LRU, oversize
entries are rejected, counters are exact, and concurrent use is safe."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caches.lru import ByteLRU, LRUStats

# 1000 puts as 2000 bytes (key, size): generated and shrunk much faster than a list of tuples.
ops = st.binary(min_size=2000, max_size=2000)


@settings(max_examples=30, deadline=None, database=None)
@given(capacity=st.integers(0, 400), puts=ops)
def test_budget_holds_under_random_puts(capacity: int, puts: bytes) -> None:
    """Invariant: after every put, stored bytes <= capacity and equal the sum of live sizes;
    a stored key is most recently used; only oversize puts (or capacity 0) are refused."""
    lru: ByteLRU[int, int] = ByteLRU(capacity)
    for raw_key, raw_size in zip(puts[0::2], puts[1::2]):
        key, nbytes = raw_key % 61, raw_size * 150 // 255
        stored = lru.put(key, nbytes, nbytes)  # the value is its own size
        assert stored == (0 < capacity and nbytes <= capacity)
        s = lru.stats()
        assert s.bytes <= capacity
        assert s.bytes == sum(v for _, v in lru.items())
        assert s.entries == len(lru)
        if stored:
            assert lru.keys()[-1] == key


def test_eviction_order_is_lru() -> None:
    """Invariant: the least recently used entry (by get/touch/put) is evicted first;
    peek does not count as use."""
    lru: ByteLRU[str, str] = ByteLRU(30)
    for k in "abc":
        lru.put(k, k, 10)
    assert lru.get("a") == "a"  # order now b, c, a
    lru.touch("b")  # order now c, a, b
    assert lru.peek("c") == "c"  # no effect on order
    lru.put("d", "d", 10)
    assert lru.keys() == ["a", "b", "d"]
    lru.put("e", "e", 20)
    assert lru.keys() == ["d", "e"]
    assert lru.stats().evictions == 3


def test_oversize_entry_rejected() -> None:
    """Invariant: an entry larger than the whole budget is not stored and evicts nothing."""
    lru: ByteLRU[str, str] = ByteLRU(100)
    lru.put("a", "a", 60)
    assert lru.put("big", "big", 101) is False
    assert "big" not in lru and "a" in lru
    s = lru.stats()
    assert (s.rejected, s.evictions, s.bytes) == (1, 0, 60)
    assert lru.put("exact", "x", 100) is True  # exactly the budget fits (evicting "a")


def test_zero_capacity_disables() -> None:
    """Invariant: capacity 0 stores nothing, not even 0-byte entries (bug fixed in put)."""
    lru: ByteLRU[str, str] = ByteLRU(0)
    assert lru.put("a", "a", 0) is False
    assert lru.get("a") is None and len(lru) == 0


def test_counters() -> None:
    """Invariant: hits/misses/insertions/evictions/rejected count exactly; record() counts
    caller-decided lookups; hit_rate = hits / (hits + misses)."""
    lru: ByteLRU[str, int] = ByteLRU(20)
    assert lru.stats().hit_rate == 0.0
    lru.put("a", 1, 10)
    lru.put("a", 2, 10)  # replacement: an insertion, not an eviction
    lru.put("b", 3, 10)
    lru.put("c", 4, 10)  # evicts "a"
    lru.put("d", 5, 21)  # rejected
    assert lru.get("a") is None and lru.get("b") == 3 and lru.get("c") == 4
    lru.record(True)
    lru.record(False)
    assert lru.pop("b") == 3 and lru.pop("b") is None  # pop is not an eviction
    s = lru.stats()
    assert s == LRUStats(
        hits=3,
        misses=2,
        insertions=4,
        evictions=1,
        rejected=1,
        entries=1,
        bytes=10,
        capacity_bytes=20,
    )
    assert s.hit_rate == pytest.approx(0.6)


def test_clear_drops_entries_keeps_counters() -> None:
    """Invariant: clear() empties the store and its bytes; counters survive."""
    lru: ByteLRU[str, int] = ByteLRU(100)
    lru.put("a", 1, 10)
    lru.get("a")
    lru.clear()
    s = lru.stats()
    assert (s.entries, s.bytes, s.hits, s.insertions) == (0, 0, 1, 1)
    assert lru.get("a") is None


def test_on_evict_called_for_evictions_only() -> None:
    """Invariant: on_evict sees each evicted (key, value), not pops or replacements."""
    seen: list[tuple[str, int]] = []
    lru: ByteLRU[str, int] = ByteLRU(20, on_evict=lambda k, v: seen.append((k, v)))
    lru.put("a", 1, 10)
    lru.put("a", 2, 10)
    lru.put("b", 3, 10)
    lru.pop("b")
    lru.put("c", 4, 10)
    lru.put("d", 5, 10)
    assert seen == [("a", 2)]


def test_thread_safety_smoke() -> None:
    """Invariant: concurrent put/get/stats from several threads keep the budget and the
    counters consistent (every get counted exactly once)."""
    lru: ByteLRU[int, int] = ByteLRU(1000)
    n_threads, n_ops = 8, 2000
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(n_ops):
                k = rng.randrange(200)
                if rng.random() < 0.5:
                    lru.put(k, k, rng.randrange(1, 50))
                else:
                    lru.get(k)
                assert lru.stats().bytes <= 1000
        except BaseException as e:  # surfaced in the main thread
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    s = lru.stats()
    assert s.bytes <= 1000
    assert s.hits + s.misses + s.insertions == n_threads * n_ops


def test_a_group_holds_at_most_its_share_and_evicts_its_own_first() -> None:
    """Invariant: storing into a group at its share evicts that group's least recently used
    entries, never another group's; the ungrouped ("") entries are not limited."""
    lru: ByteLRU[str, int] = ByteLRU(100, group=lambda k: k.split(":")[0], group_share=0.5)
    for i in range(3):
        assert lru.put(f"b:{i}", i, 10)
    for i in range(8):
        assert lru.put(f"a:{i}", i, 10)
    assert lru.groups()["a"] == (5, 50)  # a holds its share, no more
    assert [k for k in lru.keys() if k.startswith("b:")] == ["b:0", "b:1", "b:2"]
    assert lru.keys()[-5:] == [f"a:{i}" for i in range(3, 8)]  # a's oldest went
    assert not lru.put("a:big", 0, 60)  # larger than a's share: refused
    for i in range(6):
        assert lru.put(f":{i}", i, 10)  # the shared group fills the rest, evicting by LRU
    assert lru.stats().bytes <= 100


def test_group_accounting_matches_entries_after_random_operations() -> None:
    """Invariant: per-group (entries, bytes) always equal what the entries sum to, through
    puts, replacements, pops, evictions and clears."""
    rng = random.Random(3)
    lru: ByteLRU[str, int] = ByteLRU(200, group=lambda k: k[0].strip("_"), group_share=0.6)
    for step in range(2000):
        key = f"{rng.choice('ab_')}{rng.randrange(12)}"
        op = rng.random()
        if op < 0.75:
            lru.put(key, step, rng.randrange(1, 50))
        elif op < 0.98:
            lru.pop(key)
        else:
            lru.clear()
        want: dict[str, tuple[int, int]] = {}
        for e in lru.entries():
            n, b = want.get(e.key[0], (0, 0))
            want[e.key[0]] = (n + 1, b + e.nbytes)
        got = {g: v for g, v in lru.groups().items() if g}
        assert got == {g: v for g, v in want.items() if g != "_"}
        assert all(b <= 120 for g, (_, b) in got.items())
