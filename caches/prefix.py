"""The image-aware prefix (KV) cache: a radix tree of fixed-size KV blocks (caches/radix.py).

A prompt is cut into blocks of `block_tokens` positions at absolute offsets [k*B, (k+1)*B)
(the exact-reuse rule's blocks, docs/caching.md). Block k's edge key is its key items: text
tokens as ints, and each image token as the image's tag `"<content hash>:<run length>"`, so
an image's placeholder run says *which* image it is. A block's KV depends on everything
before it, which the path from the root fixes; so two prompts share exactly the blocks whose
whole prefix (text and images, in order) is equal, and different images never share a block
past the text before them. Only whole blocks are stored; each is stored once, however many
entries (leaves) contain it. Without the exact rule (`align` 1) a hit may also use the
leading tokens of a stored block (the one sharing most with the prompt's next tokens).

Scopes (caches/scope.py): `scope` (a tag, "" for the shared scope) marks a prompt's first key
item, so two scopes share no block, in the tree or on disk (`block_keys` chains from it); its
tenant owns the branch and may hold at most `tenant_share` of the budget (radix.py). Lookups,
tokens, entries and bytes are also counted per tenant (`tenant_stats`).

Values are opaque (an MLX KV block; no mlx/numpy/PIL here), never sliced or mutated: a hit
returns the path's block values and how many of their tokens to use; the caller assembles
them. Budgets are bytes given by the caller. Any exception inside `lookup`/`store` is logged
and becomes a miss / "not stored". Thread safety: one lock guards every public method (the
engine thread stores and looks up; other threads peek and read stats).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from caches.entries import CacheEntryInfo
from caches.lru import LRUStats
from caches.prompt_key import ImageSpan, edge_tenant, key_items
from caches.prompt_key import block_keys as block_keys  # re-exported: the disk tier's names
from caches.radix import Block, BlockTree, Edge, Node
from caches.scope import tenant_of
from caches.tenants import TenantCounters

logger = logging.getLogger(__name__)

DEFAULT_BLOCK_TOKENS = 32


@dataclass(frozen=True)
class PrefixHit:
    """Use the first `tokens` tokens of the concatenated `blocks` (each `block_tokens` long,
    in prompt order): 0 < tokens <= len(blocks) * block_tokens, < the prompt's length.
    rope_delta is that after the last block's end (recompute it for a shorter cut)."""

    blocks: tuple[Any, ...]
    tokens: int
    rope_delta: int
    snapshot: bool = False  # its last block carries a state snapshot (hybrid models)


@dataclass(frozen=True)
class PrefixStats(LRUStats):
    """Counters, with `insertions`/`evictions` counted in blocks and `entries` the leaves.
    stored_tokens: tokens the entries stand for (what one snapshot per entry would hold);
    unique_tokens: tokens actually held (each block once); sharing_ratio: their quotient;
    bytes_per_token: bytes held per token held (what a cached token costs: 2x / 4x less
    under --kv-bits 8 / 4)."""

    tokens_queried: int
    tokens_hit: int
    block_tokens: int
    blocks: int
    shared_blocks: int
    stored_tokens: int
    unique_tokens: int
    sharing_ratio: float
    bytes_per_token: float = 0.0
    # Hybrid models (recurrent layers): blocks holding a state snapshot at their end, the
    # bytes of those snapshots (part of `bytes`), and hits restored from one.
    snapshots: int = 0
    snapshot_bytes: int = 0
    snapshot_hits: int = 0


def _leave_one(tokens: int, n: int, spans: Sequence[ImageSpan]) -> int:
    """Cap a hit so at least one token is left to prefill (the model needs logits for the last
    position), without ending inside an image: an image is encoded as a whole."""
    tokens = min(tokens, n - 1)
    for sp in spans:
        if sp.start < tokens < sp.end:
            return sp.start
    return tokens


class PrefixCache:
    """Byte-bounded block radix tree of prompt KV, looked up by longest stored block prefix.

    `capacity_bytes` of 0 disables: lookups miss (and are counted), stores return False.
    `block_tokens` is the block size B; changing it (`configure`) drops every block.
    `tenant_share` (0 < share <= 1): the part of the budget one tenant's branches may hold.
    Every method taking a prompt takes its `scope` tag too ("" for the shared scope).
    """

    def __init__(
        self,
        capacity_bytes: int,
        block_tokens: int = DEFAULT_BLOCK_TOKENS,
        clock: Callable[[], float] = time.monotonic,
        tenant_share: float = 1.0,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if not 0 < tenant_share <= 1:
            raise ValueError(f"tenant_share must be in (0, 1], got {tenant_share}")
        self._capacity = capacity_bytes
        self._clock = clock
        self._lock = threading.Lock()
        self._block = self._check_block(block_tokens)
        self._tree = BlockTree(max(capacity_bytes, 1), clock, edge_tenant, tenant_share)
        self._tenants = TenantCounters()
        self._hits = self._misses = self._rejected = self._snapshot_hits = 0
        self._tokens_queried = self._tokens_hit = 0

    @staticmethod
    def _check_block(block_tokens: int) -> int:
        if block_tokens < 1:
            raise ValueError(f"block_tokens must be >= 1, got {block_tokens}")
        return block_tokens

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    @property
    def block_tokens(self) -> int:
        return self._block

    def configure(self, block_tokens: int) -> None:
        """Set the block size; a change drops every stored block (counters are kept)."""
        with self._lock:
            if self._check_block(block_tokens) != self._block:
                self._block = block_tokens
                self._tree.clear()

    def _edges(self, items: list[int | str], whole: int) -> Iterator[Edge]:
        b = self._block
        return (tuple(items[k * b : (k + 1) * b]) for k in range(whole))

    def lookup(
        self, token_ids: Sequence[int], spans: Sequence[ImageSpan], align: int = 1, scope: str = ""
    ) -> PrefixHit | None:
        """Longest usable cached prefix of the prompt, or None (also for 0 usable tokens).

        Always leaves >= 1 token to prefill. With `align` 1 it never ends inside an image;
        with `align` > 1 it is a multiple of `align` (and may end inside an image). Counts one
        hit/miss, tokens_queried += len(token_ids), tokens_hit += hit tokens; marks the blocks
        used recently.
        """
        with self._lock:
            hit, n = None, len(token_ids)
            try:
                hit = self._find(token_ids, spans, align, scope, touch=True)
            except Exception:
                logger.exception("prefix cache lookup failed; treating as a miss")
            self._tokens_queried += n
            if hit is None:
                self._misses += 1
            else:
                self._hits += 1
                self._tokens_hit += hit.tokens
                self._snapshot_hits += hit.snapshot
            got = hit.tokens if hit is not None else 0
            self._tenants.count(tenant_of(scope), hit is not None, n, got)
            return hit

    def peek(
        self, token_ids: Sequence[int], spans: Sequence[ImageSpan], align: int = 1, scope: str = ""
    ) -> int:
        """How many prompt tokens `lookup` would serve now (0 for none), without counting a
        query or touching recency. Advisory: blocks may be evicted before the real lookup."""
        with self._lock:
            try:
                hit = self._find(token_ids, spans, align, scope, touch=False)
            except Exception:
                logger.exception("prefix cache peek failed; treating as a miss")
                return 0
            return hit.tokens if hit is not None else 0

    def find(
        self, token_ids: Sequence[int], spans: Sequence[ImageSpan], align: int = 1, scope: str = ""
    ) -> PrefixHit | None:
        """What `lookup` would return, marking the blocks used but counting no query: for a
        second look after the caller added blocks (e.g. promoted from disk) to a lookup that
        was already counted."""
        with self._lock:
            try:
                return self._find(token_ids, spans, align, scope, touch=True)
            except Exception:
                logger.exception("prefix cache find failed; treating as a miss")
                return None

    def stored_blocks(
        self, token_ids: Sequence[int], spans: Sequence[ImageSpan], scope: str = ""
    ) -> int:
        """How many of the prompt's leading whole blocks are stored (0 when disabled)."""
        with self._lock:
            try:
                if self._capacity == 0:
                    return 0
                items = key_items(token_ids, spans, scope)
                return len(self._tree.match(self._edges(items, len(items) // self._block)))
            except Exception:
                logger.exception("prefix cache match failed; treating as none stored")
                return 0

    def _find(
        self,
        token_ids: Sequence[int],
        spans: Sequence[ImageSpan],
        align: int,
        scope: str,
        touch: bool,
    ) -> PrefixHit | None:
        if align < 1:
            raise ValueError(f"align must be >= 1, got {align}")
        n, b = len(token_ids), self._block
        if self._capacity == 0 or n < 2:
            return None
        items = key_items(token_ids, spans, scope)
        path = self._tree.match(self._edges(items, n // b))
        covered = len(path) * b
        if covered < n and align < b:  # a hit may also end inside a stored block
            after = tuple(items[covered : covered + b])
            child, m = self._tree.best_child(path[-1] if path else None, after)
            if child is not None:
                path.append(child)
                covered += m
        if align > 1:  # the exact rule: whole blocks of `align`, may end inside an image
            tokens = min(covered, n - 1) // align * align
        else:
            tokens = _leave_one(covered, n, spans)
        if tokens <= 0:
            return None
        path = path[: -(-tokens // b)]
        if touch:
            self._tree.touch(path, hit=True)
        last = path[-1].block
        assert last is not None
        values = tuple(node.block.value for node in path)  # type: ignore[union-attr]
        return PrefixHit(values, tokens, last.rope_delta, last.snapshot_nbytes > 0)

    def store(
        self,
        token_ids: Sequence[int],
        spans: Sequence[ImageSpan],
        make_block: Callable[[int], Block],
        length: int | None = None,
        scope: str = "",
    ) -> bool:
        """Store the whole blocks of the prompt's first `length` tokens (default: all):
        `make_block(k)` gives block k's KV (positions [k*B, (k+1)*B)), called only for blocks
        not stored yet, in order. `token_ids` and `spans` are the whole prompt's (an image
        may run past `length`: its tokens before the cut are still keyed by its hash).

        True when every whole block is now stored (shared ones are marked used). False when
        disabled, there is no whole block, the blocks exceed the whole budget (those that fit
        are kept), or on invalid input / internal error (logged).
        """
        try:
            if self._capacity == 0:
                return False
            with self._lock:
                return self._store(token_ids, spans, make_block, length, scope)
        except Exception:
            logger.exception("prefix cache store failed; not stored")
            return False

    def _store(
        self,
        token_ids: Sequence[int],
        spans: Sequence[ImageSpan],
        make: Callable[[int], Block],
        length: int | None,
        scope: str,
    ) -> bool:
        b = self._block
        n = len(token_ids) if length is None else length
        if not 0 <= n <= len(token_ids):
            raise ValueError(f"length {length} outside 0..{len(token_ids)}")
        whole = n // b
        if whole == 0:
            return False
        edges = list(self._edges(key_items(token_ids, spans, scope), whole))
        starts: dict[int, list[str]] = {}
        for sp in spans:
            starts.setdefault(sp.start // b, []).append(sp.content_hash)

        def build(k: int) -> Block:
            block = make(k)
            if block.nbytes < 0:
                raise ValueError("nbytes must be >= 0")
            return replace(block, images=tuple(starts.get(k, ())))

        path = self._tree.extend(self._tree.match(edges), edges, build)
        if len(path) < whole:
            self._rejected += 1
            return False
        return True

    def clear(self) -> None:
        """Drop every block; counters are kept."""
        with self._lock:
            self._tree.clear()

    def entries(self) -> list[CacheEntryInfo]:
        """Every entry (leaf): its images' hashes in prompt order (none for text only), tokens,
        bytes (its share: a block held by k entries counts 1/k to each, so entries sum to the
        cache's bytes), lookups served along its path and age. No KV, no token ids."""
        with self._lock:
            now = self._clock()
            leaves = list(self._tree.leaves())
            shares = [_share(leaf) for leaf, _ in leaves]
            sizes = _round_preserving_sum(shares, self._tree.bytes)
            return [
                CacheEntryInfo(
                    "prefix",
                    tuple(h for n in leaf.path() if n.block for h in n.block.images),
                    leaf.depth * self._block,
                    size,
                    hits,
                    max(0.0, now - leaf.born),
                    leaf.owner,
                )
                for (leaf, hits), size in zip(leaves, sizes)
            ]

    def tenant_stats(self) -> dict[str, dict[str, int]]:
        """Per tenant that looked up or holds anything: queries, hits, tokens_queried,
        tokens_hit, entries (leaves) and bytes (its blocks)."""
        with self._lock:
            held: dict[str, tuple[int, int]] = {}
            for leaf, _ in self._tree.leaves():
                n, _b = held.get(leaf.owner, (0, 0))
                held[leaf.owner] = (n + 1, self._tree.owner_bytes.get(leaf.owner, 0))
        return self._tenants.report(held, tokens=True)

    def __len__(self) -> int:
        with self._lock:
            return self._entries()

    def _entries(self) -> int:
        return sum(child.refs for child in self._tree.root.children.values())

    def stats(self) -> PrefixStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            t, b = self._tree, self._block
            return PrefixStats(
                hits=self._hits,
                misses=self._misses,
                insertions=t.inserted,
                evictions=t.evicted,
                rejected=self._rejected,
                entries=self._entries(),
                bytes=t.bytes,
                capacity_bytes=self._capacity,
                tokens_queried=self._tokens_queried,
                tokens_hit=self._tokens_hit,
                block_tokens=b,
                blocks=t.nodes,
                shared_blocks=t.shared,
                stored_tokens=t.ref_sum * b,
                unique_tokens=t.nodes * b,
                sharing_ratio=t.ref_sum / t.nodes if t.nodes else 0.0,
                bytes_per_token=t.bytes / (t.nodes * b) if t.nodes else 0.0,
                snapshots=t.snapshots,
                snapshot_bytes=t.snapshot_bytes,
                snapshot_hits=self._snapshot_hits,
            )


def _share(leaf: Node) -> float:
    return sum(n.block.nbytes / n.refs for n in leaf.path() if n.block is not None)


def _round_preserving_sum(values: list[float], total: int) -> list[int]:
    """Integers close to `values` that sum to `total` (largest remainders get the rest)."""
    floors = [int(v) for v in values]
    rest = total - sum(floors)
    order = sorted(range(len(values)), key=lambda i: floors[i] - values[i])
    for i in order[: max(rest, 0)]:
        floors[i] += 1
    return floors
