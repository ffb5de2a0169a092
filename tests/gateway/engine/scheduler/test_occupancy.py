"""The engine's queued/active counts (gateway/engine/scheduler/occupancy.py), and the engine
before its model has loaded (no post-load state anywhere).

Pinned: capacity is rows plus queue slots, counted from `reserve` on; a refusal reports the
rows in use (at most max_batch) and the queue; moving a request to a row, out of the queue or
out of its row keeps the counts exact. An engine whose model is not loaded answers its
any-thread calls without one (and says so: no model, no scheduler, no grammar stats).
"""

from __future__ import annotations

import pytest

from caches.prefix import ImageSpan
from gateway.config import EngineConfig
from gateway.engine.client import EngineBusy
from gateway.engine.core import Engine
from gateway.engine.scheduler.occupancy import Occupancy
from gateway.metrics import Metrics


def test_capacity_is_rows_plus_queue_and_the_counts_follow_each_move() -> None:
    counts = Occupancy(max_waiting=1, max_batch=2)
    assert counts.idle
    for _ in range(3):
        counts.reserve()
    with pytest.raises(EngineBusy) as refused:
        counts.reserve()
    assert (refused.value.running, refused.value.waiting) == (0, 3)
    assert "at most 3 requests (--max-batch + --max-waiting)" in str(refused.value)
    counts.admit()
    counts.admit()
    assert (counts.active, counts.queued) == (2, 1)
    counts.unqueue()  # the queued one was cancelled: a slot is free again
    counts.reserve()
    with pytest.raises(EngineBusy):
        counts.reserve()
    counts.free_row()
    counts.free_row()
    counts.admit()
    counts.free_row()
    assert (counts.active, counts.queued) == (0, 0) and counts.idle


def test_an_engine_before_its_model_loads_has_no_post_load_state(tmp_path) -> None:  # noqa: ANN001
    def no_model():  # noqa: ANN202
        raise RuntimeError("no weights here")

    config = EngineConfig(model=str(tmp_path), served_model_name="test")
    engine = Engine(config, Metrics(), loader=no_model)
    spans = [ImageSpan(0, 4, "a"), ImageSpan(4, 8, "b")]

    def check_unloaded() -> None:
        assert engine.model is None and engine.loaded is None and engine.scheduler is None
        assert not engine.on_gpu and not engine.alive
        assert engine.needs_pixels(list(range(8)), spans) == [True, True]
        assert set(engine.cache_stats()) == {"vision", "prefix", "tenants"}  # no post-load parts
        engine.clear_caches()

    check_unloaded()
    with pytest.raises(RuntimeError, match="no weights here"):
        engine.start(timeout=30)
    check_unloaded()
