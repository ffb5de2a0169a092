"""Which replica serves a request: consistent hashing with bounded loads over replica slots.

Requests about the same image (or the same conversation) should land on the replica whose
caches already hold it, so each request carries a cheap affinity key computed at the ingress
(`gateway.frontend.affinity`). The key is hashed onto a ring of virtual nodes (`vnodes` per
slot); the request goes to the first slot clockwise from the key. A hot key must not pin one
replica, so the walk skips any slot whose in-flight load would exceed
`max(min_load, ceil(load_factor * (total in flight + 1) / slots up))` (Mirrokni, Thorup,
Zadimoghaddam: "Consistent Hashing with Bounded Loads", 2018; `min_load` because a replica
decodes a batch at once, so at low load a second request about an image costs its home
replica almost nothing, while sending it elsewhere costs a cache miss). A spill goes to the
key's next slot on the ring, which is stable, so a hot image's overflow also keeps landing on
the same second replica. Only `ring_choices` replicas along the ring are tried (2: the home and
its successor); if all are at the bound, the request falls back to the least-loaded replica,
which is always under it. A request without a key goes to the least-loaded slot too.

Slots are stable small integers (one Ray Serve deployment each); a slot marked down (its
replica died and is being replaced) is skipped until marked up again, and the keys it owned
move to their next slot meanwhile, and come back afterwards.

Pure Python and thread-safe (one lock); no Ray, no MLX. `gateway.cluster.simulate` drives
this class to estimate hit rates.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Collection
from dataclasses import dataclass

import xxhash


@dataclass
class SlotCounters:
    """What the router did for one slot (cumulative, except `load`)."""

    load: int = 0  # requests in flight (acquired, not released)
    routed: int = 0  # requests sent here
    home: int = 0  # ... that were the key's first choice on the ring
    spilled_in: int = 0  # ... that had a key whose first choice was full or down
    keyless: int = 0  # ... without a key (least-loaded)
    up: bool = True


class NoReplica(Exception):
    """No slot can take the request: all are down, or all are at `capacity`."""

    def __init__(self, all_down: bool) -> None:
        super().__init__("no replica is up" if all_down else "every replica is at capacity")
        self.all_down = all_down


def _hash(text: str) -> int:
    return xxhash.xxh3_64_intdigest(text.encode())


class AffinityRouter:
    """Consistent hashing with bounded loads over `slots` replicas (0..slots-1).

    load_factor: the bound's c (>= 1; 1.25 lets a slot take 25% more than the mean before a
        keyed request spills to the next slot). min_load: the bound is never below this (1:
        the textbook bound). ring_choices: replicas tried along the ring before the
        least-loaded one (>= 1). capacity: the most requests one slot may have in flight
        (None: unbounded); past it on every slot, `choose` raises NoReplica.
    """

    def __init__(
        self,
        slots: int,
        load_factor: float = 1.25,
        vnodes: int = 64,
        capacity: int | None = None,
        min_load: int = 1,
        ring_choices: int = 2,
    ) -> None:
        if slots < 1:
            raise ValueError("a router needs at least one slot")
        if load_factor < 1.0:
            raise ValueError("load_factor must be >= 1")
        self.slots = slots
        self.load_factor = load_factor
        self.capacity = capacity
        self.min_load = max(1, min_load)
        self.ring_choices = max(1, ring_choices)
        points = sorted((_hash(f"slot-{s}#{v}"), s) for s in range(slots) for v in range(vnodes))
        self._points = [p for p, _ in points]
        self._owners = [s for _, s in points]
        self._counters = [SlotCounters() for _ in range(slots)]
        self._lock = threading.Lock()

    # ----- routing ------------------------------------------------------------------------------

    def home(self, key: str) -> int:
        """The slot that owns `key` when every slot is up and none is full."""
        return self._owners[bisect.bisect(self._points, _hash(key)) % len(self._points)]

    def choose(self, key: str | None, exclude: Collection[int] = ()) -> int:
        """Pick a slot for a request with affinity `key` (None or "": least-loaded) and count it
        in flight there; the caller must `release` it when the request ends. Slots in `exclude`
        (e.g. those that refused it already) count as down for this choice. Raises NoReplica."""
        with self._lock:
            up = [s for s in range(self.slots) if self._counters[s].up and s not in exclude]
            if not up:
                raise NoReplica(all_down=True)
            total = sum(self._counters[s].load for s in up)
            bound = max(self.min_load, math.ceil(self.load_factor * (total + 1) / len(up)))
            if self.capacity is not None:
                bound = min(bound, self.capacity)
            slot = self._walk(key, bound, exclude) if key else None
            if slot is None:
                slot = min(up, key=lambda s: (self._counters[s].load, self._counters[s].routed))
                if self.capacity is not None and self._counters[slot].load >= self.capacity:
                    raise NoReplica(all_down=False)
                if key:  # its ring choices were all at the bound
                    self._counters[slot].spilled_in += 1
                else:
                    self._counters[slot].keyless += 1
            c = self._counters[slot]
            c.load += 1
            c.routed += 1
            return slot

    def _walk(self, key: str, bound: int, exclude: Collection[int]) -> int | None:
        """The first of the key's `ring_choices` up slots clockwise from it with room under
        `bound`; None if none has."""
        start = bisect.bisect(self._points, _hash(key))
        seen: set[int] = set()
        tried = 0
        for i in range(len(self._points)):
            slot = self._owners[(start + i) % len(self._points)]
            if slot in seen:
                continue
            seen.add(slot)
            c = self._counters[slot]
            if not c.up or slot in exclude:
                continue
            if c.load < bound:
                if seen == {slot}:
                    c.home += 1
                else:
                    c.spilled_in += 1
                return slot
            tried += 1
            if tried == self.ring_choices:
                break
        return None

    def release(self, slot: int) -> None:
        """A request routed to `slot` ended (finished, failed or cancelled)."""
        with self._lock:
            c = self._counters[slot]
            c.load = max(0, c.load - 1)

    # ----- health -------------------------------------------------------------------------------

    def mark_down(self, slot: int) -> bool:
        """Take `slot` out of routing; returns True if it was up."""
        with self._lock:
            was, self._counters[slot].up = self._counters[slot].up, False
            return was

    def mark_up(self, slot: int) -> bool:
        """Put `slot` back; returns True if it was down."""
        with self._lock:
            was, self._counters[slot].up = self._counters[slot].up, True
            return not was

    def is_up(self, slot: int) -> bool:
        with self._lock:
            return self._counters[slot].up

    # ----- reporting ----------------------------------------------------------------------------

    def loads(self) -> list[int]:
        with self._lock:
            return [c.load for c in self._counters]

    def stats(self) -> dict[str, object]:
        """JSON-able: the bound's settings and every slot's counters."""
        with self._lock:
            slots = [dict(vars(c), slot=s) for s, c in enumerate(self._counters)]
        return {
            "policy": "consistent-hash-bounded-load",
            "load_factor": self.load_factor,
            "min_load": self.min_load,
            "ring_choices": self.ring_choices,
            "capacity": self.capacity,
            "slots": slots,
        }
