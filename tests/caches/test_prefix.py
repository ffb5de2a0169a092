"""Invariants of caches.prefix (a radix tree of KV blocks): image-aware block keys, each block
stored once however many prompts share it, longest usable prefix in whole blocks (never
inside an image without the exact rule, >= 1 token left), byte budget with LRU over leaves,
sharing stats, brute-force agreement. No MLX: block values are opaque."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from caches.prefix import ImageSpan, PrefixCache, block_keys, key_items
from caches.radix import Block

PAD = 151655  # every image's placeholder token is the same id
B = 4  # block tokens in these tests
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


class Maker:
    """make_block that records which blocks it was asked for; values name prompt and block."""

    def __init__(self, tag: str, nbytes: int = 10) -> None:
        self.tag, self.nbytes, self.made = tag, nbytes, []

    def __call__(self, k: int) -> Block:
        self.made.append(k)
        return Block((self.tag, k), self.nbytes)


def put(cache: PrefixCache, p: Prompt, tag: str = "x", nbytes: int = 10) -> Maker:
    make = Maker(tag, nbytes)
    cache.store(p[0], p[1], make)
    return make


def hit_tokens(cache: PrefixCache, p: Prompt, align: int = 1) -> int:
    hit = cache.lookup(*p, align=align)
    if hit is None:
        return 0
    assert 0 < hit.tokens <= len(hit.blocks) * B and hit.tokens < len(p[0])
    assert len(hit.blocks) == -(-hit.tokens // B)  # no block beyond what is used
    return hit.tokens


def test_key_items_tag_each_image_token_with_its_hash() -> None:
    """Invariant: text stays ints; every token of an image run becomes that image's tag
    (hash and run length), so different images behind identical placeholders differ."""
    items = key_items(*P(1, ("a", 3), 2))
    assert items[0] == 1 and items[4] == 2 and items[1:4] == ["a:3"] * 3
    assert key_items(*P(1, ("a", 3))) != key_items(*P(1, ("b", 3)))
    for bad in ([(2, 4, "a"), (0, 1, "b")], [(0, 3, "a"), (2, 4, "b")], [(3, 7, "a")]):
        with pytest.raises(ValueError):
            key_items([PAD] * 6, [ImageSpan(*t) for t in bad])


def test_shared_blocks_are_stored_once_and_built_once() -> None:
    """Invariant: a second prompt sharing whole blocks with a stored one makes and stores only
    its own blocks; stats count each block once and the entries it stands for."""
    cache = PrefixCache(10_000, block_tokens=B)
    system = list(range(100, 108))  # two blocks
    a = P(*system, ("img", 8), 1, 2, 3, 4)  # 5 blocks
    b = P(*system, ("img", 8), 5, 6, 7, 8)
    assert put(cache, a, "a").made == [0, 1, 2, 3, 4]
    assert put(cache, b, "b").made == [4]  # the system prompt and the image are shared
    s = cache.stats()
    assert (s.blocks, s.shared_blocks, s.entries, s.bytes) == (6, 4, 2, 60)
    assert (s.stored_tokens, s.unique_tokens) == (40, 24) and s.sharing_ratio == 40 / 24
    assert s.bytes_per_token == 60 / 24  # held bytes per held token: each block once
    hit = cache.lookup(b[0] + [9], b[1])
    assert hit is not None and hit.tokens == 20
    assert hit.blocks == (("a", 0), ("a", 1), ("a", 2), ("a", 3), ("b", 4))  # as stored


def test_a_conversation_holds_its_kv_once() -> None:
    """Invariant: 50 turns, each prompt extending the last, hold the last prompt's whole
    blocks once (the snapshot cache held every turn again: ~25x)."""
    cache = PrefixCache(10**9, block_tokens=B)
    ids: list[int] = [1, 2, 3]
    spans = [ImageSpan(3, 19, "img")]
    ids += [PAD] * 16
    for turn in range(50):
        ids += [turn % 7 + 10] * (5 + turn % 4)
        cache.store(ids, spans, Maker("t"))
    s = cache.stats()
    assert s.unique_tokens == len(ids) // B * B and s.bytes == s.blocks * 10
    assert s.entries == 1 and s.shared_blocks == 0


def test_different_images_share_only_the_text_before_them() -> None:
    """Invariant: another image (same placeholders) shares no block that holds any of its
    tokens; one that differs only in run length does not either."""
    cache = PrefixCache(10_000, block_tokens=B)
    put(cache, P(1, 2, 3, 4, 5, 6, ("x", 8), 7, 8))
    assert hit_tokens(cache, P(1, 2, 3, 4, 5, 6, ("y", 8), 7, 8)) == 6  # part of block 1
    assert hit_tokens(cache, P(1, 2, 3, 4, 5, 6, ("x", 9), 7, 8)) == 6
    assert hit_tokens(cache, P(1, 2, 3, 4, 5, 6, ("y", 8), 7, 8), align=B) == 4
    assert hit_tokens(cache, P(1, 2, 3, 4, 5, 6, ("x", 8), 7, 8, 9)) == 16  # control


def test_hit_never_ends_inside_an_image_and_leaves_one_token() -> None:
    """Invariant: align 1: a hit that would end inside an image stops at its start, and one
    token is always left; align B: whole blocks only, possibly inside an image."""
    cache = PrefixCache(10_000, block_tokens=B)
    p = P(1, 2, ("x", 8), 3, 4, 5, 6)  # 14 tokens: blocks end at 4 (in the image), 8, 12
    put(cache, p)
    assert hit_tokens(cache, P(1, 2, ("x", 8), 3, 4, 5, 6, 7)) == 12
    assert hit_tokens(cache, p) == 12  # 13 would be allowed but only whole blocks are stored
    short = P(1, 2, ("x", 8), 3, 4)  # 12 tokens: 3 stored blocks cover it all, 1 left
    assert hit_tokens(cache, short) == 11  # part of the last block: text after the image
    assert hit_tokens(cache, P(1, 2, ("x", 8)), align=1) == 2  # 8 or 9: inside the image
    assert hit_tokens(cache, P(1, 2, ("x", 8)), align=B) == 8
    assert hit_tokens(cache, P(1, 2, 3, 4, 5)) == 2  # the text before the image, in block 0
    assert hit_tokens(cache, P(1, 2, 3, 4, 5), align=B) == 0


def test_budget_evicts_lru_leaves_and_counts_blocks() -> None:
    """Invariant: bytes never exceed capacity; eviction takes the least recently used leaf
    (a hit refreshes its whole path), then its parent once that is a leaf; a prompt over the
    whole budget keeps the blocks that fit and is counted rejected."""
    cache = PrefixCache(60, block_tokens=B)
    shared = [9] * 4
    a, b, c = P(*shared, 1, 1, 1, 1), P(*shared, 2, 2, 2, 2), P(*shared, 3, 3, 3, 3)
    for p in (a, b, c):
        put(cache, p)  # 1 shared block + 3 leaves: 40 bytes
    assert hit_tokens(cache, P(*a[0], 0)) == 8  # a is now the most recent
    put(cache, P(7, 7, 7, 7, 8, 8, 8, 8, 6, 6, 6, 6))  # 3 blocks: evicts b's leaf
    s = cache.stats()
    assert s.bytes == 60 and s.evictions == 1 and s.blocks == 6
    put(cache, P(4, 4, 4, 4))  # evicts c's leaf, the least recent one left
    assert cache.stats().evictions == 2
    assert hit_tokens(cache, P(*b[0], 0)) == hit_tokens(cache, P(*c[0], 0)) == 4
    assert hit_tokens(cache, P(*a[0], 0)) == 8
    put(cache, P(5, 5, 5, 5))  # the 7/8/6 leaf (least recent), then its parent: a leaf now
    put(cache, P(6, 6, 6, 6))
    assert cache.stats().evictions == 4 and cache.peek(*P(7, 7, 7, 7, 8, 8, 8, 8, 0)) == 4
    assert hit_tokens(cache, P(*a[0], 0)) == 8
    put(cache, P(*[5] * 40))  # 10 blocks of 10 bytes: over the whole budget
    s = cache.stats()
    assert s.rejected == 1 and s.bytes <= 60


def test_lookup_counts_tokens_and_peek_counts_nothing() -> None:
    """Invariant: one hit/miss per lookup, tokens summed; peek reports the same tokens and
    changes no counter; clear() drops blocks, keeps counters."""
    cache = PrefixCache(10_000, block_tokens=B)
    p = P(1, 2, 3, 4, 5, 6, 7, 8, 9)
    put(cache, p)
    assert cache.peek(*p) == 8
    before = cache.stats()
    assert (before.hits, before.misses, before.tokens_queried) == (0, 0, 0)
    hit_tokens(cache, p)
    hit_tokens(cache, P(5, 5))
    s = cache.stats()
    assert (s.hits, s.misses, s.tokens_queried, s.tokens_hit) == (1, 1, 11, 8)
    cache.clear()
    assert cache.stats().blocks == 0 and cache.stats().hits == 1 and cache.peek(*p) == 0


def test_disabled_cache_and_bad_input_degrade(caplog: pytest.LogCaptureFixture) -> None:
    """Invariant: capacity 0 stores nothing and misses (counted); a bad span or a failing
    make_block is logged and becomes a miss / not stored."""
    off = PrefixCache(0, block_tokens=B)
    assert not off.store([1] * 8, [], Maker("x")) and off.lookup([1] * 9, []) is None
    assert off.stats().misses == 1
    cache = PrefixCache(100, block_tokens=B)
    with caplog.at_level(logging.ERROR):
        assert cache.lookup([1] * 9, [ImageSpan(3, 99, "x")]) is None

        def boom(k: int) -> Block:
            raise RuntimeError("no KV")

        assert not cache.store([1] * 8, [], boom)
    assert "prefix cache" in caplog.text and cache.stats().misses == 1


def test_configure_changes_block_size_and_drops_blocks() -> None:
    """Invariant: a new block size drops every block (their edges were another size)."""
    cache = PrefixCache(1000, block_tokens=B)
    put(cache, P(*range(8)))
    cache.configure(B)
    assert cache.stats().blocks == 2
    cache.configure(2)
    assert cache.stats().blocks == 0 and cache.block_tokens == 2


def test_entries_share_bytes_and_list_images() -> None:
    """Invariant: entries are the leaves; their bytes (shares of shared blocks) sum to the
    cache's bytes; each lists its images' hashes in prompt order."""
    cache = PrefixCache(10_000, block_tokens=B)
    put(cache, P(1, ("h1", 6), 2, ("h2", 3), 3, 4, 5), nbytes=7)
    put(cache, P(1, ("h1", 6), 9, 9, 9, 9, 9), nbytes=7)
    entries = cache.entries()
    assert sum(e.nbytes for e in entries) == cache.stats().bytes == 7 * 5  # 1 shared
    assert sorted(e.pixel_hashes for e in entries) == [("h1",), ("h1", "h2")]


def test_thread_safety_smoke() -> None:
    """Invariant: concurrent store/lookup/stats keep the budget and counters consistent."""
    cache = PrefixCache(500, block_tokens=B)

    def work(i: int) -> None:
        for j in range(50):
            p = P(i % 3, *[j % 5] * 6, ("img", 5), i, j)
            put(cache, p)
            hit_tokens(cache, p)
            assert cache.stats().bytes <= 500

    with ThreadPoolExecutor(4) as pool:
        list(pool.map(work, range(8)))
    s = cache.stats()
    assert s.hits + s.misses == 400 and s.bytes <= 500


def _brute(stored: Sequence[Prompt], query: Prompt, align: int) -> int:
    """Longest prefix of the query's key items among stored prompts' whole blocks (rounded
    down to `align`), capped to leave a token and (align 1) not end inside an image."""
    q = key_items(*query)
    best = 0
    for ids, spans in stored:
        s = key_items(ids, spans)[: len(ids) // B * B]
        m = 0
        while m < min(len(s), len(q)) and s[m] == q[m]:
            m += 1
        best = max(best, m)
    best = min(best, len(q) - 1)
    if align > 1:
        return best // align * align
    for sp in query[1]:
        if sp.start < best < sp.end:
            best = sp.start
    return max(best, 0)


_seg = st.one_of(st.integers(1, 3), st.tuples(st.sampled_from(["a", "b"]), st.integers(2, 5)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(_seg, min_size=1, max_size=8), min_size=1, max_size=6), st.data())
def test_lookup_matches_brute_force(stored: list[list[Seg]], data: st.DataObject) -> None:
    """Invariant: with a budget that holds everything, lookup == brute force over every
    stored prompt, and the stats count each distinct block once."""
    cache = PrefixCache(10**6, block_tokens=B)
    prompts = [P(*segs) for segs in stored]
    for p in prompts:
        put(cache, p)
    query = P(*data.draw(st.lists(_seg, min_size=1, max_size=10)))
    assert hit_tokens(cache, query) == _brute(prompts, query, 1)
    assert hit_tokens(cache, query, align=B) == _brute(prompts, query, B)
    distinct = {tuple(key_items(*p)[: (k + 1) * B]) for p in prompts for k in range(len(p[0]) // B)}
    assert cache.stats().blocks == len(distinct)


def test_block_keys_name_the_whole_prefix() -> None:
    """Invariant (the disk tier's file names): block k's key is equal for two prompts exactly
    when their first k+1 blocks are equal (text and images, in order), as tree paths are."""
    a = key_items(*P(1, 2, 3, 4, ("img-a", 4), 9, 9, 9, 9))
    b = key_items(*P(1, 2, 3, 4, ("img-b", 4), 9, 9, 9, 9))
    c = key_items(*P(1, 2, 3, 5, ("img-a", 4), 9, 9, 9, 9))
    ka, kb, kc = (block_keys(x, B, 3) for x in (a, b, c))
    assert ka[0] == kb[0] and ka[1] != kb[1] and ka[2] != kb[2]  # differ from the image on
    assert all(x != y for x, y in zip(ka, kc))  # an early difference changes every key
    assert block_keys(a, B, 2) == ka[:2] and len(set(ka)) == 3
    assert all(len(k) == 32 and k.isalnum() for k in ka)
    with pytest.raises(ValueError):
        block_keys(a, B, 4)  # only 3 whole blocks


def test_find_counts_nothing_and_stored_blocks_counts_whole_blocks() -> None:
    """Invariant: `find` returns what `lookup` would without counting a query; and
    `stored_blocks` is the number of the prompt's leading whole blocks in the tree."""
    cache = PrefixCache(1000, block_tokens=B)
    stored = P(*range(1, 11))  # 10 tokens: 2 whole blocks stored
    put(cache, stored)
    longer = P(*range(1, 15))
    assert cache.stored_blocks(*longer) == 2 and cache.stored_blocks(*P(7, 7, 7, 7, 7)) == 0
    hit = cache.find(*longer, align=B)
    assert hit is not None and hit.tokens == 8
    s = cache.stats()
    assert (s.hits, s.misses, s.tokens_queried) == (0, 0, 0)
    assert PrefixCache(0, block_tokens=B).stored_blocks(*longer) == 0


def _scoped(tenant: str, p: Prompt, salt: str = "") -> tuple[Prompt, str]:
    """The prompt as a request of `tenant` (with `salt`) sends it: images' hashes scoped."""
    from caches.scope import scope_tag, scoped_hash

    tag = scope_tag(tenant, salt)
    spans = [ImageSpan(s.start, s.end, scoped_hash(s.content_hash, tag)) for s in p[1]]
    return (p[0], spans), tag


@pytest.mark.parametrize("align", [1, B])
def test_two_scopes_never_share_a_block_and_one_scope_keeps_its_hits(align: int) -> None:
    """Invariant: a prompt stored in one scope (tenant, or tenant + salt) is a miss in every
    other scope, text and images alike, and a hit in its own, as in the shared scope."""
    base = P(1, 2, 3, ("img", 4), 5, 6, 7, 8, 9, 10, 11)
    text = P(*range(1, 14))
    for prompt in (base, text):
        cache = PrefixCache(10_000, B)
        (ids, spans), alice = _scoped("alice", prompt)
        assert cache.store(ids, spans, Maker("a"), scope=alice)
        for tenant, salt in (("bob", ""), ("alice", "salt"), ("", "")):
            (o_ids, o_spans), tag = _scoped(tenant, prompt, salt)
            assert cache.lookup(o_ids, o_spans, align, scope=tag) is None
            assert cache.stored_blocks(o_ids, o_spans, scope=tag) == 0
        hit = cache.lookup(ids, spans, align, scope=alice)
        assert hit is not None and hit.tokens == (len(ids) - 1) // B * B
    stats = cache.tenant_stats()
    assert stats["alice"]["hits"] == 1 and stats["bob"]["hits"] == 0
    assert stats["alice"]["entries"] == 1 and stats["alice"]["bytes"] == 30


def test_a_tenant_at_its_share_evicts_its_own_blocks_not_others() -> None:
    """Invariant: with tenant_share 0.5, a tenant storing past half the budget loses its own
    least recently used entries; another tenant's and the shared scope's blocks stay."""
    cache = PrefixCache(200, B, tenant_share=0.5)
    (b_ids, b_spans), bob = _scoped("bob", P(*range(100, 109)))
    cache.store(b_ids, b_spans, Maker("b"), scope=bob)  # 2 blocks, 20 bytes
    shared = P(*range(200, 209))
    put(cache, shared)
    for i in range(10):  # alice stores 10 different 2-block prompts (200 bytes in all)
        (ids, spans), alice = _scoped("alice", P(*range(i * 10, i * 10 + 9)))
        cache.store(ids, spans, Maker(f"a{i}"), scope=alice)
    stats = cache.tenant_stats()
    assert stats["alice"]["bytes"] <= 100 and stats["alice"]["entries"] == 5
    assert cache.stored_blocks(b_ids, b_spans, scope=bob) == 2
    assert cache.stored_blocks(*shared) == 2
    (ids, spans), alice = _scoped("alice", P(*range(90, 99)))
    assert cache.stored_blocks(ids, spans, scope=alice) == 2  # the newest stayed


def test_snapshot_blocks_are_counted_in_bytes_stats_and_hits() -> None:
    """Invariant: a block's state snapshot (hybrid models) is part of its bytes against the
    budget; stats count blocks holding one, their bytes and hits whose last block holds one
    (the snapshot a hit restores); eviction takes them out of the counts."""
    cache = PrefixCache(capacity_bytes=60, block_tokens=B)
    first = P(*range(9))  # two whole blocks
    cache.store(*first, lambda k: Block(("s", k), 30, snapshot_nbytes=20))
    hit = cache.lookup(*first, align=B)
    assert hit is not None and hit.snapshot and hit.tokens == 2 * B
    stats = cache.stats()
    assert (stats.snapshots, stats.snapshot_bytes, stats.snapshot_hits) == (2, 40, 1)
    assert stats.bytes == 60
    other = P(*range(100, 109))  # 60 bytes more than the budget: the first entry goes
    cache.store(*other, lambda k: Block(("kv", k), 30))
    stats = cache.stats()
    assert (stats.snapshots, stats.snapshot_bytes, stats.bytes) == (0, 0, 60)
    hit = cache.lookup(*other, align=B)
    assert hit is not None and not hit.snapshot
    assert cache.stats().snapshot_hits == 1
