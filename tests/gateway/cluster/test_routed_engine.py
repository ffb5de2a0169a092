"""RoutedEngine's request path over fake replica handles (no Ray cluster, no model): events
in order, load released, early failures rerouted, late failures a clean error, never a hang.

Needs `ray` importable (its exception classes name a dead replica); skipped otherwise.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("ray")
from ray.exceptions import ActorDiedError  # noqa: E402

from gateway.cluster.routed_engine import RoutedEngine  # noqa: E402
from gateway.cluster.router import AffinityRouter  # noqa: E402
from gateway.config import EngineConfig  # noqa: E402
from gateway.engine.process import EngineUnavailable  # noqa: E402
from gateway.engine.request import (  # noqa: E402
    AdmittedEvent,
    EngineRequest,
    ErrorEvent,
    ErrorKind,
    FinishEvent,
    SamplingParams,
    TokenEvent,
    Usage,
)

ADMITTED = AdmittedEvent(3, 0, 0, 0)
TOKEN = TokenEvent("x", (7,))
FINISH = FinishEvent("length", Usage(3, 1, 0))


class _Call:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        return self._fn(*args)


class FakeReplica:
    """Stands in for a Serve handle of `EngineReplica`. `plan`: the batches `generate`
    yields; an exception in it is raised at that point (a replica dying)."""

    def __init__(self, slot: int, plan: list) -> None:
        self.slot, self.plan = slot, plan
        self.generated: list[str] = []
        self.cancelled: list[str] = []
        self.info = _Call(self._info)
        self.cancel = _Call(self.cancelled.append)
        self.generate = _Call(self._generate)

    def options(self, **_: object) -> FakeReplica:
        return self

    async def _info(self):
        return {"slot": self.slot, "pid": 100 + self.slot, "host": "here"}

    async def _generate(self, request: EngineRequest):
        self.generated.append(request.request_id)
        for step in self.plan:
            await asyncio.sleep(0)
            if isinstance(step, BaseException):
                raise step
            yield step


def _engine(*plans) -> tuple[RoutedEngine, list[FakeReplica]]:
    replicas = [FakeReplica(slot, plan) for slot, plan in enumerate(plans)]
    engine = RoutedEngine(EngineConfig("m", "m"), replicas, AffinityRouter(len(plans)))
    engine.open(timeout=10)
    return engine, replicas


def _run(engine: RoutedEngine, key: str = "media:a") -> list:
    events, done = [], threading.Event()

    def sink(event):
        events.append(event)
        if isinstance(event, (FinishEvent, ErrorEvent)):
            done.set()

    request = EngineRequest("r1", (1, 2, 3), (), SamplingParams(4), 0.0, affinity_key=key)
    engine.submit(request, sink)
    assert done.wait(10), "the request hung"
    return events


def test_events_arrive_in_order_and_the_load_is_released():
    """A replica's batches reach the sink in order, finish last; the router holds no load
    after; running/waiting/idle say so."""
    engine, _ = _engine([[ADMITTED, TOKEN], [TOKEN, FINISH]], [[ADMITTED, FINISH]])
    try:
        assert _run(engine, "") in ([ADMITTED, TOKEN, TOKEN, FINISH], [ADMITTED, FINISH])
        assert engine.router.loads() == [0, 0] and engine.idle
    finally:
        engine.stop()


def _died() -> ActorDiedError:
    return ActorDiedError()


def test_a_replica_dead_before_answering_is_routed_around():
    """The key's home replica dies before any event: the request is served by the other
    replica, and the dead slot is marked down."""
    home = AffinityRouter(2).home("media:a")
    plans = [[], []]
    plans[home] = [_died()]
    plans[1 - home] = [[ADMITTED, FINISH]]
    engine, replicas = _engine(*plans)
    try:
        assert _run(engine) == [ADMITTED, FINISH]
        assert replicas[home].generated == ["r1"] == replicas[1 - home].generated
        assert not engine.router.is_up(home) and engine.router.loads() == [0, 0]
    finally:
        engine.stop()


def test_a_replica_dying_mid_answer_ends_the_request_with_a_clean_error():
    """Death after the first events: the request ends with SHUTTING_DOWN (503/'unavailable'
    at the edge) saying to retry; it is not sent elsewhere (tokens were already streamed)."""
    home = AffinityRouter(2).home("media:a")
    plans = [[[ADMITTED, FINISH]], [[ADMITTED, FINISH]]]
    plans[home] = [[ADMITTED, TOKEN], _died()]
    engine, replicas = _engine(*plans)
    try:
        events = _run(engine)
        assert events[:2] == [ADMITTED, TOKEN]
        assert events[-1].kind is ErrorKind.SHUTTING_DOWN and "retry" in events[-1].message
        assert replicas[1 - home].generated == []
    finally:
        engine.stop()


def test_all_replicas_dead():
    """Every replica dead before answering: one clean error event; then submit raises
    EngineUnavailable (503) until a replica is back."""
    engine, _ = _engine([_died()], [_died()])
    try:
        assert isinstance(_run(engine)[-1], ErrorEvent)
        assert not engine.alive
        with pytest.raises(EngineUnavailable):
            _run(engine)
    finally:
        engine.stop()
