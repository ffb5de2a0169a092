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
from gateway.engine.client import EngineBusy, EngineUnavailable  # noqa: E402
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
from gateway.engine.wire import CacheStats, Call, Events, MetricsText, ReplicaInfo  # noqa: E402

ADMITTED = AdmittedEvent(3, 0, 0, 0)
TOKEN = TokenEvent("x", (7,))
FINISH = FinishEvent("length", Usage(3, 1, 0))


class _Call:
    def __init__(self, fn):
        self._fn = fn

    def remote(self, *args):
        return self._fn(*args)


class FakeReplica:
    """Stands in for a Serve handle of `EngineReplica`. `plan`: what happens after a
    submit, step by step: a list of events (one batch on the event stream) or an exception
    (the event stream fails: the replica died). `refuse`: submit raises it instead."""

    def __init__(self, slot: int, plan: list, refuse: BaseException | None = None) -> None:
        self.slot, self.plan, self.refuse = slot, plan, refuse
        self.submitted: list[str] = []
        self.cancelled: list[str] = []
        self.asked: list[Call] = []
        self.call = _Call(self._call)
        self._queue: asyncio.Queue | None = None
        self.info = _Call(self._info)
        self.cancel = _Call(self.cancelled.append)
        self.submit = _Call(self._submit)
        self.events = _Call(self._events)

    def options(self, **_: object) -> FakeReplica:
        return self

    def _q(self) -> asyncio.Queue:
        if self._queue is None:
            self._queue = asyncio.Queue()
        return self._queue

    async def _info(self):
        memory = (self.slot + 1) << 30  # replica 0's device is the smaller
        return ReplicaInfo(
            self.slot, 100 + self.slot, "here", True, self.slot == 1, 0, 0, 1.0, memory
        )

    async def _call(self, call: Call):
        self.asked.append(call)
        if isinstance(call, CacheStats):
            return {"vision": {"hits": 1 + self.slot, "misses": 1, "queries": 2 + self.slot}}
        if isinstance(call, MetricsText):
            return b"# TYPE vision_gateway_running gauge\nvision_gateway_running 1.0\n"
        raise AssertionError(f"unexpected call {call!r}")

    async def _submit(self, request: EngineRequest):
        self.submitted.append(request.request_id)
        if self.refuse is not None:
            raise self.refuse
        for step in self.plan:
            await asyncio.sleep(0)
            if isinstance(step, BaseException):
                self._q().put_nowait(step)
            else:
                self._q().put_nowait(Events(tuple((request.request_id, e) for e in step)))

    async def _events(self):
        while True:
            item = await self._q().get()
            if isinstance(item, BaseException):
                raise item
            yield item


def _engine(*plans, refuse=None) -> tuple[RoutedEngine, list[FakeReplica]]:
    replicas = [FakeReplica(slot, plan, refuse) for slot, plan in enumerate(plans)]
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
        assert engine.on_gpu  # replica 1 says it computes on a GPU
        assert engine.device_memory == 1 << 30  # the context must fit the smallest device
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
        assert replicas[home].submitted == ["r1"] == replicas[1 - home].submitted
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
        assert replicas[1 - home].submitted == []
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


def test_a_busy_replica_sends_the_request_elsewhere_then_a_clean_error():
    """Every replica refuses (its engine is full): the request is tried on each once and
    ends with one error event saying so; the router holds no load after."""
    engine, replicas = _engine([[ADMITTED, FINISH]], [[ADMITTED, FINISH]], refuse=EngineBusy(1, 2))
    try:
        events = _run(engine)
        assert len(events) == 1 and "capacity" in events[0].message
        assert [r.submitted for r in replicas] == [["r1"], ["r1"]]
        assert engine.router.loads() == [0, 0]
    finally:
        engine.stop()


def test_full_cluster_is_busy_like_one_full_engine():
    """With every replica at its capacity (max_batch + max_waiting, enforced by the router)
    submit raises EngineBusy, which the edge turns into 429 / 529 as for one server."""

    replicas = [FakeReplica(slot, [[ADMITTED]]) for slot in range(2)]
    engine = RoutedEngine(EngineConfig("m", "m"), replicas, AffinityRouter(2, capacity=1))
    engine.open(timeout=10)
    try:
        for i in range(2):
            engine.submit(
                EngineRequest(f"r{i}", (1,), (), SamplingParams(4), 0.0, affinity_key=f"k{i}"),
                lambda event: None,
            )
        with pytest.raises(EngineBusy):
            engine.submit(EngineRequest("r2", (1,), (), SamplingParams(4), 0.0), lambda e: None)
        assert engine.router.loads() == [1, 1]
    finally:
        engine.stop()


def test_a_request_cancelled_while_its_replica_dies_is_not_sent_elsewhere():
    """The client goes away while the request's replica is dying, before any event: the
    request ends `cancelled` and is never started on another replica (it would run to
    max_tokens for nobody, holding a router slot)."""
    home = AffinityRouter(2).home("media:a")
    plans = [[[ADMITTED, FINISH]], [[ADMITTED, FINISH]]]
    plans[home] = [_died()]
    engine, replicas = _engine(*plans)
    gate = asyncio.Event()
    submit = replicas[home]._submit

    async def held_submit(request):  # the replica dies only once the client has gone
        await gate.wait()
        return await submit(request)

    replicas[home].submit = _Call(held_submit)
    events, done = [], threading.Event()

    def sink(event):
        events.append(event)
        if isinstance(event, (FinishEvent, ErrorEvent)):
            done.set()

    try:
        request = EngineRequest("r1", (1, 2, 3), (), SamplingParams(4), 0.0, affinity_key="media:a")
        engine.submit(request, sink)
        engine.cancel("r1")
        engine._loop.call_soon_threadsafe(gate.set)
        assert done.wait(10), "the request hung"
        assert [e.finish_reason for e in events] == ["cancelled"]
        assert replicas[1 - home].submitted == []
        assert engine.router.loads() == [0, 0]
    finally:
        engine.stop()


def test_stats_and_metrics_calls_fan_out_as_typed_calls_and_merge():
    """Cache stats and metrics reach every replica as `Call` objects (not method names); the
    answers are summed, and each replica's `ReplicaInfo` is reported with its own stats."""
    engine, replicas = _engine([], [])
    try:
        stats = engine.cache_stats()
        assert stats["vision"]["hits"] == 3 and stats["vision"]["queries"] == 5
        first = stats["replicas"][0]
        assert first["pid"] == 100 and first["host"] == "here" and first["on_gpu"] is False
        assert first["caches"]["vision"]["hits"] == 1 and first["up"] is True
        assert b'vision_gateway_running{replica="1"} 1.0' in engine.metrics_text()
        assert [r.asked for r in replicas] == [[CacheStats(), MetricsText()]] * 2
    finally:
        engine.stop()
