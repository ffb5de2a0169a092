"""Invariants of caches.scope: a scope tag names (tenant, salt) so two scopes never produce
equal keys, the shared scope leaves every key as it was, and tags parse back to tenants."""

from __future__ import annotations

import pytest

from caches.prefix import ImageSpan, block_keys, key_items
from caches.scope import (
    check_tenant,
    scope_of_hash,
    scope_of_item,
    scope_tag,
    scoped_hash,
    scoped_item,
    tenant_of,
)

PIXELS = "0123456789abcdef" * 2


def test_the_shared_scope_changes_no_key() -> None:
    """Invariant: tag "" (no tenant, no salt) leaves hashes, items and block keys unchanged,
    so a single-key server keeps every entry and file it had."""
    assert scope_tag("", "") == ""
    assert scoped_hash(PIXELS, "") == PIXELS and scoped_item(7, "") == 7
    ids, spans = [1, 2, 3, 9, 9, 4, 5, 6], [ImageSpan(3, 5, PIXELS)]
    assert key_items(ids, spans, "") == key_items(ids, spans)


def test_tenants_and_salts_make_distinct_tags_that_parse_back() -> None:
    """Invariant: every (tenant, salt) pair is its own tag; the tenant parses back; the salt
    is stored only as a digest."""
    pairs = [("alice", ""), ("bob", ""), ("alice", "s1"), ("alice", "s2"), ("bob", "s1")]
    pairs.append(("", "s1"))
    tags = [scope_tag(t, s) for t, s in pairs]
    assert len(set(tags)) == len(tags) and "" not in tags
    assert [tenant_of(tag) for tag in tags] == [t for t, _ in pairs]
    assert all("s1" not in tag.partition("+")[2] for tag in tags)


def test_scoped_keys_differ_between_scopes_from_the_first_item_on() -> None:
    """Invariant: the same prompt in two scopes has different key items and different block
    keys for every block (the disk tier's files), and the scope parses back from both the
    first item and an image's hash."""
    ids, spans = [1, 2, 3, 4, 9, 9, 9, 9], [ImageSpan(4, 8, PIXELS)]
    a, b = scope_tag("alice", ""), scope_tag("bob", "")
    items_a = key_items(ids, [ImageSpan(4, 8, scoped_hash(PIXELS, a))], a)
    items_b = key_items(ids, [ImageSpan(4, 8, scoped_hash(PIXELS, b))], b)
    shared = key_items(ids, spans)
    keys = [block_keys(items, 4, 2) for items in (items_a, items_b, shared)]
    assert all(keys[i][k] != keys[j][k] for i in range(3) for j in range(i) for k in range(2))
    assert scope_of_item(items_a[0]) == a and scope_of_item(shared[0]) == ""
    assert scope_of_hash(scoped_hash(PIXELS, b)) == b
    assert scoped_hash(PIXELS, a).startswith(PIXELS)  # what /v1/cache/entries shows


def test_an_image_first_prompt_still_carries_its_scope() -> None:
    """Invariant: a prompt whose first token is an image keeps the scope on its first item."""
    tag = scope_tag("alice", "")
    items = key_items([9, 9, 1], [ImageSpan(0, 2, scoped_hash(PIXELS, tag))], tag)
    assert scope_of_item(items[0]) == tag and isinstance(items[1], str)


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "é", "a+b", "a@b", "(shared)"])
def test_bad_tenant_names_are_refused(name: str) -> None:
    """Invariant: only 1-64 of letters, digits, _ . - name a tenant (tags must parse back)."""
    with pytest.raises(ValueError):
        check_tenant(name)
