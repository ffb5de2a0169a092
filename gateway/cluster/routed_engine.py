"""The ingress's engine: an `EngineClient` over N Ray Serve replica slots.

The HTTP app (`gateway.app`, unchanged: same auth, limits, errors, streaming) talks to this
object as it talks to one engine (an `EngineClient`). `submit` asks the `AffinityRouter` for a
slot (by the request's `affinity_key`) and sends the request to that slot's replica
(`EngineReplica.submit`); one task per slot on this object's own event-loop thread reads the
replica's multiplexed event stream (`EngineReplica.events`, `Events` batches) and hands each
event to its request's sink.

Failure handling:
- the replica refuses a request or is gone before the request produced any event: the
  request is sent to a slot it has not tried (its key's next choice);
- the replica dies mid-answer (its event stream fails): the slot is marked down, its
  requests that had started end with a SHUTTING_DOWN error event (503 / an SSE error event of
  its API) that says to retry, never a hang, and those that had not are sent elsewhere;
- a slot marked down is probed every second (`info`); once Serve's replacement answers, its
  event stream is read again and the router sends the slot's keys back to it.
Cache and metrics calls fan out to every slot and are merged (`gateway.cluster.fanout`).

Thread safety: `submit`, `cancel` and the properties may be called from any thread; sinks are
called on this object's event-loop thread and must not block (as `RemoteEngine`'s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.cluster.fanout import ReplicaQueries, await_response, describe_error
from gateway.cluster.router import AffinityRouter, NoReplica
from gateway.config import EngineConfig
from gateway.engine.client import EngineBusy, EngineUnavailable
from gateway.engine.request import (
    AdmittedEvent,
    EngineRequest,
    ErrorEvent,
    ErrorKind,
    Event,
    FinishEvent,
    Sink,
    ends_request,
)
from gateway.engine.wire import Events, ReplicaInfo

log = logging.getLogger(__name__)
PROBE_INTERVAL_S = 1.0  # how often a slot marked down is asked whether it is back


@dataclass
class _Flight:
    request: EngineRequest
    sink: Sink
    slot: int
    admitted: bool = False
    events: int = 0
    done: bool = False
    cancelled: bool = False  # the client went away: never (re)sent, settled as cancelled
    tried: set[int] = field(default_factory=set)


class RoutedEngine(ReplicaQueries):
    """An `EngineClient` over replica `handles` (Ray Serve handles of `EngineReplica`, one
    per slot, in slot order) with `router` choosing among them."""

    def __init__(
        self, config: EngineConfig, handles: Sequence[Any], router: AffinityRouter
    ) -> None:
        if len(handles) != router.slots:
            raise ValueError("one handle per router slot")
        self.config = config
        self.model: Any = None  # the prompt side (a PromptProcessor from a replica)
        self.on_gpu = False  # some replica computes on a GPU (known once open)
        self.device_memory: int | None = None  # the least any replica's device may use
        self.router = router
        self._handles = list(handles)
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cluster-routes")
        self._thread.daemon = True
        self._alive = False
        self._probe: asyncio.Task[None] | None = None
        self._streams: dict[int, asyncio.Task[None]] = {}  # slot -> its events reader

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Wait until every replica answers (model loaded and warmed up there), then take the
        model's prompt side from one (`EngineReplica.prompt_side`: no MLX here)."""
        self.open(timeout)

        async def ask() -> Any:  # (Serve calls on this object's loop, as every other)
            return await await_response(self._handles[0].prompt_side.remote())

        prompt = asyncio.run_coroutine_threadsafe(ask(), self._loop).result(timeout)
        if prompt is None:
            raise RuntimeError("replica 0 sent no prompt side for the model")
        self.model = prompt

    def open(self, timeout: float | None = None) -> None:
        """Start routing once every replica answers `info` (`start` without the prompt side;
        raises RuntimeError naming a replica that did not start)."""
        self._thread.start()
        infos = self._infos(timeout)
        for slot, info in enumerate(infos):
            if isinstance(info, BaseException):
                raise RuntimeError(f"replica {slot} did not start: {info}")
            log.info("replica %d ready: pid %s on %s", slot, info.pid, info.host)
        self.on_gpu = any(isinstance(i, ReplicaInfo) and i.on_gpu for i in infos)
        # The context must fit every replica's device: the smallest one bounds it.
        sizes = [i.device_memory for i in infos if isinstance(i, ReplicaInfo) and i.device_memory]
        self.device_memory = min(sizes, default=None)
        self._alive = True
        asyncio.run_coroutine_threadsafe(self._start_tasks(), self._loop).result(timeout)

    async def _start_tasks(self) -> None:
        for slot in range(len(self._handles)):
            self._streams[slot] = asyncio.ensure_future(self._consume(slot))
        self._probe = asyncio.ensure_future(self._probe_down_slots())

    async def _cancel_tasks(self) -> None:
        tasks = [t for t in (self._probe, *self._streams.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop routing; requests still in flight end with a SHUTTING_DOWN error."""
        self._alive = False
        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self._cancel_tasks(), self._loop).result(timeout)
        with self._lock:
            flights, self._flights = list(self._flights.values()), {}
        for flight in flights:
            self._finish(flight, ErrorEvent(ErrorKind.SHUTTING_DOWN, "the gateway stopped"))
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        """Serving: started, not stopped, and at least one replica is up."""
        return self._alive and any(self.router.is_up(s) for s in range(self.router.slots))

    # ----- requests -----------------------------------------------------------------------------

    def submit(self, request: EngineRequest, sink: Sink) -> None:
        """Route and send a request. Raises EngineBusy when every replica is at capacity,
        EngineUnavailable when none is up."""
        if not self._alive:
            raise EngineUnavailable("the gateway is not serving")
        try:
            slot = self.router.choose(request.affinity_key)
        except NoReplica as exc:
            if exc.all_down:
                raise EngineUnavailable("no replica is up (being replaced)") from None
            raise EngineBusy(self.running, self.waiting) from None
        flight = _Flight(request, sink, slot)
        with self._lock:
            self._flights[request.request_id] = flight
        asyncio.run_coroutine_threadsafe(self._send(flight), self._loop)

    def cancel(self, request_id: str) -> None:
        """Cancel on the replica serving it; its stream then ends with a `cancelled` finish."""
        with self._lock:
            flight = self._flights.get(request_id)
            if flight is not None:
                flight.cancelled = True  # also seen by a resend or reroute in progress
        if flight is not None and flight.slot >= 0:
            handle = self._handles[flight.slot]
            self._loop.call_soon_threadsafe(lambda: handle.cancel.remote(request_id))

    async def _send(self, flight: _Flight) -> None:
        """Start a request on its slot (its events come through that slot's `_consume`); if
        the replica refuses or is gone before anything came back, try another slot."""
        while True:
            if flight.cancelled:  # cancelled while it was being moved: do not start it again
                self._finish_cancelled(flight)
                return
            slot = flight.slot
            flight.tried.add(slot)
            try:
                await await_response(self._handles[slot].submit.remote(flight.request))
                if flight.slot != slot:  # settled elsewhere meanwhile (a replacement got it)
                    self._handles[slot].cancel.remote(flight.request.request_id)
                return
            except Exception as exc:  # noqa: BLE001 - every failure ends in an error event
                if flight.done or flight.slot != slot:  # already settled by `_consume`
                    return
                if _actor_died(exc) and self.router.mark_down(slot):
                    log.warning("replica %d is down (%s)", slot, describe_error(exc))
                if flight.events == 0 and self._reroute(flight):
                    continue
                what = "is at capacity" if isinstance(_cause(exc), EngineBusy) else "failed"
                self._finish(flight, _replica_error(slot, f"{what}: {describe_error(exc)}"))
                return

    async def _consume(self, slot: int) -> None:
        """Read `slot`'s event stream and hand each event to its request, until the stream
        fails (the replica died); then take the slot down and settle its requests."""
        reason = "ended its event stream"
        try:
            events: Events
            async for events in self._handles[slot].options(stream=True).events.remote():
                for request_id, event in events.batch:
                    flight = self._flights.get(request_id)
                    if flight is not None and flight.slot == slot:
                        self._deliver(flight, event)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the replica is gone or unreachable
            reason = f"failed: {describe_error(exc)}"
        if self.router.mark_down(slot):
            log.warning("replica %d %s; routing around it until it is back", slot, reason)
        with self._lock:
            stranded = [f for f in self._flights.values() if f.slot == slot and not f.done]
        for flight in stranded:
            if flight.cancelled:
                self._finish_cancelled(flight)
            elif flight.events == 0 and self._reroute(flight):
                asyncio.ensure_future(self._send(flight))
            else:
                self._finish(flight, _replica_error(slot, reason))

    def _reroute(self, flight: _Flight) -> bool:
        """Move a request that has produced nothing to a slot it has not tried; False (and
        no slot held) if there is none."""
        failed = flight.slot
        self.router.release(failed)
        flight.slot = -1
        try:
            slot = self.router.choose(flight.request.affinity_key, exclude=flight.tried)
        except NoReplica:
            return False
        log.info(
            "request %s: replica %d failed before answering; trying replica %d",
            flight.request.request_id,
            failed,
            slot,
        )
        flight.slot = slot
        return True

    def _finish_cancelled(self, flight: _Flight) -> None:
        self._finish(flight, FinishEvent.cancelled(len(flight.request.prompt_ids)))

    def _deliver(self, flight: _Flight, event: Event) -> None:
        flight.events += 1
        if isinstance(event, AdmittedEvent):
            flight.admitted = True
        if ends_request(event):
            self._finish(flight, event)  # type: ignore[arg-type]
        else:
            flight.sink(event)

    def _finish(self, flight: _Flight, event: FinishEvent | ErrorEvent) -> None:
        """Deliver the request's last event once and free its slot in the router."""
        with self._lock:
            if flight.done:
                return
            flight.done = True
            self._flights.pop(flight.request.request_id, None)
        if flight.slot >= 0:
            self.router.release(flight.slot)
        flight.sink(event)

    @property
    def running(self) -> int:
        with self._lock:
            return sum(f.admitted for f in self._flights.values())

    @property
    def waiting(self) -> int:
        with self._lock:
            return sum(not f.admitted for f in self._flights.values())

    @property
    def idle(self) -> bool:
        with self._lock:
            return not self._flights

    # ----- health -------------------------------------------------------------------------------

    async def _probe_down_slots(self) -> None:
        """Bring back slots marked down once their (replaced) replica answers."""
        while True:
            await asyncio.sleep(PROBE_INTERVAL_S)
            for slot, handle in enumerate(self._handles):
                if self.router.is_up(slot):
                    continue
                try:
                    info = await asyncio.wait_for(await_response(handle.info.remote()), 5.0)
                except Exception:  # noqa: BLE001 - still being replaced
                    continue
                stream = self._streams.get(slot)
                if stream is None or stream.done():
                    self._streams[slot] = asyncio.ensure_future(self._consume(slot))
                if self.router.mark_up(slot):
                    log.warning("replica %d is back: pid %s on %s", slot, info.pid, info.host)


def _cause(exc: BaseException) -> BaseException:
    """The replica's own exception inside Ray's wrapper, where there is one."""
    return getattr(exc, "cause", None) or exc


def _actor_died(exc: BaseException) -> bool:
    """Ray's errors for a replica actor that is gone (killed, crashed, node lost)."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError

    return isinstance(exc, (ActorDiedError, ActorUnavailableError, RayActorError))


def _replica_error(slot: int, what: str) -> ErrorEvent:
    return ErrorEvent(
        ErrorKind.SHUTTING_DOWN,
        f"replica {slot} {what}; the request did not finish, retry it",
    )
