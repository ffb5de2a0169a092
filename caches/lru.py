"""A byte-bounded LRU store with hit/miss/eviction accounting.

The budget is in bytes as reported by the caller for each entry (the *used* size of the
arrays it holds, not their buffer capacity). An entry larger than the whole budget is not
stored. No MLX import here: values are opaque.

Groups (optional): `group(key)` names the group an entry belongs to (a tenant); a named group
may hold at most `group_share` of the budget, so storing into a full group evicts that
group's own least recently used entries first and one group never evicts everyone else. The
group "" is unlimited (the shared scope).

Thread safety: every public method takes one internal lock, so the engine thread may write
while the HTTP thread reads stats.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")


@dataclass(frozen=True)
class LRUStats:
    """A consistent snapshot of one store's counters."""

    hits: int
    misses: int
    insertions: int
    evictions: int
    rejected: int  # entries refused because they alone exceed the budget
    entries: int
    bytes: int
    capacity_bytes: int

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@dataclass(frozen=True)
class LRUEntry(Generic[K, V]):
    """One stored entry as seen at snapshot time: its key and value (shared, not copied: do
    not mutate), the bytes counted for it, the hits it served and seconds since it was stored."""

    key: K
    value: V
    nbytes: int
    hits: int
    age_s: float


class _Meta:
    """Per-entry bookkeeping, mutable under the store's lock."""

    __slots__ = ("hits", "stored_at")

    def __init__(self, stored_at: float) -> None:
        self.hits = 0
        self.stored_at = stored_at


class ByteLRU(Generic[K, V]):
    """Maps keys to values, evicting least-recently-used entries to stay within a byte budget.

    `capacity_bytes` of 0 disables storing (every put is rejected, every get misses).
    `on_evict(key, value)` is called, outside no lock guarantees, for each evicted entry.
    `clock` (seconds, monotonic) dates entries for `entries()`; injectable for tests.
    `group` and `group_share` (0 < share <= 1): see the module docstring.
    """

    def __init__(
        self,
        capacity_bytes: int,
        on_evict: Callable[[K, V], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        group: Callable[[K], str] | None = None,
        group_share: float = 1.0,
    ):
        if capacity_bytes < 0:
            raise ValueError("capacity_bytes must be >= 0")
        if not 0 < group_share <= 1:
            raise ValueError(f"group_share must be in (0, 1], got {group_share}")
        self._group = group or (lambda _key: "")
        self._group_limit = int(capacity_bytes * group_share)
        self._groups: dict[str, list[int]] = {}  # group -> [entries, bytes]
        self._capacity = capacity_bytes
        self._on_evict = on_evict
        self._clock = clock
        self._items: OrderedDict[K, tuple[V, int]] = OrderedDict()
        self._meta: dict[K, _Meta] = {}  # exactly the keys of _items
        self._bytes = 0
        self._lock = threading.RLock()
        self._hits = self._misses = self._insertions = self._evictions = self._rejected = 0

    @property
    def capacity_bytes(self) -> int:
        return self._capacity

    def get(self, key: K) -> V | None:
        """Return the value and mark it most recently used; counts a hit or a miss."""
        with self._lock:
            item = self._items.get(key)
            if item is None:
                self._misses += 1
                return None
            self._items.move_to_end(key)
            self._hits += 1
            self._meta[key].hits += 1
            return item[0]

    def peek(self, key: K) -> V | None:
        """Return the value without touching recency or counters."""
        with self._lock:
            item = self._items.get(key)
            return None if item is None else item[0]

    def touch(self, key: K, hit: bool = False) -> None:
        """Mark an entry most recently used. `hit=True` credits the entry with a hit it served
        (shown by `entries()`) without touching the store's hit/miss counters, which callers
        that decide hits themselves keep with `record`."""
        with self._lock:
            if key in self._items:
                self._items.move_to_end(key)
                if hit:
                    self._meta[key].hits += 1

    def record(self, hit: bool) -> None:
        """Count a hit or miss decided by a caller's own lookup (e.g. a prefix scan)."""
        with self._lock:
            if hit:
                self._hits += 1
            else:
                self._misses += 1

    def put(self, key: K, value: V, nbytes: int) -> bool:
        """Store `value` under `key` (replacing any old value); evict LRU entries to fit: first
        the key's group's own while the group would pass its share, then any.

        Returns False (and stores nothing) when `nbytes` exceeds the whole budget, or the
        group's share.
        """
        if nbytes < 0:
            raise ValueError("nbytes must be >= 0")
        evicted: list[tuple[K, V]] = []
        with self._lock:
            group = self._group(key)
            limit = self._group_limit if group else self._capacity
            # capacity 0 means disabled: even a 0-byte entry is refused (as documented above).
            if nbytes > self._capacity or nbytes > limit or self._capacity == 0:
                self._rejected += 1
                return False
            old = self._items.pop(key, None)
            if old is not None:
                self._unaccount(key, old[1])
            if group:
                held = self._groups.get(group, [0, 0])
                mine = (k for k in list(self._items) if self._group(k) == group)
                while held[1] + nbytes > limit:
                    evicted.append(self._evict(next(mine)))
            while self._items and self._bytes + nbytes > self._capacity:
                evicted.append(self._evict(next(iter(self._items))))
            self._items[key] = (value, nbytes)
            self._meta[key] = _Meta(self._clock())
            self._bytes += nbytes
            counts = self._groups.setdefault(group, [0, 0])
            counts[0] += 1
            counts[1] += nbytes
            self._insertions += 1
        if self._on_evict is not None:
            for k, v in evicted:
                self._on_evict(k, v)
        return True

    def _evict(self, key: K) -> tuple[K, V]:
        value, nbytes = self._items.pop(key)
        self._unaccount(key, nbytes)
        self._evictions += 1
        return key, value

    def _unaccount(self, key: K, nbytes: int) -> None:
        """Forget a removed entry's bytes and meta (the caller popped it from _items)."""
        del self._meta[key]
        self._bytes -= nbytes
        counts = self._groups[self._group(key)]
        counts[0] -= 1
        counts[1] -= nbytes

    def pop(self, key: K) -> V | None:
        """Remove an entry (not counted as an eviction)."""
        with self._lock:
            item = self._items.pop(key, None)
            if item is None:
                return None
            self._unaccount(key, item[1])
            return item[0]

    def clear(self) -> None:
        """Drop every entry; counters are kept."""
        with self._lock:
            self._items.clear()
            self._meta.clear()
            self._groups.clear()
            self._bytes = 0

    def keys(self) -> list[K]:
        """Keys from least to most recently used (a copy)."""
        with self._lock:
            return list(self._items.keys())

    def items(self) -> Iterator[tuple[K, V]]:
        """Snapshot of (key, value) pairs from least to most recently used."""
        with self._lock:
            snapshot = [(k, v) for k, (v, _) in self._items.items()]
        return iter(snapshot)

    def entries(self) -> list[LRUEntry[K, V]]:
        """Snapshot of every entry with its size, hits and age, least recently used first."""
        with self._lock:
            now = self._clock()
            return [
                LRUEntry(k, v, n, self._meta[k].hits, max(0.0, now - self._meta[k].stored_at))
                for k, (v, n) in self._items.items()
            ]

    def groups(self) -> dict[str, tuple[int, int]]:
        """(entries, bytes) held by each group that holds any."""
        with self._lock:
            return {g: (n, b) for g, (n, b) in self._groups.items() if n}

    def __len__(self) -> int:
        with self._lock:
            return len(self._items)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._items

    def stats(self) -> LRUStats:
        with self._lock:
            return LRUStats(
                hits=self._hits,
                misses=self._misses,
                insertions=self._insertions,
                evictions=self._evictions,
                rejected=self._rejected,
                entries=len(self._items),
                bytes=self._bytes,
                capacity_bytes=self._capacity,
            )
