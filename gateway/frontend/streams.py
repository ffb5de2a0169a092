"""The bridge from the engine thread to the requests' coroutines.

The engine emits one event per token per running request. Waking the event loop once per
event (`call_soon_threadsafe` writes to the loop's self-pipe each time) costs a syscall and a
loop iteration per token, all while holding the GIL the engine thread needs for its next
step. `LoopDelivery` batches instead: the first event after a delivery schedules one wake-up,
and every event posted before the loop runs it rides along, so a decode step of N rows costs
about one wake-up, not N.

`EventStream` is typed by what it carries: `EventStream[Event]` (gateway.engine.request) for
one request's events, as the chat pipeline reads them; a replica's outbox carries
(request_id, event) pairs of every request it runs (gateway.cluster.replica).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any, Generic, TypeVar

log = logging.getLogger(__name__)
E = TypeVar("E")


class LoopDelivery:
    """Moves events from any thread onto one event loop's queues, in posting order.

    `post` is thread-safe and never blocks; queues are filled on the loop thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._pending: list[tuple[asyncio.Queue[Any], Any]] = []

    def post(self, target: asyncio.Queue[E], event: E) -> None:
        with self._lock:
            self._pending.append((target, event))
            if len(self._pending) > 1:
                return  # a wake-up is already scheduled and will carry this event too
        try:
            self._loop.call_soon_threadsafe(self._deliver)
        except RuntimeError:  # the loop is closed: the server is going away
            log.debug("dropped events for a closed event loop")

    def _deliver(self) -> None:
        with self._lock:
            batch, self._pending = self._pending, []
        for target, event in batch:
            target.put_nowait(event)


class EventStream(Generic[E]):
    """Events of type `E` for one consumer (one request, or one replica's outbox). `sink` is
    called on the engine thread and never blocks; `get` and `get_ready` run on the event
    loop. Unbounded: a request produces at most max_tokens + 3 events.
    """

    def __init__(self, delivery: LoopDelivery) -> None:
        self._delivery = delivery
        self._queue: asyncio.Queue[E] = asyncio.Queue()

    def sink(self, event: E) -> None:
        self._delivery.post(self._queue, event)

    def interrupt(self, event: E) -> None:
        """Deliver `event` now, ahead of anything the engine still posts (event loop only)."""
        self._queue.put_nowait(event)

    async def get(self) -> E:
        return await self._queue.get()

    async def get_ready(self) -> list[E]:
        """The next event and every event already waiting behind it (at least one)."""
        events = [await self._queue.get()]
        while not self._queue.empty():
            events.append(self._queue.get_nowait())
        return events
