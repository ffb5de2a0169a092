"""The engine survives its own failures (tiny model, CPU).

Pinned: a decode step that raises fails only the requests in that batch, with an ErrorEvent,
and later requests are served; the same when the recovery path itself raises (the broken
batch's `remove`); a prefill that raises fails only its own request; row counts return to 0.
"""

from __future__ import annotations

import pytest
from support import EngineHarness, chat_body

from gateway.config import CacheConfig
from gateway.engine.request import ErrorEvent, ErrorKind, FinishEvent

NO_CACHE = CacheConfig(vision_enabled=False, prefix_enabled=False)


@pytest.fixture()
def harness():
    h = EngineHarness("qwen2_vl", cache=NO_CACHE, max_batch=4)
    yield h
    h.close()


def _fail_next_steps(harness: EngineHarness, times: int) -> list[int]:
    calls = [0]

    def hook() -> None:
        if calls[0] < times:
            calls[0] += 1
            raise RuntimeError("injected decode fault")

    harness.engine.step_hook = hook
    return calls


def test_a_failing_decode_step_fails_only_that_batch(harness: EngineHarness) -> None:
    """Invariant: requests in a batch whose decode step raises get an INTERNAL ErrorEvent;
    the engine keeps serving and a later request completes normally."""
    rows = [harness.submit(chat_body(f"row {i}", max_tokens=200)) for i in range(3)]
    for run in rows:
        run.wait_tokens(2)
    _fail_next_steps(harness, 1)
    for run in rows:
        assert isinstance(run.wait().finish, ErrorEvent)
        assert run.finish.kind is ErrorKind.INTERNAL
    later = harness.run(chat_body("after the fault", max_tokens=5))
    assert isinstance(later.finish, FinishEvent) and later.finish.finish_reason == "length"
    assert len(later.token_ids) == 5
    assert harness.engine.running == 0


def test_recovery_survives_a_batch_that_cannot_remove_rows(harness: EngineHarness) -> None:
    """Invariant: even if the failed batch's own `remove` raises, the rows are failed, the
    thread lives, and the next request is served (the batch is replaced before cleanup)."""
    rows = [harness.submit(chat_body(f"row {i}", max_tokens=200)) for i in range(2)]
    for run in rows:
        run.wait_tokens(1)
    broken = harness.engine.scheduler.batch

    def broken_remove(*_: object, **__: object) -> None:
        raise RuntimeError("injected remove fault")

    broken.generator.remove = broken_remove  # type: ignore[method-assign]
    _fail_next_steps(harness, 1)
    for run in rows:
        assert isinstance(run.wait().finish, ErrorEvent)
    assert harness.engine.scheduler.batch is not broken
    later = harness.run(chat_body("still alive?", max_tokens=3))
    assert isinstance(later.finish, FinishEvent)
    assert harness.engine.running == 0


def test_a_failing_prefill_fails_only_its_request(harness: EngineHarness) -> None:
    """Invariant: an exception while prefilling one request fails that request alone; a
    request decoding at the same time finishes with all its tokens."""
    running = harness.submit(chat_body("keep going", max_tokens=30))
    running.wait_tokens(1)
    prefiller = harness.engine.loaded.prefiller
    original = prefiller.feed

    def feed(job, budget):  # noqa: ANN001, ANN202
        if "poison" in harness.engine.model.decode(job.request.prompt_ids):
            raise RuntimeError("injected prefill fault")
        return original(job, budget)

    prefiller.feed = feed  # type: ignore[method-assign]
    poisoned = harness.run(chat_body("poison pill", max_tokens=5))
    assert isinstance(poisoned.finish, ErrorEvent)
    assert "prefill" in poisoned.finish.message
    assert running.wait().finish.finish_reason == "length"
    assert len(running.token_ids) == 30
    assert harness.engine.running == 0


def test_a_failure_when_joining_the_batch_fails_one_request_and_the_loop_lives(
    harness: EngineHarness,
) -> None:
    """Invariant: an exception while a prefilled request joins the batch (outside the decode
    step) fails that request only; the engine thread keeps serving."""
    batch = harness.engine.scheduler.batch
    join = batch.join
    calls = [0]

    def join_once_broken(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202
        calls[0] += 1
        if calls[0] == 1:
            raise RuntimeError("injected join fault")
        return join(*args, **kwargs)

    batch.join = join_once_broken  # type: ignore[method-assign]
    broken = harness.run(chat_body("first in", max_tokens=5))
    assert isinstance(broken.finish, ErrorEvent)
    later = harness.run(chat_body("second in", max_tokens=5))
    assert isinstance(later.finish, FinishEvent) and len(later.token_ids) == 5
    assert harness.engine.alive and harness.engine.running == 0
