"""The fan-out half of `RoutedEngine`: cache, metrics and info calls sent to every replica
slot at once and merged (`gateway.cluster.stats`), so `/v1/cache/stats`, `/metrics` and
`/v1/cache/entries` read like one server's, plus each replica's own numbers.

A mixin: the host class provides `_handles` (Serve handles, slot order), `_loop` (its event
loop thread's loop) and `router`. Every method blocks; call it off the event loop (the app
does, through `asyncio.to_thread`), never on `_loop`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from gateway.cluster.stats import merge_cache_stats, merge_entries, merge_metrics
from gateway.engine.client import EngineUnavailable
from gateway.engine.wire import (
    CacheEntries,
    CacheStats,
    Call,
    ClearCaches,
    MetricsText,
    ReplicaInfo,
    ResetCaches,
)

log = logging.getLogger(__name__)
CALL_TIMEOUT_S = 30.0  # a replica's answer to a stats/metrics call


class ReplicaQueries:
    """Cache, metrics and info calls over every replica slot (see the module docstring)."""

    _handles: list[Any]
    _loop: asyncio.AbstractEventLoop
    router: Any

    def _gather(
        self, ask: Callable[[Any], Any], timeout: float | None = CALL_TIMEOUT_S
    ) -> list[Any]:
        """`ask(handle)` (a Serve call) of every slot at once, awaited at most `timeout`
        seconds (any thread but this object's loop); per slot the answer or the exception."""

        async def one(handle: Any) -> Any:  # a call that fails at once fails its slot only
            return await await_response(ask(handle))

        async def every() -> list[Any]:
            calls = [asyncio.wait_for(one(h), timeout) for h in self._handles]
            return await asyncio.gather(*calls, return_exceptions=True)

        return asyncio.run_coroutine_threadsafe(every(), self._loop).result()

    def _infos(self, timeout: float | None = CALL_TIMEOUT_S) -> list[ReplicaInfo | BaseException]:
        """Every slot's `info`, or the exception it raised."""
        return self._gather(lambda handle: handle.info.remote(), timeout)

    def _answers(self, call: Call) -> list[tuple[int, Any]]:
        """(slot, answer) of every slot that is up and answered `call`; raises
        EngineUnavailable if none did."""
        name = type(call).__name__
        answers = []
        for slot, value in enumerate(self._gather(lambda handle: handle.call.remote(call))):
            if isinstance(value, BaseException):
                log.warning("replica %d did not answer %s: %s", slot, name, describe_error(value))
            else:
                answers.append((slot, value))
        if not answers:
            raise EngineUnavailable(f"no replica answered {name}")
        return answers

    def cache_stats(self) -> dict[str, Any]:
        """The replicas' cache counters summed (same keys as one engine's), plus `replicas`
        (each slot's own stats and state) and `router` (where requests went)."""
        answers = dict(self._answers(CacheStats()))
        infos = self._infos()
        merged: dict[str, Any] = merge_cache_stats(list(answers.values()))
        merged["replicas"] = [
            {
                "slot": slot,
                "up": self.router.is_up(slot),
                **({} if isinstance(info, BaseException) else dataclasses.asdict(info)),
                **({"caches": answers[slot]} if slot in answers else {}),
            }
            for slot, info in enumerate(infos)
        ]
        merged["router"] = self.router.stats()
        return merged

    def cache_entries(
        self, limit: int = 10, kind: str | None = None, tenant: str | None = None
    ) -> dict[str, Any]:
        return merge_entries(self._answers(CacheEntries(limit, kind, tenant)), limit)

    def clear_caches(self) -> None:
        self._answers(ClearCaches())

    def reset_caches(self) -> None:
        self._answers(ResetCaches())

    def metrics_text(self) -> bytes:
        return merge_metrics(self._answers(MetricsText()))


async def await_response(response: Any) -> Any:
    """Await a Serve DeploymentResponse."""
    return await response


def describe_error(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None) or exc
    text = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {text[0] if text else ''}"[:200]
