"""Cache scopes: which requests may share a cache entry.

A request's scope is a tag built from its tenant (the name of the API key it came with, when
the server scopes caches by tenant) and its `cache_salt` (vLLM's field: scopes further, within
a tenant). The tag is part of every cache key, so two scopes can never share an entry:

- an image's content hash becomes `<pixel hash>@<tag>` (`scoped_hash`): the vision cache's
  key, the image tags of the prefix cache's key items, the disk tier's file names and the
  engine's de-duplication of images encoded together all use it;
- a prompt's first key item in the prefix cache's radix tree carries the tag
  (`scoped_item`), so a text-only prompt of one scope never walks another scope's blocks
  either, and the chained disk-file keys of its blocks differ from the first block on.

The empty tag is the unscoped (shared) scope: keys are exactly what they were before scopes
existed, so a server with one key (or none) keeps every entry and file it had.

A tag is `<tenant>` or `<tenant>+<salt digest>`; the salt itself is never stored (a digest of
16 hex characters), and tenant names are restricted (`check_tenant`) so that the tag parses
back (`tenant_of`). Pure functions, thread-safe.
"""

from __future__ import annotations

import re

import xxhash

SCOPE_MARK = "@"  # between a content hash and its scope tag; never in a hex hash
SALT_MARK = "+"  # between the tenant and the salt digest inside a tag
_TENANT = re.compile(r"[A-Za-z0-9_.-]{1,64}")
MAX_SALT_CHARS = 256


def check_tenant(name: str) -> str:
    """`name` if it is a valid tenant name (1-64 of A-Z a-z 0-9 _ . -), else ValueError."""
    if not _TENANT.fullmatch(name):
        raise ValueError(
            f"tenant name {name!r} must be 1-64 characters of letters, digits, '_', '.' or '-'"
        )
    return name


def scope_tag(tenant: str, salt: str) -> str:
    """The tag of (tenant, salt): "" when both are empty (the shared scope). `tenant` "" is
    the shared scope's tenant (a server that does not scope by tenant); a salt adds its
    digest, so the same salt of two tenants still makes two scopes."""
    if tenant:
        check_tenant(tenant)
    if not salt:
        return tenant
    return f"{tenant}{SALT_MARK}{xxhash.xxh3_64_hexdigest(salt.encode('utf-8'))}"


def tenant_of(tag: str) -> str:
    """The tenant part of a scope tag ("" for the shared scope or a salt without a tenant)."""
    return tag.partition(SALT_MARK)[0]


def scoped_hash(content_hash: str, tag: str) -> str:
    """An image's content hash within a scope: unchanged in the shared scope. Its leading
    characters stay the pixel hash (what `/v1/cache/entries` shows)."""
    return f"{content_hash}{SCOPE_MARK}{tag}" if tag else content_hash


def scope_of_hash(content_hash: str) -> str:
    """The scope tag a content hash was scoped with (`scoped_hash`), "" for none."""
    return content_hash.partition(SCOPE_MARK)[2]


def scoped_item(item: int | str, tag: str) -> int | str:
    """A prompt's first key item within a scope: unchanged in the shared scope, else a str
    that no token id (an int) and no image tag (it starts with a hex hash) can equal."""
    return f"{SCOPE_MARK}{tag}|{item}" if tag else item


def scope_of_item(item: object) -> str:
    """The scope tag of a prompt's first key item (`scoped_item`), "" for none."""
    if isinstance(item, str) and item.startswith(SCOPE_MARK):
        return item[1:].partition("|")[0]
    if isinstance(item, str):  # an image tag: "<content hash>:<run>"
        return scope_of_hash(item.rpartition(":")[0])
    return ""
