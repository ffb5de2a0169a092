"""gateway.heap: start-up objects leave the collector's passes; later garbage is still
collected."""

from __future__ import annotations

import gc
import weakref

from gateway.heap import freeze_startup_objects


class _Node:
    def __init__(self) -> None:
        self.other: _Node | None = None


def test_frozen_objects_leave_full_passes_and_later_cycles_are_still_collected() -> None:
    """Invariant: after the freeze a full collection scans only what was made since (the
    pass that stalled every stream for tens of ms), and a reference cycle made later is
    still freed by it."""
    try:
        frozen = freeze_startup_objects("test")
        assert frozen > 1000 and gc.get_freeze_count() == frozen
        a, b = _Node(), _Node()
        a.other, b.other = b, a
        probe = weakref.ref(a)
        del a, b
        gc.collect()
        assert probe() is None  # a cycle made after the freeze is collected
    finally:
        gc.unfreeze()
