"""The ingress's engine: `RemoteEngine`'s interface over N Ray Serve replica slots.

The HTTP app (`gateway.app`, unchanged: same auth, limits, errors, streaming) talks to this
object as it talks to one engine. `submit` asks the `AffinityRouter` for a slot (by the
request's `affinity_key`), and a coroutine on this object's own event-loop thread streams the
request's events from that slot's replica (`EngineReplica.generate`) into the request's sink.

Failure handling:
- the replica fails before the request produced any event (its actor died, its engine was
  busy): the slot is marked down if it died, and the request is sent once to another slot;
- it fails after (killed mid-answer): the request ends with a SHUTTING_DOWN error event
  (503 / an SSE error event of its API) that says to retry; never a hang;
- a slot marked down is probed every second (`info`) and routed to again once Serve's
  replacement answers.
Cache and metrics calls fan out to every slot that is up and are merged
(`gateway.cluster.stats`).

Thread safety: `submit`, `cancel` and the properties may be called from any thread; sinks are
called on this object's event-loop thread and must not block (as `RemoteEngine`'s).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from caches.prefix import ImageSpan
from gateway.cluster.fanout import ReplicaQueries, await_response, describe_error
from gateway.cluster.router import AffinityRouter, NoReplica
from gateway.config import EngineConfig
from gateway.engine.process import EngineUnavailable
from gateway.engine.request import (
    AdmittedEvent,
    EngineBusy,
    EngineRequest,
    ErrorEvent,
    ErrorKind,
    FinishEvent,
    Sink,
)

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
    tried: set[int] = field(default_factory=set)


class RoutedEngine(ReplicaQueries):
    """Engine interface over replica `handles` (Ray Serve handles of `EngineReplica`, one
    per slot, in slot order) with `router` choosing among them."""

    def __init__(
        self, config: EngineConfig, handles: Sequence[Any], router: AffinityRouter
    ) -> None:
        if len(handles) != router.slots:
            raise ValueError("one handle per router slot")
        self.config = config
        self.model: Any = None  # prompt side only (tokenizer, processor)
        self.router = router
        self._handles = list(handles)
        self._flights: dict[str, _Flight] = {}
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cluster-routes")
        self._thread.daemon = True
        self._alive = False
        self._probe: Future[None] | None = None

    # ----- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float | None = None) -> None:
        """Load the prompt side here and wait until every replica answers (model loaded and
        warmed up there)."""
        from gateway.engine.model import VisionLanguageModel

        self.model = VisionLanguageModel(self.config.model, lazy=True)
        self.open(timeout)

    def open(self, timeout: float | None = None) -> None:
        """Start routing once every replica answers `info` (`start` without the prompt side;
        raises RuntimeError naming a replica that did not start)."""
        self._thread.start()
        infos = self._gather("info", timeout=timeout)
        for slot, info in enumerate(infos):
            if isinstance(info, BaseException):
                raise RuntimeError(f"replica {slot} did not start: {info}")
            log.info("replica %d ready: pid %s on %s", slot, info["pid"], info["host"])
        self._alive = True
        self._probe = asyncio.run_coroutine_threadsafe(self._probe_down_slots(), self._loop)

    def stop(self, timeout: float = 10.0) -> None:
        """Stop routing; requests still in flight end with a SHUTTING_DOWN error."""
        self._alive = False
        if self._probe is not None:
            self._probe.cancel()
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(asyncio.sleep(0.05), self._loop).result(timeout)
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
        asyncio.run_coroutine_threadsafe(self._run(flight), self._loop)

    def cancel(self, request_id: str) -> None:
        """Cancel on the replica serving it; its stream then ends with a `cancelled` finish."""
        with self._lock:
            flight = self._flights.get(request_id)
        if flight is not None and flight.slot >= 0:
            handle = self._handles[flight.slot]
            self._loop.call_soon_threadsafe(lambda: handle.cancel.remote(request_id))

    async def _run(self, flight: _Flight) -> None:
        """Stream one request from its slot; on an early failure, retry once elsewhere."""
        while True:
            slot = flight.slot
            flight.tried.add(slot)
            try:
                response = self._handles[slot].options(stream=True).generate.remote(flight.request)
                async for batch in response:
                    for event in batch:
                        self._deliver(flight, event)
                if not flight.done:
                    self._finish(flight, _replica_error(slot, "ended the stream early"))
                return
            except Exception as exc:  # noqa: BLE001 - every failure ends in an error event
                died = _actor_died(exc)
                if died and self.router.mark_down(slot):
                    log.warning(
                        "replica %d is down (%s); routing around it", slot, describe_error(exc)
                    )
                if flight.events == 0 and not flight.done and self._reroute(flight):
                    continue
                if isinstance(_cause(exc), EngineBusy):
                    self._finish(flight, _replica_error(slot, "is at capacity"))
                else:
                    self._finish(flight, _replica_error(slot, f"failed: {describe_error(exc)}"))
                return

    def _reroute(self, flight: _Flight) -> bool:
        """Move a request that has produced nothing to a slot it has not tried; False (and
        no slot held) if there is none."""
        failed = flight.slot
        self.router.release(failed)
        flight.slot = -1
        try:
            slot = self.router.choose(flight.request.affinity_key)
        except NoReplica:
            return False
        if slot in flight.tried:
            self.router.release(slot)
            return False
        log.info(
            "request %s: replica %d failed before answering; trying replica %d",
            flight.request.request_id,
            failed,
            slot,
        )
        flight.slot = slot
        return True

    def _deliver(self, flight: _Flight, event: Any) -> None:
        flight.events += 1
        if isinstance(event, AdmittedEvent):
            flight.admitted = True
        if isinstance(event, (FinishEvent, ErrorEvent)):
            self._finish(flight, event)
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

    def needs_pixels(self, prompt_ids: Sequence[int], images: Sequence[ImageSpan]) -> list[bool]:
        """Always False: each replica preprocesses what its own caches miss."""
        return [False] * len(images)

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
                if self.router.mark_up(slot):
                    log.warning("replica %d is back: pid %s on %s", slot, info["pid"], info["host"])


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
