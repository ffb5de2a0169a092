"""Deduplication of concurrent work by key (one fetch per URL, one decode per byte hash)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from gateway.errors import APIError

K = TypeVar("K")
T = TypeVar("T")


class SingleFlight(Generic[K, T]):
    """At most one running task per key; concurrent callers with the same key share it.

    The task is shielded: one caller being cancelled (client gone) never cancels it for the
    others. An APIError is re-raised as a fresh copy per caller, who may then set its `param`.
    Bound to one event loop; not thread-safe.
    """

    def __init__(self) -> None:
        self._tasks: dict[K, asyncio.Future[T]] = {}
        self.started = 0
        self.joined = 0

    async def run(self, key: K, factory: Callable[[], Awaitable[T]]) -> T:
        task = self._tasks.get(key)
        if task is None:
            task = asyncio.ensure_future(factory())
            self._tasks[key] = task
            task.add_done_callback(functools.partial(self._done, key))
            self.started += 1
        else:
            self.joined += 1
        try:
            return await asyncio.shield(task)
        except APIError as err:
            raise dataclasses.replace(err) from err.__cause__

    def _done(self, key: K, task: asyncio.Future[T]) -> None:
        if self._tasks.get(key) is task:
            del self._tasks[key]
        if not task.cancelled():
            task.exception()  # mark retrieved even when every caller was cancelled

    async def cancel_all(self) -> None:
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)
