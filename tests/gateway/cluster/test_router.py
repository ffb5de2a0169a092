"""The affinity router: consistent hashing with bounded loads (no Ray, no MLX)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.cluster.router import AffinityRouter, NoReplica

KEYS = [f"media:{i:032x}" for i in range(2000)]


def test_same_key_same_slot_when_idle():
    """A key goes to its home slot every time while loads stay under the bound."""
    router = AffinityRouter(4)
    for key in KEYS[:200]:
        slot = router.choose(key)
        router.release(slot)
        assert slot == router.home(key)
        assert router.choose(key) == slot
        router.release(slot)


def test_keys_spread_over_slots():
    """Virtual nodes spread keys roughly evenly: each of 4 slots owns 15-35% of 2000 keys."""
    counts = Counter(AffinityRouter(4).home(k) for k in KEYS)
    assert sorted(counts) == [0, 1, 2, 3]
    assert all(0.15 <= n / len(KEYS) <= 0.35 for n in counts.values()), counts


def test_a_hot_key_spills_to_its_next_slot_and_is_bounded():
    """One key sent 40 times without releases: no slot exceeds ceil(c * n / slots) in flight,
    and the overflow lands on a stable sequence of slots (the ring order), not at random."""

    def loads_for(router):
        return [router.choose("media:hot") for _ in range(40)]

    a, b = AffinityRouter(4, load_factor=1.25), AffinityRouter(4, load_factor=1.25)
    first, second = loads_for(a), loads_for(b)
    assert first == second  # deterministic
    assert first[0] == a.home("media:hot")
    assert max(a.loads()) <= math.ceil(1.25 * 40 / 4)
    assert sum(a.loads()) == 40
    stats = a.stats()["slots"]
    assert sum(s["home"] for s in stats) + sum(s["spilled_in"] for s in stats) == 40


@settings(max_examples=60, deadline=None)
@given(
    slots=st.integers(1, 8),
    ops=st.lists(st.tuples(st.integers(0, 20), st.booleans()), min_size=1, max_size=200),
    factor=st.sampled_from([1.0, 1.25, 2.0]),
)
def test_bounded_load_invariant(slots, ops, factor):
    """After every choose, the chosen slot holds at most max(1, ceil(c * total / up)) requests
    in flight, whatever the sequence of keys and releases."""
    router = AffinityRouter(slots, load_factor=factor)
    held: list[int] = []
    for key_index, release in ops:
        if release and held:
            router.release(held.pop(0))
            continue
        slot = router.choose(f"k{key_index}" if key_index else None)
        held.append(slot)
        loads = router.loads()
        assert loads[slot] <= max(1, math.ceil(factor * sum(loads) / slots))
        assert sum(loads) == len(held)


def test_min_load_keeps_a_warm_key_home():
    """With min_load 4, four concurrent requests about one image all stay on its home."""
    router = AffinityRouter(4, min_load=4)
    assert {router.choose("media:x") for _ in range(4)} == {router.home("media:x")}
    assert router.choose("media:x") != router.home("media:x")  # the fifth spills


def test_keyless_requests_go_to_the_least_loaded():
    """No key: the slot with the fewest requests in flight."""
    router = AffinityRouter(3)
    router.choose("media:a")
    router.choose("media:a")
    slots = [router.choose(None) for _ in range(4)]
    assert router.loads() == [2, 2, 2]
    assert router.stats()["slots"][slots[0]]["keyless"] >= 1


def test_down_slot_moves_only_its_keys_and_they_come_back():
    """Marking a slot down moves exactly the keys it owned (to other slots); marking it up
    again returns them; other keys never move (consistent hashing)."""
    router = AffinityRouter(4)
    before = {k: router.home(k) for k in KEYS[:400]}

    def route(key):
        slot = router.choose(key)
        router.release(slot)
        return slot

    router.mark_down(2)
    during = {k: route(k) for k in before}
    assert all(slot != 2 for slot in during.values())
    assert all(during[k] == s for k, s in before.items() if s != 2)
    assert router.mark_up(2) and not router.mark_up(2)
    assert {k: route(k) for k in before} == before


def test_no_replica_when_all_down_or_full():
    """All slots down: NoReplica(all_down=True); all at capacity: NoReplica(all_down=False)."""
    router = AffinityRouter(2, capacity=1)
    router.choose("a")
    router.choose("b")
    with pytest.raises(NoReplica) as full:
        router.choose("c")
    assert not full.value.all_down
    with pytest.raises(NoReplica):
        router.choose(None)
    router.mark_down(0)
    router.mark_down(1)
    with pytest.raises(NoReplica) as down:
        router.choose("a")
    assert down.value.all_down


def test_bad_settings_refused():
    """Zero slots and a load factor below 1 are errors, not silent defaults."""
    with pytest.raises(ValueError):
        AffinityRouter(0)
    with pytest.raises(ValueError):
        AffinityRouter(2, load_factor=0.5)


def test_falls_back_to_the_least_loaded_after_its_ring_choices():
    """With the key's home and its ring successor both at the bound, a keyed request goes
    to the least-loaded replica (counted as spilled), never past the bound."""
    router = AffinityRouter(4, load_factor=1.0, ring_choices=2)
    key = "media:hot"
    first = [router.choose(key) for _ in range(2)]  # home, then successor (bound 1 each)
    assert first[0] == router.home(key) and first[1] != first[0]
    third = router.choose(key)
    assert third not in first and router.loads()[third] == 1
    assert sum(s["spilled_in"] for s in router.stats()["slots"]) == 2
