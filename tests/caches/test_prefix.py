"""Invariants of caches.prefix: image-aware keys, longest usable prefix (never inside an image,
>= 1 token left), redundant-prefix stores, byte budget, token stats, brute-force agreement."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caches.prefix import ImageSpan, PrefixCache, PrefixEntry, make_key

PAD = 151655  # every image's placeholder token is the same id
Seg = int | tuple[str, int]  # a text token, or an image as (content_hash, n_tokens)
Prompt = tuple[list[int], list[ImageSpan]]


def P(*segs: Seg) -> Prompt:
    """Build (token_ids, spans) from text tokens and (hash, n) images."""
    ids: list[int] = []
    spans: list[ImageSpan] = []
    for s in segs:
        if not isinstance(s, int):
            spans.append(ImageSpan(len(ids), len(ids) + s[1], s[0]))
        ids.extend([s] if isinstance(s, int) else [PAD] * s[1])
    return ids, spans


def put(cache: PrefixCache, p: Prompt, nbytes: int = 10) -> bool:
    """Store p with an entry whose opaque kv records the prompt itself."""
    return cache.store(p[0], p[1], PrefixEntry(kv=p, length=len(p[0]), rope_delta=0, nbytes=nbytes))


def hit_tokens(cache: PrefixCache, p: Prompt) -> int:
    hit = cache.lookup(*p)
    assert hit is None or 0 < hit.tokens <= hit.entry.length and hit.tokens < len(p[0])
    return 0 if hit is None else hit.tokens


def test_make_key_replaces_each_image_run_by_its_hash() -> None:
    """Invariant: one str item per image, text stays ints, order kept; so different images
    behind identical placeholders, or swapped images, give different keys."""
    assert make_key(*P(1, ("a", 3), 2, ("b", 2))) == (1, "a", 2, "b") and make_key([], []) == ()
    ab, ba, ac = P(1, ("a", 2), ("b", 2)), P(1, ("b", 2), ("a", 2)), P(1, ("a", 2), ("c", 2))
    assert ab[0] == ba[0] == ac[0]
    assert len({make_key(*ab), make_key(*ba), make_key(*ac)}) == 3


def test_make_key_validates_spans() -> None:
    """Invariant: spans must be sorted, non-overlapping, non-empty, inside the prompt, hashed."""
    bad_spans = [[(2, 4, "a"), (0, 1, "b")], [(0, 3, "a"), (2, 4, "b")], [(3, 7, "a")]]
    bad_spans += [[(-1, 1, "a")], [(2, 2, "a")], [(0, 2, "")]]
    for bad in bad_spans:
        with pytest.raises(ValueError):
            make_key([PAD] * 6, [ImageSpan(*t) for t in bad])


def test_invalid_input_degrades_to_miss(caplog: pytest.LogCaptureFixture) -> None:
    """Invariant: a failure inside lookup/store is logged and becomes miss / not stored."""
    cache = PrefixCache(1000)
    bad = [ImageSpan(0, 9, "a")]
    ok = P(1, 2, 3)
    with caplog.at_level(logging.ERROR, logger="caches.prefix"):
        assert cache.lookup([PAD] * 4, bad) is None
        assert cache.store([PAD] * 4, bad, PrefixEntry(None, 4, 0, 1)) is False
        assert cache.store(ok[0], ok[1], PrefixEntry(None, 2, 0, 1)) is False  # length != 3
        assert cache.store(ok[0], ok[1], PrefixEntry(None, 3, 0, -1)) is False  # nbytes < 0
        assert cache.lookup([1, -5], []) is None  # negative ids are reserved
    assert len(caplog.records) == 5
    assert (cache.stats().misses, cache.stats().entries, cache.stats().tokens_queried) == (2, 0, 6)


# (invariant pinned, stored prompts separated by "|", query, expected hit tokens; 0 = miss).
# Prompt notation: "1 2 a4 3" = tokens 1, 2, then image "a" of 4 placeholders, then token 3.
LOOKUP_CASES = [
    ("longest-prefix-over-all-entries", "1 2 3 9 | 1 2 3 4 5 8 | 1 7", "1 2 3 4 5 6 7", 5),
    ("partial-use-of-longer-entry", "1 2 3 4 5 6", "1 2 3 7", 3),
    ("same-image-same-place-shares", "1 a4 2", "1 a4 5", 5),
    ("never-ends-inside-image", "1 a4 2", "1 b4 2", 1),
    ("same-hash-other-run-length-not-shared", "1 a4 2", "1 a3 2", 1),
    ("placeholder-ids-without-span-differ", "1 a2 2", f"1 {PAD} {PAD} 2", 1),
    ("full-match-leaves-one-token", "1 2 3", "1 2 3", 2),
    ("full-match-backs-off-to-trailing-image-start", "4 5 a3", "4 5 a3", 2),
    ("trailing-1-token-image-not-cut", "6 a1", "6 a1", 1),
    ("zero-usable-tokens-is-miss", "z3", "z3", 0),
    ("images-differing-only-in-hash-share-only-text-before", "1 2 a3 5 6", "1 2 b3 5 6", 2),
    ("swapped-images-share-only-text-before", "1 a2 2 b2 3", "1 b2 2 a2 3", 1),
    ("same-image-other-position", "1 a2 3", "1 3 a2 3", 1),
    ("same-image-after-other-text-misses", "1 a2 3", "9 a2 3", 0),
    ("text-only-prefix-sharing", "1 2 3 4 5 6 7 8", "1 2 3 4 5 99", 5),
    ("text-only-no-common-start-is-miss", "1 2 3 4 5 6 7 8", "2 3", 0),
]


def parse(text: str) -> Prompt:
    return P(*(int(w) if w.isdigit() else (w[0], int(w[1:])) for w in text.split()))


@pytest.mark.parametrize(
    "stored, query, expected", [c[1:] for c in LOOKUP_CASES], ids=[c[0] for c in LOOKUP_CASES]
)
def test_lookup_cases(stored: str, query: str, expected: int) -> None:
    """Invariant per case id; in every case the served tokens are the query's own tokens."""
    cache = PrefixCache(1000)
    for p in stored.split("|"):
        assert put(cache, parse(p)) is True
    assert hit_tokens(cache, parse(query)) == expected
    if (hit := cache.lookup(*parse(query))) is not None:
        assert annotate(hit.entry.kv)[: hit.tokens] == annotate(parse(query))[: hit.tokens]
    assert cache.stats().misses == (0 if expected else 2)


def test_store_strict_prefix_is_redundant_and_touches_longer() -> None:
    """Invariant: storing a strict prefix of a stored key stores nothing, returns True and
    marks the longer entry recently used."""
    cache = PrefixCache(30)
    assert all(put(cache, parse(text)) for text in ("1 a2 3 4", "7 8"))
    assert put(cache, P(1, ("a", 2), 3)) is True
    assert (cache.stats().entries, cache.stats().insertions) == (2, 2)
    put(cache, P(9), nbytes=15)  # evicts the LRU entry, which is now (7, 8)
    assert cache.lookup(*P(7, 8, 0)) is None
    assert hit_tokens(cache, P(1, ("a", 2), 3, 4, 5)) == 5


def test_store_extension_replaces_shorter_entries() -> None:
    """Invariant: storing a key that extends stored keys removes them (not an eviction),
    freeing their bytes; an equal key replaces the old entry."""
    cache = PrefixCache(1000)
    for text, nbytes in (("1 2", 20), ("1 2 3 4", 40), ("5", 5)):
        put(cache, parse(text), nbytes)
    assert put(cache, P(1, 2, 3, 4, 5, 6), nbytes=60) is True
    assert put(cache, P(5), nbytes=7) is True
    assert (cache.stats().entries, cache.stats().bytes, cache.stats().evictions) == (2, 67, 0)
    check_internals(cache)


def test_budget_holds_and_evictions_counted() -> None:
    """Invariant: stored bytes never exceed capacity; LRU evictions are counted; an entry over
    the whole budget is rejected and removes nothing; an evicted image can come back."""
    cache = PrefixCache(100)
    for i in range(50):
        assert put(cache, P(i + 1000, (f"h{i % 20}", 3), 1), nbytes=7 + i % 13) is True
        assert cache.stats().bytes <= 100
        check_internals(cache)
    s = cache.stats()
    assert s.insertions == 50 and s.evictions == 50 - s.entries > 0
    assert put(cache, P(1049, ("h9", 3), 1, 2), nbytes=101) is False
    assert cache.stats().rejected == 1 and hit_tokens(cache, P(1049, ("h9", 3), 1, 2)) == 5
    put(cache, P(1000, ("h0", 3), 1))
    assert hit_tokens(cache, P(1000, ("h0", 3), 2)) == 4


def test_hit_touches_entry() -> None:
    """Invariant: the entry used by a hit becomes most recently used."""
    cache = PrefixCache(20)
    assert all(put(cache, parse(text)) for text in ("1 2", "3 4"))
    assert hit_tokens(cache, P(1, 2, 5)) == 2
    put(cache, P(6, 7))  # evicts (3, 4)
    assert cache.lookup(*P(3, 4, 5)) is None and hit_tokens(cache, P(1, 2, 5)) == 2


def test_stats_count_tokens_and_lookups() -> None:
    """Invariant: one hit/miss per lookup; tokens_queried sums prompt lengths, tokens_hit sums
    hit tokens; clear() keeps counters."""
    cache = PrefixCache(1000)
    put(cache, P(1, 2, 3, 4))
    hit_tokens(cache, P(1, 2, 3, 4, 5))  # 4 hit of 5
    hit_tokens(cache, P(1, 2, 9))  # 2 hit of 3
    hit_tokens(cache, P(8, 9))  # miss, 2
    s = cache.stats()
    assert (s.hits, s.misses, s.tokens_queried, s.tokens_hit) == (2, 1, 10, 6)
    assert s.hit_rate == pytest.approx(2 / 3)
    cache.clear()
    assert (cache.stats().entries, cache.stats().bytes, cache.stats().tokens_queried) == (0, 0, 10)


def test_disabled_cache() -> None:
    """Invariant: capacity 0: every lookup misses (still counted), nothing is stored."""
    cache = PrefixCache(0)
    assert put(cache, P(1, 2, 3), nbytes=0) is False
    assert cache.lookup(*P(1, 2, 3, 4)) is None
    s = cache.stats()
    assert (s.entries, s.misses, s.tokens_queried, s.tokens_hit) == (0, 1, 4, 0)


def test_lookup_is_exact_among_many_long_entries() -> None:
    """Invariant: with 300 entries of 20k tokens sharing a 19k-token prefix, lookup still
    returns the entry with the longest match (speed is a benchmark concern, not asserted)."""
    cache = PrefixCache(10**9)
    shared, spans = list(range(19_000)), [ImageSpan(10, 500, "img")]
    for i in range(300):
        ids = shared + [100_000 + i] * 1000
        cache.store(ids, spans, PrefixEntry(i, len(ids), 0, 1000))
    query = shared + [100_000 + 7] * 500 + [5]
    hit = cache.lookup(query, spans)
    assert hit is not None and hit.entry.kv == 7 and hit.tokens == 19_500


def test_thread_safety_smoke() -> None:
    """Invariant: concurrent store/lookup/stats keep the budget and counters consistent."""
    cache = PrefixCache(500)

    def worker(t: int) -> None:
        for i in range(300):
            p = P(t % 3, (f"x{i % 7}", 2), i % 5, i)
            cache.lookup(*p)
            put(cache, p, nbytes=10 + i % 30)
            assert cache.stats().bytes <= 500

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(worker, range(6)))  # re-raises any worker's exception
    assert cache.stats().hits + cache.stats().misses == 1800 and cache.stats().bytes <= 500
    check_internals(cache)


# --- brute-force reference and white-box consistency ---------------------------------------


def annotate(p: Prompt) -> list[tuple]:
    """Per-token identity: text tokens by id, image tokens by (hash, offset, run length)."""
    ids, spans = p
    ann: list[tuple] = [("t", t) for t in ids]
    for sp in spans:
        for k in range(sp.start, sp.end):
            ann[k] = ("i", sp.content_hash, k - sp.start, sp.end - sp.start)
    return ann


def inside(t: int, spans: Sequence[ImageSpan]) -> ImageSpan | None:
    return next((sp for sp in spans if sp.start < t < sp.end), None)


def reference(query: Prompt, stored: list[Prompt]) -> int:
    """Token-level brute force: longest equal annotated prefix not cutting a query image,
    then leave one token (backing off to the start of an image that would be cut)."""
    q, best = annotate(query), 0
    for s in map(annotate, stored):
        t = 0
        while t < min(len(q), len(s)) and q[t] == s[t]:
            t += 1
        while (sp := inside(t, query[1])) is not None:
            t = sp.start
        best = max(best, t)
    if best >= len(q):
        best = len(q) - 1
        if (sp := inside(best, query[1])) is not None:
            best = sp.start
    return max(best, 0)


def check_internals(cache: PrefixCache) -> None:
    """White-box: the sorted index is exactly the LRU's keys, keys are prefix-free, and image
    reference counts match the stored entries."""
    assert cache._sorted == sorted(cache._lru.keys())
    assert not any(b[: len(a)] == a for a, b in zip(cache._sorted, cache._sorted[1:]))
    refs = Counter(img for _, rec in cache._lru.items() for img in rec.images)
    assert {img: slot[1] for img, slot in cache._images.items()} == dict(refs)


segment = st.one_of(st.integers(1, 3), st.tuples(st.sampled_from("ab"), st.integers(1, 3)))
segments = st.lists(segment, max_size=8)


@settings(max_examples=300, deadline=None, database=None)
@given(
    stored=st.lists(segments.filter(bool), max_size=6),
    capacity=st.sampled_from([10**6, 25, 40]),
    data=st.data(),
)
def test_lookup_matches_brute_force(
    stored: list[list[Seg]], capacity: int, data: st.DataObject
) -> None:
    """Invariant: lookup == token-level brute force over every prompt still served (with a
    large budget: every stored prompt, redundant prefixes included; with a small one: the
    entries left after evictions), and the served tokens really are the query's tokens."""
    cache = PrefixCache(capacity)
    for segs in stored:
        assert put(cache, P(*segs)) is True
        check_internals(cache)
    served = [P(*s) for s in stored]
    if capacity < 10**6:
        served = [rec.entry.kv for _, rec in cache._lru.items()]
    queries = [data.draw(segments)]
    for segs in stored:
        cut = data.draw(st.integers(0, len(segs)))
        queries.append(segs[:cut] + data.draw(segments))
    for q_segs in queries:
        q = P(*q_segs)
        hit = cache.lookup(*q)
        assert (hit.tokens if hit else 0) == reference(q, served)
        if hit is not None:
            assert annotate(hit.entry.kv)[: hit.tokens] == annotate(q)[: hit.tokens]
    assert cache.stats().tokens_queried == sum(len(P(*q)[0]) for q in queries)


def test_peek_counts_nothing_and_matches_lookup() -> None:
    """Invariant: peek reports what lookup would serve, without touching stats or recency."""
    cache = PrefixCache(10**6)
    ids, spans = [1, 2, 3, 4, 5, 6], [ImageSpan(1, 4, "a")]
    cache.store(ids, spans, PrefixEntry("kv", 6, 0, 10))
    before = cache.stats()
    query = [1, 2, 3, 4, 5, 9, 9]
    assert cache.peek(query, spans) == 5
    assert cache.stats() == before
    hit = cache.lookup(query, spans)
    assert hit is not None and hit.tokens == 5
    assert cache.peek([7, 7], []) == 0
