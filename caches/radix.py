"""A radix tree of fixed-size KV blocks: every cached block stored once, however many prompts
share it.

Each edge is one block: a tuple of `block` key items (text token ids, and for image tokens
the image's tag, see caches/prefix.py). A node holds that block's value (opaque here: the KV
of those positions, computed once) and its byte size. A path from the root is a prompt prefix
in whole blocks; an *entry* is a leaf (the longest prefix stored along that branch), and
every block is shared by all the entries below it. `refs` counts them.

Budget: the bytes of every node, each counted once. Eviction removes least-recently-used
leaves (a lazy min-heap on the last-use tick); evicting a leaf may turn its parent into one.
Owners: a whole branch from a root edge belongs to one owner (`owner_of(first edge)`, a
tenant; "" unlimited), which may hold at most `owner_share` of the budget: storing past it
evicts that owner's own LRU leaves, never another's.
Values are never sliced, mutated or copied here.

Not thread-safe: the owner (PrefixCache) holds one lock around every call.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

Edge = tuple[Any, ...]


@dataclass(frozen=True)
class Block:
    """One block's value (opaque), its bytes against the budget, the rope delta of text right
    after it (that of the images wholly before its end) and the content hashes of the images
    that start inside it (for the entries report). `snapshot_nbytes`: the part of `nbytes`
    that is a hybrid model's recurrent-state snapshot at the block's end (0: KV only)."""

    value: Any
    nbytes: int
    rope_delta: int = 0
    images: tuple[str, ...] = ()
    snapshot_nbytes: int = 0


class Node:
    """A block in the tree. Mutable bookkeeping, owned by its BlockTree."""

    __slots__ = (
        "edge", "block", "parent", "children", "depth", "refs", "tick", "hits", "born", "owner",
    )  # fmt: skip

    def __init__(
        self, edge: Edge, block: Block | None, parent: Node | None, born: float, owner: str = ""
    ) -> None:
        self.edge = edge
        self.owner = owner  # the tenant whose branch this is ("": shared)
        self.block = block
        self.parent = parent
        self.children: dict[Edge, Node] = {}
        self.depth = 0 if parent is None else parent.depth + 1  # blocks from the root
        self.refs = 0  # entries (leaves) at or below this node
        self.tick = 0  # last use (a lookup through it or a store along it)
        self.hits = 0  # lookups whose hit ended here
        self.born = born

    def path(self) -> list[Node]:
        """The blocks from the root's child down to this node."""
        out, node = [], self
        while node.parent is not None:
            out.append(node)
            node = node.parent
        return out[::-1]


def common_prefix_len(a: Edge, b: Edge) -> int:
    """Longest common prefix length of two tuples: a binary search over slice equality, so
    O(log n) Python steps and O(n) work in C."""
    limit = min(len(a), len(b))
    if a[:limit] == b[:limit]:
        return limit
    lo, hi = 0, limit  # invariant: a[:lo] == b[:lo] and a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class BlockTree:
    """The tree, its byte total and its sharing counters. `capacity_bytes` > 0; `owner_of`
    and `owner_share` (0 < share <= 1): see the module docstring."""

    def __init__(
        self,
        capacity_bytes: int,
        clock: Callable[[], float],
        owner_of: Callable[[Edge], str] | None = None,
        owner_share: float = 1.0,
    ) -> None:
        self.capacity_bytes = capacity_bytes
        self._clock = clock
        self._owner_of = owner_of or (lambda _edge: "")
        self.owner_limit = int(capacity_bytes * owner_share)
        self.owner_bytes: dict[str, int] = {}
        self.root = Node((), None, None, clock())
        self.bytes = 0
        self.nodes = 0
        self.shared = 0  # nodes with refs >= 2
        self.snapshots = self.snapshot_bytes = 0  # blocks carrying a state snapshot, bytes
        self.ref_sum = 0  # sum of refs over nodes == blocks the entries stand for
        self.inserted = self.evicted = 0
        self._ticks = itertools.count(1)
        self._heap: list[tuple[int, int, Node]] = []  # (tick, id, leaf), stale ones skipped
        self._ids = itertools.count()

    # ----- reading ------------------------------------------------------------------------

    def match(self, edges: Sequence[Edge]) -> list[Node]:
        """The longest path of stored blocks equal to `edges`' leading blocks."""
        node, path = self.root, []
        for edge in edges:
            node = node.children.get(edge)  # type: ignore[assignment]
            if node is None:
                break
            path.append(node)
        return path

    def best_child(self, parent: Node | None, edge: Edge) -> tuple[Node | None, int]:
        """The child of `parent` (None: the root) sharing the longest leading run of items
        with `edge` (which may be shorter than a block), and that run's length (0: none).
        O(children * log(block)) tuple-slice comparisons, done in C."""
        best, best_m = None, 0
        for child in (parent or self.root).children.values():
            m = common_prefix_len(child.edge, edge)
            if m > best_m:
                best, best_m = child, m
        return best, best_m

    def touch(self, path: Sequence[Node], hit: bool = False) -> None:
        """Mark every block of `path` used now; a leaf re-enters the LRU heap."""
        tick = next(self._ticks)
        for node in path:
            node.tick = tick
        if path:
            if hit:
                path[-1].hits += 1
            self._push_if_leaf(path[-1])

    def leaves(self) -> Iterator[tuple[Node, int]]:
        """Every entry (leaf) with the hits of lookups served along its path (depth first)."""
        stack = [(child, 0) for child in self.root.children.values()]
        while stack:
            node, above = stack.pop()
            hits = above + node.hits
            if not node.children:
                yield node, hits
            stack.extend((child, hits) for child in node.children.values())

    # ----- writing ------------------------------------------------------------------------

    def extend(
        self, path: list[Node], edges: Sequence[Edge], make: Callable[[int], Block]
    ) -> list[Node]:
        """Append blocks `edges[len(path):]` below `path` (which `match` returned for `edges`),
        building each with `make(index)`, evicting LRU leaves outside the path to fit. Stops
        early when the path alone would exceed the budget. Returns the path now stored."""
        self.touch(path)
        pinned = {id(n) for n in path}
        parent = path[-1] if path else self.root
        held = sum(n.block.nbytes for n in path if n.block is not None)
        owner = path[0].owner if path else self._owner_of(edges[0]) if edges else ""
        limit = self.owner_limit if owner else self.capacity_bytes
        for index in range(len(path), len(edges)):
            block = make(index)
            held += block.nbytes
            if held > min(self.capacity_bytes, limit):
                break
            if owner:  # the owner's own leaves first, while it would pass its share
                self._evict_until(limit - block.nbytes, pinned, owner)
            self._evict_until(self.capacity_bytes - block.nbytes, pinned)
            node = self._add(parent, edges[index], block, owner)
            pinned.add(id(node))
            path.append(node)
            parent = node
        self.touch(path)
        return path

    def _add(self, parent: Node, edge: Edge, block: Block, owner: str) -> Node:
        node = Node(edge, block, parent, self._clock(), owner)
        self.owner_bytes[owner] = self.owner_bytes.get(owner, 0) + block.nbytes
        self.snapshot_bytes += block.snapshot_nbytes
        self.snapshots += block.snapshot_nbytes > 0
        new_entry = parent is self.root or bool(parent.children)  # else it extends a leaf
        parent.children[edge] = node
        node.refs = 1
        self.ref_sum += 1
        if new_entry:
            self._add_refs(parent, +1)
        self.nodes += 1
        self.bytes += block.nbytes
        self.inserted += 1
        return node

    def _add_refs(self, node: Node | None, step: int) -> None:
        while node is not None and node is not self.root:
            before = node.refs
            node.refs += step
            self.ref_sum += step
            self.shared += (node.refs >= 2) - (before >= 2)
            node = node.parent

    def _push_if_leaf(self, node: Node) -> None:
        if not node.children and node is not self.root:
            heapq.heappush(self._heap, (node.tick, next(self._ids), node))
            if len(self._heap) > 2 * self.nodes + 64:  # drop stale entries now and then
                self._heap = [e for e in self._heap if self._live(e)]
                heapq.heapify(self._heap)

    def _live(self, entry: tuple[int, int, Node]) -> bool:
        tick, _, node = entry
        return node.parent is not None and not node.children and node.tick == tick

    def _evict_until(self, limit: int, pinned: set[int], owner: str | None = None) -> None:
        """Evict LRU leaves not in `pinned` until bytes <= limit (or none is left); with
        `owner`, only that owner's leaves, until its bytes are <= limit."""

        def over() -> bool:
            held = self.bytes if owner is None else self.owner_bytes.get(owner, 0)
            return held > limit

        kept = []
        while over() and self._heap:
            entry = heapq.heappop(self._heap)
            if not self._live(entry):
                continue
            if id(entry[2]) in pinned or owner not in (None, entry[2].owner):
                kept.append(entry)
                continue
            self._remove_leaf(entry[2])
            self.evicted += 1
        for entry in kept:
            heapq.heappush(self._heap, entry)

    def _remove_leaf(self, node: Node) -> None:
        parent = node.parent
        assert parent is not None and not node.children
        del parent.children[node.edge]
        node.parent = None
        self.nodes -= 1
        self.ref_sum -= node.refs
        nbytes = node.block.nbytes if node.block is not None else 0
        self.bytes -= nbytes
        if node.block is not None and node.block.snapshot_nbytes:
            self.snapshot_bytes -= node.block.snapshot_nbytes
            self.snapshots -= 1
        self.owner_bytes[node.owner] -= nbytes
        if parent is self.root:
            return
        if parent.children:  # the parent keeps other entries: one fewer below it
            self._add_refs(parent, -1)
        else:  # the parent is now the entry's leaf
            self._push_if_leaf(parent)

    def clear(self) -> None:
        """Drop every block; counters of inserts and evictions are kept."""
        for child in self.root.children.values():
            child.parent = None
        self.root.children.clear()
        self._heap.clear()
        self.owner_bytes.clear()
        self.bytes = self.nodes = self.shared = self.ref_sum = 0
        self.snapshots = self.snapshot_bytes = 0
