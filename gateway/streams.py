"""The bridge from the engine thread to one request's coroutine."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


class EventStream:
    """Events for one request. `sink` is called on the engine thread and never blocks; `get`
    is awaited on the event loop. Unbounded: a request produces at most max_tokens + 2 events.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: asyncio.Queue[object] = asyncio.Queue()

    def sink(self, event: object) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, event)
        except RuntimeError:  # the loop is closed: the server is going away
            log.debug("dropped an event for a closed event loop")

    async def get(self) -> object:
        return await self._queue.get()
